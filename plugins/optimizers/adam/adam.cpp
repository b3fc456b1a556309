// adam, adamw: Adam with the exact semantics of torch.optim.Adam (L2 weight
// decay added to the gradient) and torch.optim.AdamW (decoupled weight
// decay), on CPU and, built with CUDA, on the GPU (adam_cuda.cu). One
// library, two plugins: `adamw` is the same code with `adamw = true` and
// torch's AdamW default weight_decay = 0.01. The update of one element is
// adam_update in adam.hpp, shared by both devices; weight decay only applies
// inside segments whose decay flag is set.
//
// The CPU kernel is a plain loop over one segment with no allocation, so the
// compiler vectorizes it (built for AVX-512, AVX2 and SSE2, the best picked
// at load time: TSR_CPU_CLONES in host_device.hpp); the optional
// low-precision compute copy of the params is written in the same pass,
// while the value is still in a register.
// (The compute-copy and argument-check helpers are the same as sgd's: each
// plugin library stands alone.)
#include "adam.hpp"

#include <tessera/tessera.h>

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <tessera/cpp/optimizer.hpp>
#include <tessera/cpp/plugin.hpp>
#include <vector>

namespace sdk = tessera::sdk;

namespace {

using namespace tessera::sdk::optim;
using tessera::adam::adam_update;
using tessera::adam::AdamConsts;

#if TSR_PLUGIN_CUDA
constexpr uint32_t kDevices = TSR_DEVICE_CPU | TSR_DEVICE_CUDA;
#else
constexpr uint32_t kDevices = TSR_DEVICE_CPU;
#endif
// The step reads bf16 and fp16 gradients on every device it supports.
constexpr StepSupport kSupport = {kDevices, true};

// ---------------------------------------------------------------------------
// CPU kernel: one segment, pointers already offset to its first element.

template <typename Grads, typename Out>
TSR_CPU_CLONES void adam_segment(float *__restrict p, Grads g, float *__restrict m,
                                 float *__restrict v, size_t n, const AdamConsts &k, Out out) {
  for (size_t i = 0; i < n; ++i) {
    float mi = m[i], vi = v[i];
    const float pi = adam_update(p[i], g[i], mi, vi, k);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    out.put(i, pi);
  }
}

// ---------------------------------------------------------------------------
// The plugin instance and its entry points.

struct Adam {
  const tsr_host *host = nullptr;
  const char *name = "adam";  // for messages: "adam" or "adamw"
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled = false;  // the `adamw` key
};

void create_into(const tsr_host *host, const tsr_config *cfg, const char *name, void **out_self) {
  if (!out_self) throw sdk::Error(TSR_ERR_INVALID, fmt("%s: out_self is NULL", name));
  sdk::Config c(host, cfg);
  auto self = std::make_unique<Adam>();
  self->host = host;
  self->name = name;
  // `lr` is read by the engine as the base rate of its schedule; the step
  // gets the scheduled value in args->lr. Reading it here only validates.
  (void)c.get_float("lr");
  std::vector<double> betas = c.get_float_array("betas");
  if (betas.size() != 2)
    throw sdk::Error(
        TSR_ERR_CONFIG,
        fmt("%s: betas must have exactly 2 elements [beta1, beta2], got %zu", name, betas.size()));
  for (size_t i = 0; i < 2; ++i)
    if (!(betas[i] >= 0.0 && betas[i] < 1.0))
      throw sdk::Error(TSR_ERR_CONFIG,
                       fmt("%s: betas[%zu] must be in [0, 1), got %g", name, i, betas[i]));
  self->beta1 = betas[0];
  self->beta2 = betas[1];
  self->eps = c.get_float("eps");
  self->weight_decay = c.get_float("weight_decay");
  self->decoupled = c.get_bool("adamw");
  *out_self = self.release();
}

tsr_status adam_create(const tsr_host *host, const tsr_config *cfg, void **out_self) {
  if (out_self) *out_self = nullptr;
  return sdk::guard(host, [&] { create_into(host, cfg, "adam", out_self); });
}

tsr_status adamw_create(const tsr_host *host, const tsr_config *cfg, void **out_self) {
  if (out_self) *out_self = nullptr;
  return sdk::guard(host, [&] { create_into(host, cfg, "adamw", out_self); });
}

void adam_destroy(void *self) {
  auto *s = static_cast<Adam *>(self);
  if (!s) return;
  const tsr_host *host = s->host;
  (void)sdk::guard(host, [&] { delete s; });
}

uint32_t adam_state_count(void *self) {
  auto *s = static_cast<Adam *>(self);
  uint32_t n = 0;
  (void)sdk::guard(s->host, [&] { n = 2; });
  return n;
}

const char *adam_state_name(void *self, uint32_t i) {
  auto *s = static_cast<Adam *>(self);
  const char *name = nullptr;
  (void)sdk::guard(s->host, [&] {
    static const char *const kNames[] = {"exp_avg", "exp_avg_sq"};
    if (i < 2) name = kNames[i];
  });
  return name;
}

tsr_status adam_step(void *self, const tsr_optimizer_step_args *args) {
  auto *s = static_cast<Adam *>(self);
  return sdk::guard(s->host, [&] {
    check_step_args(args, 2, s->name, kSupport);
    const double lr = args->lr;
    const double t = static_cast<double>(args->step);
    AdamConsts base{};
    base.scale = static_cast<float>(args->grad_scale);
    base.beta1 = static_cast<float>(s->beta1);
    base.beta2 = static_cast<float>(s->beta2);
    base.one_minus_beta1 = static_cast<float>(1.0 - s->beta1);
    base.one_minus_beta2 = static_cast<float>(1.0 - s->beta2);
    base.step_size = static_cast<float>(lr / (1.0 - std::pow(s->beta1, t)));
    base.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(s->beta2, t)));
    base.eps = static_cast<float>(s->eps);
    base.l2 = 0.0f;
    base.shrink = 1.0f;
    // Segments with decay get the same constants plus the decay term.
    AdamConsts decayed = base;
    if (s->decoupled)
      decayed.shrink = static_cast<float>(1.0 - lr * s->weight_decay);
    else
      decayed.l2 = static_cast<float>(s->weight_decay);
#if TSR_PLUGIN_CUDA
    if (args->device.device_type == kDLCUDA)
      return tessera::adam::adam_step_cuda(s->host, args, base, decayed, s->name);
#endif
    with_grads(args, s->name, [&](auto grads) {
      with_compute_copy(args, s->name, [&](auto copy) {
        for (size_t i = 0; i < args->num_segments; ++i) {
          const tsr_segment &seg = args->segments[i];
          const size_t off = seg.offset;
          adam_segment(args->params + off, grads.rebase(off), args->state[0] + off,
                       args->state[1] + off, seg.count, seg.decay ? decayed : base,
                       copy.rebase(off));
        }
      });
    });
  });
}

