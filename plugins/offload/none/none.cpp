// Offload "none": the fp32 master weights and optimizer state live on the
// device where compute runs, and the optimizer step runs there too. The
// optimizer writes the updated compute parameters in the same pass.
#include <cstring>
#include <string>
#include <tessera/cpp/plugin.hpp>
#include <vector>

namespace {

using namespace tessera::sdk;

struct None {
  const tsr_host *host = nullptr;
  size_t n = 0;
  const tsr_optimizer_vtable *opt = nullptr;
  void *opt_self = nullptr;
  DLDevice device{};
  DLDataType compute_dtype{};
  Buffer master;
  std::vector<Buffer> state_bufs;
  std::vector<float *> state;
  std::vector<float *> state_at;  // per-step offsets into state
};

tsr_status create(const tsr_host *host, const tsr_config *, void **out) {
  return guard(host, [&] {
    auto *s = new None();
    s->host = host;
    *out = s;
  });
}

void destroy(void *self) {
  delete static_cast<None *>(self);
}

tsr_status setup(void *self, const tsr_offload_setup *st) {
  auto *s = static_cast<None *>(self);
  return guard(s->host, [&] {
    if (st->device.device_type != kDLCPU)
      throw Error(TSR_ERR_UNSUPPORTED, "offload none: only CPU devices in this build");
    s->n = st->n;
    s->opt = st->optimizer;
    s->opt_self = st->optimizer_self;
    s->device = st->device;
    s->compute_dtype = st->compute_dtype;
    s->master = Buffer(s->host, s->device, s->n * sizeof(float), TSR_MEM_OPTIMIZER);
    for (uint32_t i = 0; i < st->state_count; ++i) {
      s->state_bufs.emplace_back(s->host, s->device, s->n * sizeof(float), TSR_MEM_OPTIMIZER);
      s->state.push_back(s->state_bufs.back().as<float>());
    }
    s->state_at.resize(st->state_count);
  });
}

tsr_status step(void *self, const tsr_offload_step *st) {
  auto *s = static_cast<None *>(self);
  return guard(s->host, [&] {
    if (st->offset > s->n || st->count > s->n - st->offset)
      throw Error(TSR_ERR_INVALID, "offload none: step range past the owned elements");
    if (s->compute_dtype.code != kDLFloat || s->compute_dtype.bits != 32)
      throw Error(TSR_ERR_UNSUPPORTED, "offload none: CPU gradients must be fp32");
    for (size_t i = 0; i < s->state.size(); ++i) s->state_at[i] = s->state[i] + st->offset;
    auto a = make<tsr_optimizer_step_args>();
    a.device = s->device;
    a.params = s->master.as<float>() + st->offset;
    a.grads = static_cast<const float *>(st->grads);
    a.state = s->state_at.data();
    a.n = st->count;
    a.segments = st->segments;
    a.num_segments = st->num_segments;
    a.lr = st->lr;
    a.grad_scale = st->grad_scale;
    a.step = st->step;
    a.compute_params = st->params;  // written in the same pass as the master
    a.compute_dtype = s->compute_dtype;
    check(s->opt->step(s->opt_self, &a));
  });
}

tsr_status flush(void *) {
  return TSR_OK;
}  // every step completes before returning

tsr_status copy_state(None *s, uint32_t slot, size_t offset, size_t count, float *dst,
                      const float *src) {
  return guard(s->host, [&] {
    if (offset > s->n || count > s->n - offset)
      throw Error(TSR_ERR_INVALID, "offload none: state range past the owned elements");
    float *base = slot == 0 ? s->master.as<float>()
                            : (slot - 1 < s->state.size() ? s->state[slot - 1] : nullptr);
    if (!base) throw Error(TSR_ERR_INVALID, "offload none: no state slot " + std::to_string(slot));
    if (dst)
      std::memcpy(dst, base + offset, count * sizeof(float));
    else
      std::memcpy(base + offset, src, count * sizeof(float));
  });
}

tsr_status read_state(void *self, uint32_t slot, size_t offset, size_t count, float *dst) {
  return copy_state(static_cast<None *>(self), slot, offset, count, dst, nullptr);
}

tsr_status write_state(void *self, uint32_t slot, size_t offset, size_t count, const float *src) {
  return copy_state(static_cast<None *>(self), slot, offset, count, nullptr, src);
}

const tsr_offload_vtable kVtable = {
    sizeof(tsr_offload_vtable), create, destroy, setup, step, flush, read_state, write_state};

const tsr_plugin_descriptor kNone = {sizeof(tsr_plugin_descriptor),
                                     TSR_KIND_OFFLOAD,
                                     "none",
                                     "1.0.0",
                                     "keep optimizer state on the compute device",
                                     nullptr,
                                     0,
                                     TSR_DEVICE_CPU,
                                     &kVtable};
const tsr_plugin_descriptor *const kPlugins[] = {&kNone};
const tsr_plugin_library kLibrary = {sizeof(tsr_plugin_library), TSR_ABI_MAJOR, TSR_ABI_MINOR,
                                     kPlugins, 1};

}  // namespace

TSR_PLUGIN_ENTRY {
  return &kLibrary;
}
