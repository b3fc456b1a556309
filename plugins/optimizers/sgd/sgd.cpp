// sgd: stochastic gradient descent with the exact semantics of
// torch.optim.SGD (momentum, dampening, nesterov, L2 weight decay), on CPU.
//
// The update for one element, in torch's order:
//   g   = grad * grad_scale + weight_decay * p        (decay only where the segment says so)
//   buf = g                                           (step 1: a copy, no dampening)
//   buf = momentum * buf + (1 - dampening) * g        (later steps)
//   d   = nesterov ? g + momentum * buf : buf         (d = g when momentum == 0)
//   p   = p - lr * d
//
// The kernels are plain loops over one segment with no allocation, so the
// compiler vectorizes them; the optional low-precision compute copy of the
// params is written in the same pass, while the value is still in a register.
#include <tessera/tessera.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <tessera/cpp/optimizer.hpp>
#include <tessera/cpp/plugin.hpp>

namespace sdk = tessera::sdk;

namespace {

using namespace tessera::sdk::optim;

// ---------------------------------------------------------------------------
// Kernels: one segment each, pointers already offset to its first element.

// momentum == 0: no state, the step is just p -= lr * (g + wd * p).
template <typename Out>
void sgd_plain(float *__restrict p, const float *__restrict g, size_t n, float lr, float scale,
               float wd, Out out) {
  for (size_t i = 0; i < n; ++i) {
    float gi = g[i] * scale;
    if (wd != 0.0f) gi += wd * p[i];  // as torch: no 0 * p term (inf/NaN params stay put)
    float pi = p[i] - lr * gi;
    p[i] = pi;
    out.put(i, pi);
  }
}

// momentum != 0; keep = 1 - dampening. `first` is step 1, where torch
// clones the gradient into the buffer (no dampening, and whatever the buffer
// held is ignored); the branch is loop-invariant, so it costs nothing per
// element.
template <typename Out>
void sgd_momentum(float *__restrict p, const float *__restrict g, float *__restrict buf, size_t n,
                  float lr, float scale, float wd, float momentum, float keep, bool nesterov,
                  bool first, Out out) {
  for (size_t i = 0; i < n; ++i) {
    float gi = g[i] * scale;
    if (wd != 0.0f) gi += wd * p[i];
    float b = first ? gi : momentum * buf[i] + keep * gi;
    buf[i] = b;
    float d = nesterov ? gi + momentum * b : b;
    float pi = p[i] - lr * d;
    p[i] = pi;
    out.put(i, pi);
  }
}

// ---------------------------------------------------------------------------
// The plugin instance and its entry points.

struct Sgd {
  const tsr_host *host = nullptr;
  float momentum = 0, weight_decay = 0;
  float keep = 1;             // 1 - dampening, rounded once from double
  bool has_momentum = false;  // momentum != 0, decided in double
  bool nesterov = false;
};

tsr_status sgd_create(const tsr_host *host, const tsr_config *cfg, void **out_self) {
  if (out_self) *out_self = nullptr;
  return sdk::guard(host, [&] {
    if (!out_self) throw sdk::Error(TSR_ERR_INVALID, "sgd: out_self is NULL");
    sdk::Config c(host, cfg);
    auto self = std::make_unique<Sgd>();
    self->host = host;
    // `lr` is read by the engine as the base rate of its schedule; the step
    // gets the scheduled value in args->lr. Reading it here only validates.
    (void)c.get_float("lr");
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
    *out_self = self.release();
  });
}

void sgd_destroy(void *self) {
  auto *s = static_cast<Sgd *>(self);
  if (!s) return;
  const tsr_host *host = s->host;
  (void)sdk::guard(host, [&] { delete s; });
}

uint32_t sgd_state_count(void *self) {
  auto *s = static_cast<Sgd *>(self);
  uint32_t n = 0;
  (void)sdk::guard(s->host, [&] { n = s->has_momentum ? 1u : 0u; });
  return n;
}

const char *sgd_state_name(void *self, uint32_t i) {
  auto *s = static_cast<Sgd *>(self);
  const char *name = nullptr;
  (void)sdk::guard(s->host, [&] {
    if (s->has_momentum && i == 0) name = "momentum_buffer";
  });
  return name;
}

tsr_status sgd_step(void *self, const tsr_optimizer_step_args *args) {
  auto *s = static_cast<Sgd *>(self);
  return sdk::guard(s->host, [&] {
    const bool has_momentum = s->has_momentum;
    check_step_args(args, has_momentum ? 1u : 0u, "sgd");
    const float lr = static_cast<float>(args->lr);
    const float scale = static_cast<float>(args->grad_scale);
    const bool first = args->step == 1;
    with_compute_copy(args, "sgd", [&](auto copy) {
      for (size_t k = 0; k < args->num_segments; ++k) {
        const tsr_segment &seg = args->segments[k];
        const size_t off = seg.offset;
        const float wd = seg.decay ? s->weight_decay : 0.0f;
        if (has_momentum)
          sgd_momentum(args->params + off, args->grads + off, args->state[0] + off, seg.count, lr,
                       scale, wd, s->momentum, s->keep, s->nesterov, first, copy.rebase(off));
        else
          sgd_plain(args->params + off, args->grads + off, seg.count, lr, scale, wd,
                    copy.rebase(off));
      }
    });
  });
}

// ---------------------------------------------------------------------------
// Descriptor.

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

const tsr_optimizer_vtable kSgdVtable = {
    sizeof(tsr_optimizer_vtable),
    sgd_create,
    sgd_destroy,
    sgd_state_count,
    sgd_state_name,
    sgd_step,
};

const tsr_plugin_descriptor kSgdDescriptor = {
    sizeof(tsr_plugin_descriptor),
    TSR_KIND_OPTIMIZER,
    "sgd",
    "1.0.0",
    "SGD with momentum, dampening, Nesterov and weight decay (torch.optim.SGD)",
    kSgdParams,
    sizeof(kSgdParams) / sizeof(kSgdParams[0]),
    TSR_DEVICE_CPU,
    &kSgdVtable,
};

const tsr_plugin_descriptor *const kPlugins[] = {&kSgdDescriptor};

const tsr_plugin_library kLibrary = {
    sizeof(tsr_plugin_library),
    TSR_ABI_MAJOR,
    TSR_ABI_MINOR,
    kPlugins,
    sizeof(kPlugins) / sizeof(kPlugins[0]),
};

}  // namespace

TSR_PLUGIN_ENTRY {
  return &kLibrary;
}
