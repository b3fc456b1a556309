// sgd: stochastic gradient descent with the exact semantics of
// torch.optim.SGD (momentum, dampening, nesterov, L2 weight decay), on CPU
// and, built with CUDA, on the GPU (sgd_cuda.cu). The update of one element
// is sgd_update in sgd.hpp, shared by both.
//
// The CPU kernel is a plain loop over one segment with no allocation, so the
// compiler vectorizes it; the optional low-precision compute copy of the
// params is written in the same pass, while the value is still in a register.
#include "sgd.hpp"

#include <tessera/tessera.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <tessera/cpp/extension.hpp>
#include <tessera/cpp/optimizer.hpp>
#include <tessera/cpp/plugin.hpp>

#include "step_support.hpp"

namespace sdk = tessera::sdk;

namespace {

// What `tessera plugins` says of it (the descriptor's summary).
constexpr const char *kSummary =
    "SGD with momentum, dampening, Nesterov and weight decay (torch.optim.SGD)";

using namespace tessera::sdk::optim;
using tessera::sgd::sgd_update;
using tessera::sgd::SgdStep;

using tessera::optimizers::kDevices;  // step_support.hpp
using tessera::optimizers::kSupport;

// ---------------------------------------------------------------------------
// CPU kernel: one segment, pointers already offset to its first element.
// The branches inside sgd_update are loop-invariant (momentum, nesterov,
// step 1, decay), so the compiler hoists them out of the loop.
template <typename Grads, typename Out>
TSR_CPU_CLONES void sgd_segment(float *__restrict p, Grads g, float *__restrict buf, size_t n,
                                bool decay, const SgdStep &k, Out out) {
  if (!k.has_momentum) {
    for (size_t i = 0; i < n; ++i) {
      float unused = 0.0f;
      const float pi = sgd_update(p[i], g[i], unused, decay, k);
      p[i] = pi;
      out.put(i, pi);
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    float b = buf[i];
    const float pi = sgd_update(p[i], g[i], b, decay, k);
    buf[i] = b;
    p[i] = pi;
    out.put(i, pi);
  }
}

// ---------------------------------------------------------------------------
// The plugin instance and its entry points.

struct Sgd {
  static constexpr const char *kName = "sgd";  // for messages
  const tsr_host *host = nullptr;
  double lr = 0;  // the configured rate: the schedule's peak (TSR_EXT_OPTIMIZER_LR)
  float momentum = 0, weight_decay = 0;
  float keep = 1;             // 1 - dampening, rounded once from double
  bool has_momentum = false;  // momentum != 0, decided in double
  bool nesterov = false;

  uint32_t state_count() const { return has_momentum ? 1u : 0u; }
  const char *state_name(uint32_t i) const {
    return has_momentum && i == 0 ? "momentum_buffer" : nullptr;
  }
  void step(const tsr_optimizer_step_args *args) const;
};

std::unique_ptr<Sgd> build(const tsr_host *host, const tsr_config *cfg) {
  sdk::Config c(host, cfg);
  auto self = std::make_unique<Sgd>();
  self->host = host;
  // The engine's schedule scales `lr` (it asks for it through the lr
  // extension); each step gets the scheduled value in args->lr.
  self->lr = c.get_float("lr");
  double momentum = c.get_float("momentum");
  double dampening = c.get_float("dampening");
  self->nesterov = c.get_bool("nesterov");
  self->weight_decay = static_cast<float>(c.get_float("weight_decay"));
  if (self->nesterov && (momentum <= 0 || dampening != 0))
    throw sdk::Error(TSR_ERR_CONFIG,
                     fmt("sgd: nesterov momentum requires a momentum > 0 and zero dampening "
                         "(as torch.optim.SGD); got momentum = %g, dampening = %g",
                         momentum, dampening));
  self->momentum = static_cast<float>(momentum);
  self->has_momentum = momentum != 0;
  self->keep = static_cast<float>(1.0 - dampening);
  return self;
}

void Sgd::step(const tsr_optimizer_step_args *args) const {
  check_step_args(args, state_count(), "sgd", kSupport);
  SgdStep k{};
  k.lr = static_cast<float>(args->lr);
  k.scale = static_cast<float>(args->grad_scale);
  k.weight_decay = weight_decay;
  k.momentum = momentum;
  k.keep = keep;
  k.has_momentum = has_momentum;
  k.nesterov = nesterov;
  k.first = args->step == 1;
#if TSR_PLUGIN_CUDA
  if (args->device.device_type == kDLCUDA) return tessera::sgd::sgd_step_cuda(host, args, k);
#endif
  float *buf = has_momentum ? args->state[0] : nullptr;
  with_grads(args, "sgd", [&](auto grads) {
    with_compute_copy(args, "sgd", [&](auto copy) {
      for (size_t i = 0; i < args->num_segments; ++i) {
        const tsr_segment &seg = args->segments[i];
        const size_t off = seg.offset;
        sgd_segment(args->params + off, grads.rebase(off), buf ? buf + off : nullptr, seg.count,
                    seg.decay != 0, k, copy.rebase(off));
      }
    });
  });
}

// ---------------------------------------------------------------------------
// Descriptor and tables.

const tsr_param_decl kSgdParams[] = {
    sdk::param_min("lr", TSR_PARAM_FLOAT, "0.01",
                   "base learning rate (the engine's schedule scales it)", 0.0),
    sdk::param_range("momentum", TSR_PARAM_FLOAT, "0.0", "momentum factor; 0 keeps no state", 0.0,
                     1.0),
    sdk::param("dampening", TSR_PARAM_FLOAT, "0.0", "dampening for momentum"),
    sdk::param("nesterov", TSR_PARAM_BOOL, "false",
               "Nesterov momentum (needs momentum > 0 and dampening = 0)"),
    sdk::param_min("weight_decay", TSR_PARAM_FLOAT, "0.0",
                   "L2 penalty added to the gradient (decaying segments only)", 0.0),
};

const tsr_optimizer_vtable kSgdVtable = sdk::optimizer_vtable<Sgd, build>();

double sgd_base_lr(void *self) {
  return self ? static_cast<const Sgd *>(self)->lr : 0.0;
}

const tsr_ext_optimizer_lr kLrExtension = {tsr_ext_optimizer_lr_STRUCT_SIZE, sgd_base_lr};
const sdk::Extension kExtensions[] = {{TSR_EXT_OPTIMIZER_LR, &kLrExtension}};

const void *sgd_extension(const char *id) {
  return sdk::find_extension(kExtensions, id);
}

const tsr_plugin_descriptor kSgdDescriptor = sdk::describe(
    TSR_KIND_OPTIMIZER, "sgd", "1.0.0", kSummary, kSgdParams, kDevices, &kSgdVtable, sgd_extension);

}  // namespace

TSR_SDK_PLUGIN_LIBRARY(&kSgdDescriptor)
