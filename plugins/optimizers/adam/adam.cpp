// adam, adamw: Adam with the exact semantics of torch.optim.Adam (L2 weight
// decay added to the gradient) and torch.optim.AdamW (decoupled weight
// decay), on CPU and, built with CUDA, on the GPU (adam_cuda.cu). One
// library, two plugins: `adamw` is the same code with `adamw = true` and
// torch's AdamW default weight_decay = 0.01. The update of one element is
// adam_update in adam.hpp, shared by both devices; weight decay only applies
// inside segments whose decay flag is set.
//
// The CPU step is one pass over each segment: it reads the gradient in its
// own dtype (2 bytes for bf16), reads and writes the fp32 master, m and v,
// and writes the optional compute copy while the value is still in a
// register: 28 bytes per parameter with bf16 gradients and a bf16 copy, the
// least the update can move. The body of a segment runs in a vector kernel
// (adam_avx512.cpp, adam_avx2.cpp: the best the CPU has, picked once at
// create, or the one `cpu_kernel` names) and its ends in the scalar loop
// here; all of them give the same bits (adam_cpu.hpp).
// (The compute-copy and argument-check helpers are the same as sgd's: each
// plugin library stands alone.)
#include "adam.hpp"

#if TSR_ADAM_SIMD
#include <cpuid.h>
#endif

#include <tessera/tessera.h>

#include <array>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <tessera/cpp/extension.hpp>
#include <tessera/cpp/optimizer.hpp>
#include <tessera/cpp/plugin.hpp>
#include <vector>

#include "adam_cpu.hpp"
#include "step_support.hpp"

namespace sdk = tessera::sdk;

namespace {

using namespace tessera::sdk::optim;
using tessera::adam::adam_update;
using tessera::adam::AdamConsts;

using tessera::optimizers::kDevices;  // step_support.hpp
using tessera::optimizers::kSupport;

// ---------------------------------------------------------------------------
// CPU kernels.

// The scalar loop over n elements, pointers already at the first: the
// reference every vector kernel matches, and the ends of a segment that do
// not fill a vector step.
template <typename Grads, typename Out>
void adam_scalar(float *__restrict p, Grads g, float *__restrict m, float *__restrict v, size_t n,
                 const AdamConsts &k, Out out) {
  for (size_t i = 0; i < n; ++i) {
    float mi = m[i], vi = v[i];
    const float pi = adam_update(p[i], g[i], mi, vi, k);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    out.put(i, pi);
  }
}

// The instruction sets of the CPU step (`cpu_kernel`).
enum class CpuKernel { scalar, avx2, avx512 };

const char *kernel_name(CpuKernel k) {
  switch (k) {
    case CpuKernel::avx512:
      return "avx512";
    case CpuKernel::avx2:
      return "avx2";
    default:
      return "scalar";
  }
}

// Whether this CPU (and the OS, for the wider registers) runs kernel k.
bool cpu_has(CpuKernel k) {
#if TSR_ADAM_SIMD
  __builtin_cpu_init();
  if (k == CpuKernel::avx512) return __builtin_cpu_supports("avx512f");
  if (k == CpuKernel::avx2) {
    // F16C (the fp16 conversions) from CPUID, which every AVX2 CPU has but
    // which not every compiler's __builtin_cpu_supports can name.
    unsigned a, b, c, d;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
  }
#endif
  return k == CpuKernel::scalar;
}

// Kernel k's table; NULL for the scalar loop.
const tessera::adam::SimdKernels *kernels_of(CpuKernel k) {
#if TSR_ADAM_SIMD
  if (k == CpuKernel::avx512) return tessera::adam::avx512_kernels();
  if (k == CpuKernel::avx2) return tessera::adam::avx2_kernels();
#endif
  (void)k;
  return nullptr;
}

// `cpu_kernel`: "auto" is the widest this CPU runs; a named one it cannot
// run is refused rather than quietly replaced, since whoever names one
// wants to measure or test that one.
CpuKernel pick_kernel(const std::string &want, const char *who) {
  if (want == "auto" || want.empty()) {  // empty: a host that does not fill in defaults
    for (CpuKernel k : {CpuKernel::avx512, CpuKernel::avx2})
      if (cpu_has(k)) return k;
    return CpuKernel::scalar;
  }
  for (CpuKernel k : {CpuKernel::avx512, CpuKernel::avx2, CpuKernel::scalar}) {
    if (want != kernel_name(k)) continue;
    if (!cpu_has(k))
      throw sdk::Error(TSR_ERR_UNSUPPORTED,
                       fmt("%s: cpu_kernel = \"%s\": this CPU%s cannot run it; use \"auto\"", who,
                           want.c_str(), TSR_ADAM_SIMD ? "" : " (or this build: not x86-64)"));
    return k;
  }
  throw sdk::Error(
      TSR_ERR_CONFIG,
      fmt("%s: cpu_kernel must be auto, avx512, avx2 or scalar, got \"%s\"", who, want.c_str()));
}

// A compute copy of at least this many elements per call is written with
// non-temporal stores: such a call moves 1.8 MB or more, past what a core's
// cache keeps for a later reader, and a normal store would first read every
// line of the copy (2 more bytes per parameter, 7% of the step's traffic).
constexpr size_t kStreamMin = size_t(1) << 16;

// One segment on the CPU, every pointer at its first element: the vector
// kernel over the whole vector steps (from the first 64-byte boundary of the
// compute copy when it streams), the scalar loop over the rest.
void cpu_segment(const tessera::adam::SimdKernels *simd, Elem ge, const void *g, Elem oe, void *out,
                 float *p, float *m, float *v, size_t n, const AdamConsts &k) {
  static_assert(int(Elem::none) == 0 && int(Elem::f32) == 1 && int(Elem::bf16) == 2 &&
                int(Elem::f16) == 3);                     // the table slots of SimdKernels
  const size_t gb = elem_bytes(ge), ob = elem_bytes(oe);  // ge is never Elem::none
  size_t head = 0, body = 0;
  bool stream = false;
  if (simd) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(out);
    stream = ob && n >= kStreamMin && at % ob == 0;
    if (stream) head = (64 - at % 64) % 64 / ob;
    body = (n - head) / tessera::adam::kSimdBlock * tessera::adam::kSimdBlock;
  }
  with_grads(ge, g, [&](auto grads) {
    with_compute_copy(oe, out, [&](auto copy) {
      adam_scalar(p, grads, m, v, head, k, copy);
      if (body) {
        const int gi = int(ge) - 1, oi = int(oe);
        simd->k[gi][oi](p + head, static_cast<const char *>(g) + head * gb, m + head, v + head,
                        body, k, ob ? static_cast<char *>(out) + head * ob : nullptr, stream);
      }
      const size_t t = head + body;
      adam_scalar(p + t, grads.rebase(t), m + t, v + t, n - t, k, copy.rebase(t));
    });
  });
}

