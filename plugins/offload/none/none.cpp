// Offload "none": the fp32 master weights and optimizer state live on the
// device where compute runs, and the optimizer step runs there too. The
// optimizer writes the updated compute parameters in the same pass.
//
// On CUDA the memory comes from host->alloc on the compute device and
// state moves to and from host buffers through host->ops->copy. The step
// runs on the host's compute stream (ordered with the backward pass before
// it and the forward pass after it), or with `overlap = true` on a stream
// of the plugin's own, beside the next forward, which waits per group
// (update_stream.hpp). The plugin has no kernels of its own: the math is
// the optimizer's, and the plugin links the CUDA runtime only for that
// stream and its events, so it always declares CUDA support. (A host
// without CUDA never offers a CUDA device, and an optimizer without CUDA
// kernels is refused by its own descriptor before this plugin is set up.)
#include <cstring>
#include <memory>
#include <string>
#include <tessera/cpp/offload.hpp>
#include <tessera/cpp/plugin.hpp>
#include <vector>

#if TSR_PLUGIN_CUDA
#include "update_stream.hpp"
#endif

namespace {

using namespace tessera::sdk;

struct None {
  static constexpr const char *kName = "offload none";  // for messages
  const tsr_host *host = nullptr;
  size_t n = 0;
  const tsr_optimizer_vtable *opt = nullptr;
  void *opt_self = nullptr;
  DLDevice device{};
  bool cuda = false;
  DLDataType compute_dtype{};
  Buffer master;
  std::vector<Buffer> state_bufs;
  std::vector<float *> state;
  std::vector<float *> state_at;  // per-step offsets into state
  bool overlap = false;           // the config's `overlap`
#if TSR_PLUGIN_CUDA
  std::unique_ptr<tessera::offload_none::UpdateStream> side;  // CUDA with overlap
#endif