// ---------------------------------------------------------------------------
// Descriptors: the two plugins differ only in their defaults and create.

const tsr_param_decl kAdamParams[] = {
    sdk::param_min("lr", TSR_PARAM_FLOAT, "0.001",
                   "base learning rate (the engine's schedule scales it)", 0.0),
    sdk::param_range("betas", TSR_PARAM_FLOAT_ARRAY, "[0.9, 0.999]",
                     "[beta1, beta2]: decay rates of the moment estimates, each in [0, 1)", 0.0,
                     1.0),
    sdk::param_min("eps", TSR_PARAM_FLOAT, "1e-8", "added to the denominator for stability", 0.0),
    sdk::param_min("weight_decay", TSR_PARAM_FLOAT, "0.0",
                   "weight decay (decaying segments only); L2 or decoupled, see adamw", 0.0),
    sdk::param("adamw", TSR_PARAM_BOOL, "false",
               "false: L2 added to the gradient (torch Adam); true: decoupled (torch AdamW)"),
};

const tsr_param_decl kAdamwParams[] = {
    sdk::param_min("lr", TSR_PARAM_FLOAT, "0.001",
                   "base learning rate (the engine's schedule scales it)", 0.0),
    sdk::param_range("betas", TSR_PARAM_FLOAT_ARRAY, "[0.9, 0.999]",
                     "[beta1, beta2]: decay rates of the moment estimates, each in [0, 1)", 0.0,
                     1.0),
    sdk::param_min("eps", TSR_PARAM_FLOAT, "1e-8", "added to the denominator for stability", 0.0),
    sdk::param_min("weight_decay", TSR_PARAM_FLOAT, "0.01",
                   "weight decay (decaying segments only); decoupled unless adamw = false", 0.0),
    sdk::param("adamw", TSR_PARAM_BOOL, "true",
               "true: decoupled weight decay (torch AdamW); false: L2 added to the gradient"),
};

const tsr_optimizer_vtable kAdamVtable = {
    sizeof(tsr_optimizer_vtable),
    adam_create,
    adam_destroy,
    adam_state_count,
    adam_state_name,
    adam_step,
};

const tsr_optimizer_vtable kAdamwVtable = {
    sizeof(tsr_optimizer_vtable),
    adamw_create,
    adam_destroy,
    adam_state_count,
    adam_state_name,
    adam_step,
};

const tsr_plugin_descriptor kAdamDescriptor = {
    sizeof(tsr_plugin_descriptor),
    TSR_KIND_OPTIMIZER,
    "adam",
    "1.0.0",
    "Adam with bias correction and L2 weight decay (torch.optim.Adam)",
    kAdamParams,
    sizeof(kAdamParams) / sizeof(kAdamParams[0]),
    kDevices,
    &kAdamVtable,
};

const tsr_plugin_descriptor kAdamwDescriptor = {
    sizeof(tsr_plugin_descriptor),
    TSR_KIND_OPTIMIZER,
    "adamw",
    "1.0.0",
    "Adam with decoupled weight decay (torch.optim.AdamW)",
    kAdamwParams,
    sizeof(kAdamwParams) / sizeof(kAdamwParams[0]),
    kDevices,
    &kAdamwVtable,
};

const tsr_plugin_descriptor *const kPlugins[] = {&kAdamDescriptor, &kAdamwDescriptor};

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