// ---------------------------------------------------------------------------
// The plugin instance and its entry points.

struct Adam {
  static constexpr const char *kName = "adam";  // for messages before `name` is set
  const tsr_host *host = nullptr;
  const char *name = "adam";  // for messages: "adam" or "adamw"
  double lr = 0;              // the configured rate: the schedule's peak (TSR_EXT_OPTIMIZER_LR)
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled = false;                            // the `adamw` key
  const tessera::adam::SimdKernels *simd = nullptr;  // `cpu_kernel`; NULL: scalar

  uint32_t state_count() const { return 2; }
  const char *state_name(uint32_t i) const {
    static const char *const kNames[] = {"exp_avg", "exp_avg_sq"};
    return i < 2 ? kNames[i] : nullptr;
  }
  void step(const tsr_optimizer_step_args *args) const;
};

std::unique_ptr<Adam> build(const tsr_host *host, const tsr_config *cfg, const char *name) {
  sdk::Config c(host, cfg);
  auto self = std::make_unique<Adam>();
  self->host = host;
  self->name = name;
  // The engine's schedule scales `lr` (it asks for it through the lr
  // extension); each step gets the scheduled value in args->lr.
  self->lr = c.get_float("lr");
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
  self->simd = kernels_of(pick_kernel(c.get_string("cpu_kernel"), name));
  return self;
}

// The two plugins differ only in their name (messages) and defaults.
std::unique_ptr<Adam> build_adam(const tsr_host *host, const tsr_config *cfg) {
  return build(host, cfg, "adam");
}
std::unique_ptr<Adam> build_adamw(const tsr_host *host, const tsr_config *cfg) {
  return build(host, cfg, "adamw");
}

void Adam::step(const tsr_optimizer_step_args *args) const {
  check_step_args(args, 2, name, kSupport);
  const double lr = args->lr;
  const double t = static_cast<double>(args->step);
  AdamConsts base{};
  base.scale = static_cast<float>(args->grad_scale);
  base.beta1 = static_cast<float>(beta1);
  base.beta2 = static_cast<float>(beta2);
  base.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  base.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  base.step_size = static_cast<float>(lr / (1.0 - std::pow(beta1, t)));
  base.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t)));
  base.eps = static_cast<float>(eps);
  base.l2 = 0.0f;
  base.shrink = 1.0f;
  // Segments with decay get the same constants plus the decay term.
  AdamConsts decayed = base;
  if (decoupled)
    decayed.shrink = static_cast<float>(1.0 - lr * weight_decay);
  else
    decayed.l2 = static_cast<float>(weight_decay);
