// The llama model plugin with one op changed, for `tessera plugin check`
// (tests/integration/test_plugin_check.cpp). It loads the real llama
// library (TSR_LLAMA_LIBRARY) and serves its descriptor under another name
// (TSR_WRAP_NAME); its create hands llama a copy of the host whose ops
// table differs in one op. Every other op and entry is llama's own.
//  - TSR_WRAP_BROKEN_SWIGLU, "llama_broken_swiglu": swiglu_backward scales
//    the up projection's input gradient (dup) by 1.25 after computing it, a
//    wrong backward. The check must name mlp.up_proj.weight of the last
//    layer: the first gradient backward gets wrong, from which the error
//    flows on to every tensor backward computes after it.
//  - TSR_WRAP_STEP_LOG, "llama_step_log": no op changed; every training
//    forward and every backward appends "F|B update micro" (the host's
//    ABI 1.9 step_position) to step_positions.txt in the run directory
//    (tests/integration/test_llama.cpp holds the engine to the sequence).
//  - otherwise, "llama_fp32_loss": cross_entropy rounds its loss sum to
//    fp32, as a model that adds up its loss in fp32 does. Its backward is
//    llama's, correct; only the loss the check differentiates numerically
//    is coarser, so the check must pass it at std 0.02.
#include <dlfcn.h>
#include <tessera/tessera.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace {

const tsr_plugin_descriptor *llama_descriptor() {
  static const tsr_plugin_descriptor *d = []() -> const tsr_plugin_descriptor * {
    void *so = dlopen(TSR_LLAMA_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (!so) return nullptr;
    auto entry = reinterpret_cast<tsr_plugin_library_fn>(dlsym(so, TSR_ENTRY_SYMBOL));
    const tsr_plugin_library *lib = entry ? entry() : nullptr;
    return lib && lib->num_plugins == 1 ? lib->plugins[0] : nullptr;
  }();
  return d;
}

const tsr_ops *g_real_ops = nullptr;
tsr_ops g_ops;
tsr_host g_host;
tsr_model_vtable g_vtable;

#ifdef TSR_WRAP_STEP_LOG
const tsr_host *g_real_host = nullptr;
const tsr_model_vtable *g_real_vtable = nullptr;

void log_position(tsr_step *step, char pass) {
  uint64_t update = 0;
  uint32_t micro = 0;
  if (g_real_host->step_position(step, &update, &micro) != TSR_OK) return;
  const std::string path = std::string(g_real_host->run->run_dir) + "/step_positions.txt";
  if (FILE *f = std::fopen(path.c_str(), "a")) {
    std::fprintf(f, "%c %llu %u\n", pass, static_cast<unsigned long long>(update), micro);
    std::fclose(f);
  }
}

tsr_status logged_forward(void *self, tsr_step *step, const tsr_batch *batch, int32_t training,
                          tsr_forward_result *out) {
  if (training) log_position(step, 'F');
  return g_real_vtable->forward(self, step, batch, training, out);
}

tsr_status logged_backward(void *self, tsr_step *step, const tsr_batch *batch, float loss_scale) {
  log_position(step, 'B');
  return g_real_vtable->backward(self, step, batch, loss_scale);
}
#endif

#ifdef TSR_WRAP_BROKEN_SWIGLU
tsr_status broken_swiglu_backward(tsr_host_ctx *ctx, const DLTensor *gate, const DLTensor *up,
                                  const DLTensor *dout, DLTensor *dgate, DLTensor *dup) {
  const tsr_status st = g_real_ops->swiglu_backward(ctx, gate, up, dout, dgate, dup);
  return st != TSR_OK ? st : g_real_ops->scale(ctx, 1.25f, dup);
}
#elif !defined(TSR_WRAP_STEP_LOG)
tsr_status fp32_cross_entropy(tsr_host_ctx *ctx, const DLTensor *logits, const DLTensor *targets,
                              int64_t valid_classes, float grad_scale, DLTensor *dlogits,
                              double *loss_sum, int64_t *count, int64_t *correct) {
  const tsr_status st = g_real_ops->cross_entropy(ctx, logits, targets, valid_classes, grad_scale,
                                                  dlogits, loss_sum, count, correct);
  *loss_sum = static_cast<double>(static_cast<float>(*loss_sum));
  return st;
}
#endif

tsr_status broken_create(const tsr_host *host, const tsr_config *cfg, const tsr_model_init *init,
                         void **out) {
  const auto *real = static_cast<const tsr_model_vtable *>(llama_descriptor()->vtable);
  std::memset(&g_host, 0, sizeof g_host);
  std::memcpy(&g_host, host, host->struct_size < sizeof g_host ? host->struct_size : sizeof g_host);
  g_real_ops = host->ops;
  std::memset(&g_ops, 0, sizeof g_ops);
  std::memcpy(&g_ops, host->ops,
              host->ops->struct_size < sizeof g_ops ? host->ops->struct_size : sizeof g_ops);
#if defined(TSR_WRAP_BROKEN_SWIGLU)
  g_ops.swiglu_backward = broken_swiglu_backward;
  // ABI 1.12's fused form would step around the broken op: without it
  // llama runs swiglu_backward on every device and setting.
  g_ops.swiglu_backward_out = nullptr;
#elif defined(TSR_WRAP_STEP_LOG)
  g_real_host = host;
#else
  g_ops.cross_entropy = fp32_cross_entropy;
#endif
  g_host.ops = &g_ops;
  return real->create(&g_host, cfg, init, out);
}

const tsr_plugin_descriptor *broken_descriptor() {
  static tsr_plugin_descriptor d;
  static bool made = false;
  if (!made) {
    const tsr_plugin_descriptor *real = llama_descriptor();
    if (!real) return nullptr;
    d = *real;
    std::memcpy(&g_vtable, real->vtable, sizeof g_vtable);
    g_vtable.create = broken_create;
#ifdef TSR_WRAP_STEP_LOG
    g_real_vtable = static_cast<const tsr_model_vtable *>(real->vtable);
    g_vtable.forward = logged_forward;
    g_vtable.backward = logged_backward;
#endif
    d.name = TSR_WRAP_NAME;
    d.summary = "llama with one op changed (a test of plugin check)";
    d.vtable = &g_vtable;
    made = true;
  }
  return &d;
}

}  // namespace

TSR_PLUGIN_ENTRY {
  static const tsr_plugin_descriptor *plugins[1];
  static tsr_plugin_library lib = {tsr_plugin_library_STRUCT_SIZE, TSR_ABI_MAJOR, TSR_ABI_MINOR,
                                   plugins, 0};
  plugins[0] = broken_descriptor();
  lib.num_plugins = plugins[0] ? 1 : 0;
  return &lib;
}