  void setup(const tsr_offload_setup *st);
  void step(const tsr_offload_step *st);
  void flush();
  void copy_state(uint32_t slot, size_t offset, size_t count, float *dst, const float *src);
  void read_state(uint32_t slot, size_t offset, size_t count, float *dst) {
    copy_state(slot, offset, count, dst, nullptr);
  }
  void write_state(uint32_t slot, size_t offset, size_t count, const float *src) {
    copy_state(slot, offset, count, nullptr, src);
  }
  // The update runs where the parameters live, in order: on the CPU it is
  // done when step() returns, on CUDA it is queued on the compute stream
  // that the next forward (and the clearing of the gradients) runs on, so
  // nothing needs waiting for. With the update stream the compute stream
  // waits on the GPU, never the host.
  void wait_params(size_t offset, size_t count) {
#if TSR_PLUGIN_CUDA
    if (side) side->wait(offset, count);
#endif
    (void)offset, (void)count;
  }
  void wait_grads() {
    settle_stream();
  }
  void settle_stream() {
#if TSR_PLUGIN_CUDA
    if (side) side->wait_all();
#endif
  }
  // All of the step runs on the compute device, inside "optimizer".
  void stats(tsr_offload_stats *) {}
};

std::unique_ptr<None> build(const tsr_host *host, const tsr_config *cfg) {
  auto s = std::make_unique<None>();
  s->host = host;
  s->overlap = Config(host, cfg).get_bool("overlap");
  return s;
}

void None::setup(const tsr_offload_setup *st) {
  const int32_t dev = st->device.device_type;
  if (dev != kDLCPU && dev != kDLCUDA)
    throw Error(TSR_ERR_UNSUPPORTED, "offload none: device type " + std::to_string(dev) +
                                         " is not supported (CPU and CUDA only)");
  cuda = dev == kDLCUDA;
  if (cuda && (!TSR_HAS_FIELD(host, tsr_host, compute_stream) || !host->ops || !host->ops->copy))
    throw Error(TSR_ERR_UNSUPPORTED,
                "offload none: a CUDA run needs a host of ABI 1.1 or later (compute stream, "
                "synchronize and ops.copy)");
  n = st->n;
  opt = st->optimizer;
  opt_self = st->optimizer_self;
  device = st->device;
  compute_dtype = st->compute_dtype;
  master = Buffer(host, device, n * sizeof(float), TSR_MEM_OPTIMIZER);
  for (uint32_t i = 0; i < st->state_count; ++i) {
    state_bufs.emplace_back(host, device, n * sizeof(float), TSR_MEM_OPTIMIZER);
    state.push_back(state_bufs.back().as<float>());
  }
  state_at.resize(st->state_count);
#if TSR_PLUGIN_CUDA
  if (cuda && overlap)
    side = std::make_unique<tessera::offload_none::UpdateStream>(host->compute_stream);
#endif
  // The CPU has no stream to put the update on: the key is accepted (one
  // config for both devices) and said to do nothing here.
  if (!cuda && overlap)
    host->log(host->ctx, TSR_LOG_INFO,
              "offload none: overlap = true changes nothing on the CPU (the update runs in the "
              "step, as with false); it applies to CUDA runs");
}

void None::step(const tsr_offload_step *st) {
  if (st->offset > n || st->count > n - st->offset)
    throw Error(TSR_ERR_INVALID, "offload none: step range past the owned elements");
  // The gradients arrive in the compute dtype. The CUDA optimizers read
  // fp32, bf16 and fp16 gradients; on the CPU the compute dtype is fp32.
  const bool fp32 = compute_dtype.code == kDLFloat && compute_dtype.bits == 32;
  if (!cuda && !fp32) throw Error(TSR_ERR_UNSUPPORTED, "offload none: CPU gradients must be fp32");
  for (size_t i = 0; i < state.size(); ++i) state_at[i] = state[i] + st->offset;
  auto a = make<tsr_optimizer_step_args>();
  a.device = device;
  a.params = master.as<float>() + st->offset;
  a.grads = static_cast<const float *>(st->grads);
  a.state = state_at.data();
  a.n = st->count;
  a.segments = st->segments;
  a.num_segments = st->num_segments;
  a.lr = st->lr;
  a.grad_scale = st->grad_scale;
  a.step = st->step;
  a.compute_params = st->params;  // written in the same pass as the master
  a.compute_dtype = compute_dtype;
  a.grads_dtype = compute_dtype;
  // Ordered after the backward pass that produced the gradients; the
  // step returns once the kernel is queued (flush waits).
  a.stream = cuda ? host->compute_stream : nullptr;
#if TSR_PLUGIN_CUDA
  if (side) a.stream = side->begin_range();
#endif
  check(opt->step(opt_self, &a));
#if TSR_PLUGIN_CUDA
  if (side) side->landed(st->offset, st->count);
#endif
}

// On the CPU every step completes before returning; on CUDA the updates
// are queued on the compute stream and this waits for them.
void None::flush() {
  settle_stream();
  if (cuda) check(host->synchronize(host->ctx));
}

void None::copy_state(uint32_t slot, size_t offset, size_t count, float *dst, const float *src) {
  if (offset > n || count > n - offset)
    throw Error(TSR_ERR_INVALID, "offload none: state range past the owned elements");
  float *base =
      slot == 0 ? master.as<float>() : (slot - 1 < state.size() ? state[slot - 1] : nullptr);
  if (!base) throw Error(TSR_ERR_INVALID, "offload none: no state slot " + std::to_string(slot));
  if (count == 0) return;
  if (!dst && !src) throw Error(TSR_ERR_INVALID, "offload none: state buffer is NULL");
  settle_stream();
  if (!cuda) {
    if (dst)
      std::memcpy(dst, base + offset, count * sizeof(float));
    else
      std::memcpy(base + offset, src, count * sizeof(float));
    return;
  }
  // Device <-> host buffer through the host's copy, which runs on the
  // compute stream: ordered after every queued step (the update stream's
  // too, by settle_stream), so a read sees the updated state. Then wait,
  // because the caller's buffer is plain host memory it may read, reuse or
  // free as soon as this returns.
  int64_t shape[1] = {static_cast<int64_t>(count)};
  DLTensor on_device = view(base + offset, device, dtype_f32(), 1, shape);
  DLTensor in_host = view(dst ? static_cast<void *>(dst) : const_cast<float *>(src),
                          DLDevice{kDLCPU, 0}, dtype_f32(), 1, shape);
  if (dst)
    check(host->ops->copy(host->ctx, &on_device, &in_host));
  else
    check(host->ops->copy(host->ctx, &in_host, &on_device));
  check(host->synchronize(host->ctx));
}

const tsr_offload_vtable kVtable = offload_vtable<None, build>();

const tsr_param_decl kParams[] = {
    param("overlap", TSR_PARAM_BOOL, "false",
          "CUDA: run the optimizer step on a stream of its own, beside the next forward, which "
          "waits only for the group it uses")};

const tsr_plugin_descriptor kNone =
    describe(TSR_KIND_OFFLOAD, "none", "1.0.0", "keep optimizer state on the compute device",
             kParams, TSR_DEVICE_CPU | TSR_DEVICE_CUDA, &kVtable);

}  // namespace

TSR_SDK_PLUGIN_LIBRARY(&kNone)