#if TSR_PLUGIN_CUDA
  if (args->device.device_type == kDLCUDA)
    return tessera::adam::adam_step_cuda(host, args, base, decayed, name);
#endif
  const Elem ge = grads_elem(args, name), oe = compute_elem(args, name);
  const size_t gb = elem_bytes(ge), ob = elem_bytes(oe);
  for (size_t i = 0; i < args->num_segments; ++i) {
    const tsr_segment &seg = args->segments[i];
    const size_t off = seg.offset;
    cpu_segment(simd, ge, reinterpret_cast<const char *>(args->grads) + off * gb, oe,
                ob ? static_cast<char *>(args->compute_params) + off * ob : nullptr,
                args->params + off, args->state[0] + off, args->state[1] + off, seg.count,
                seg.decay ? decayed : base);
  }
}

// ---------------------------------------------------------------------------
// Descriptors: the two plugins differ only in their defaults and create.

// The keys of both plugins, with the defaults (and their docs) that differ.
constexpr std::array<tsr_param_decl, 6> params_with(const char *weight_decay,
                                                    const char *weight_decay_doc, const char *adamw,
                                                    const char *adamw_doc) {
  return {
      sdk::param_min("lr", TSR_PARAM_FLOAT, "0.001",
                     "base learning rate (the engine's schedule scales it)", 0.0),
      sdk::param_range("betas", TSR_PARAM_FLOAT_ARRAY, "[0.9, 0.999]",
                       "[beta1, beta2]: decay rates of the moment estimates, each in [0, 1)", 0.0,
                       1.0),
      sdk::param_min("eps", TSR_PARAM_FLOAT, "1e-8", "added to the denominator for stability", 0.0),
      sdk::param_min("weight_decay", TSR_PARAM_FLOAT, weight_decay, weight_decay_doc, 0.0),
      sdk::param("adamw", TSR_PARAM_BOOL, adamw, adamw_doc),
      sdk::param_choice("cpu_kernel", "\"auto\"",
                        "instruction set of the CPU step: auto = the widest this CPU runs; every "
                        "choice gives the same bits",
                        "auto|avx512|avx2|scalar"),
  };
}

constexpr std::array<tsr_param_decl, 6> kAdamParams =
    params_with("0.0", "weight decay (decaying segments only); L2 or decoupled, see adamw", "false",
                "false: L2 added to the gradient (torch Adam); true: decoupled (torch AdamW)");

constexpr std::array<tsr_param_decl, 6> kAdamwParams = params_with(
    "0.01", "weight decay (decaying segments only); decoupled unless adamw = false", "true",
    "true: decoupled weight decay (torch AdamW); false: L2 added to the gradient");

const tsr_optimizer_vtable kAdamVtable = sdk::optimizer_vtable<Adam, build_adam>();
const tsr_optimizer_vtable kAdamwVtable = sdk::optimizer_vtable<Adam, build_adamw>();

double adam_base_lr(void *self) {
  return self ? static_cast<const Adam *>(self)->lr : 0.0;
}

const tsr_ext_optimizer_lr kLrExtension = {tsr_ext_optimizer_lr_STRUCT_SIZE, adam_base_lr};
const sdk::Extension kExtensions[] = {{TSR_EXT_OPTIMIZER_LR, &kLrExtension}};

const void *adam_extension(const char *id) {
  return sdk::find_extension(kExtensions, id);
}

const tsr_plugin_descriptor kAdamDescriptor =
    sdk::describe(TSR_KIND_OPTIMIZER, "adam", "1.0.0",
                  "Adam with bias correction and L2 weight decay (torch.optim.Adam)", kAdamParams,
                  kDevices, &kAdamVtable, adam_extension);

const tsr_plugin_descriptor kAdamwDescriptor = sdk::describe(
    TSR_KIND_OPTIMIZER, "adamw", "1.0.0", "Adam with decoupled weight decay (torch.optim.AdamW)",
    kAdamwParams, kDevices, &kAdamwVtable, adam_extension);

}  // namespace

TSR_SDK_PLUGIN_LIBRARY(&kAdamDescriptor, &kAdamwDescriptor)
