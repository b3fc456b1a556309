// Offload "none": the fp32 master weights and optimizer state live on the
// device where compute runs, and the optimizer step runs there too. The
// optimizer writes the updated compute parameters in the same pass.
//
// On CUDA the memory comes from host->alloc on the compute device, the
// step runs on the host's compute stream (so it stays ordered with the
// backward pass before it and the forward pass after it), and state moves
// to and from host buffers through host->ops->copy. The plugin has no
// kernels of its own and is not built against CUDA: everything
// device-specific goes through the host table and the optimizer, so it
// always declares CUDA support. (A host without CUDA never offers a CUDA
// device, and an optimizer without CUDA kernels is refused by its own
// descriptor before this plugin is set up.)
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
  bool cuda = false;
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
    const int32_t dev = st->device.device_type;
    if (dev != kDLCPU && dev != kDLCUDA)
      throw Error(TSR_ERR_UNSUPPORTED, "offload none: device type " + std::to_string(dev) +
                                           " is not supported (CPU and CUDA only)");
    s->cuda = dev == kDLCUDA;
    if (s->cuda &&
        (!TSR_HAS_FIELD(s->host, tsr_host, compute_stream) || !s->host->ops || !s->host->ops->copy))
      throw Error(TSR_ERR_UNSUPPORTED,
                  "offload none: a CUDA run needs a host of ABI 1.1 or later (compute stream, "
                  "synchronize and ops.copy)");
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
    // The gradients arrive in the compute dtype. The CUDA optimizers read
    // fp32, bf16 and fp16 gradients; on the CPU the compute dtype is fp32.
    const bool fp32 = s->compute_dtype.code == kDLFloat && s->compute_dtype.bits == 32;
    if (!s->cuda && !fp32)
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
    a.grads_dtype = s->compute_dtype;
    // Ordered after the backward pass that produced the gradients; the
    // step returns once the kernel is queued (flush waits).
    a.stream = s->cuda ? s->host->compute_stream : nullptr;
    check(s->opt->step(s->opt_self, &a));
  });
}

// On the CPU every step completes before returning; on CUDA the updates
// are queued on the compute stream and this waits for them.
tsr_status flush(void *self) {
  auto *s = static_cast<None *>(self);
  if (!s->cuda) return TSR_OK;
  return s->host->synchronize(s->host->ctx);
}

tsr_status copy_state(None *s, uint32_t slot, size_t offset, size_t count, float *dst,
                      const float *src) {
  return guard(s->host, [&] {
    if (offset > s->n || count > s->n - offset)
      throw Error(TSR_ERR_INVALID, "offload none: state range past the owned elements");
    float *base = slot == 0 ? s->master.as<float>()
                            : (slot - 1 < s->state.size() ? s->state[slot - 1] : nullptr);
    if (!base) throw Error(TSR_ERR_INVALID, "offload none: no state slot " + std::to_string(slot));
    if (count == 0) return;
    if (!s->cuda) {
      if (dst)
        std::memcpy(dst, base + offset, count * sizeof(float));
      else
        std::memcpy(base + offset, src, count * sizeof(float));
      return;
    }
    // Device <-> host buffer through the host's copy, which runs on the
    // compute stream: ordered after every queued step, so a read sees the
    // updated state. Then wait, because the caller's buffer is plain host
    // memory it may read, reuse or free as soon as this returns.
    int64_t shape[1] = {static_cast<int64_t>(count)};
    DLTensor state = view(base + offset, s->device, dtype_f32(), 1, shape);
    DLTensor host = view(dst ? static_cast<void *>(dst) : const_cast<float *>(src),
                         DLDevice{kDLCPU, 0}, dtype_f32(), 1, shape);
    if (dst)
      check(s->host->ops->copy(s->host->ctx, &state, &host));
    else
      check(s->host->ops->copy(s->host->ctx, &host, &state));
    check(s->host->synchronize(s->host->ctx));
  });
}

tsr_status read_state(void *self, uint32_t slot, size_t offset, size_t count, float *dst) {
  return copy_state(static_cast<None *>(self), slot, offset, count, dst, nullptr);
}

tsr_status write_state(void *self, uint32_t slot, size_t offset, size_t count, const float *src) {
  return copy_state(static_cast<None *>(self), slot, offset, count, nullptr, src);
}

// The update runs where the parameters live, in order: on the CPU it is
// done when step() returns, on CUDA it is queued on the compute stream that
// the next forward (and the clearing of the gradients) runs on. So nothing
// needs waiting for, and the host never blocks between steps.
tsr_status wait_params(void *, size_t, size_t) {
  return TSR_OK;
}

tsr_status wait_grads(void *) {
  return TSR_OK;
}

tsr_status stats(void *, tsr_offload_stats *) {
  return TSR_OK;  // all of the step runs on the compute device, inside "optimizer"
}

const tsr_offload_vtable kVtable = {TSR_STRUCT_SIZE(tsr_offload_vtable, stats),
                                    create,
                                    destroy,
                                    setup,
                                    step,
                                    flush,
                                    read_state,
                                    write_state,
                                    wait_params,
                                    wait_grads,
                                    stats};

const tsr_plugin_descriptor kNone = {tsr_plugin_descriptor_STRUCT_SIZE,
                                     TSR_KIND_OFFLOAD,
                                     "none",
                                     "1.0.0",
                                     "keep optimizer state on the compute device",
                                     nullptr,
                                     0,
                                     TSR_DEVICE_CPU | TSR_DEVICE_CUDA,
                                     &kVtable,
                                     nullptr};
const tsr_plugin_descriptor *const kPlugins[] = {&kNone};
const tsr_plugin_library kLibrary = {tsr_plugin_library_STRUCT_SIZE, TSR_ABI_MAJOR, TSR_ABI_MINOR,
                                     kPlugins, 1};

}  // namespace

TSR_PLUGIN_ENTRY {
  return &kLibrary;
}
