// adam, adamw: Adam with the exact semantics of torch.optim.Adam (L2 weight
// decay added to the gradient) and torch.optim.AdamW (decoupled weight
// decay), on CPU. One library, two plugins: `adamw` is the same code with
// `adamw = true` and torch's AdamW default weight_decay = 0.01.
//
// The update for one element at step t (counting from 1), in torch's order:
//   g  = grad * grad_scale (+ weight_decay * p        when adamw = false)
//   p  = p * (1 - lr * weight_decay)                   when adamw = true
//   m  = m + (1 - beta1) * (g - m)                     (torch's lerp)
//   v  = beta2 * v + (1 - beta2) * g * g
//   p  = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// Weight decay only applies inside segments whose decay flag is set.
//
// The kernel is a plain loop over one segment with no allocation, so the
// compiler vectorizes it; the optional low-precision compute copy of the
// params is written in the same pass, while the value is still in a register.
// (The compute-copy and argument-check helpers are the same as sgd's: each
// plugin library stands alone.)
#include <tessera/tessera.h>

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <tessera/cpp/plugin.hpp>
#include <vector>

namespace sdk = tessera::sdk;

namespace {

// ---------------------------------------------------------------------------
// The compute copy: after the fp32 master is updated, the engine may want the
// same values in the compute dtype (what forward/backward read). Each writer
// is a tiny value type whose put() the kernel calls per element; rebase()
// moves it to a segment's first element.

inline uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// fp32 -> bf16, round to nearest even (what torch's .to(torch.bfloat16)
// does). NaNs stay NaN (quiet bit set) instead of rounding into infinity.
inline uint16_t float_to_bf16(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// fp32 -> fp16 (IEEE binary16), round to nearest even, with subnormals,
// overflow to infinity and NaN handled. Bit-exact with a hardware
// conversion; after F. Giesen's float_to_half_fast3_rtne (public domain).
inline uint16_t float_to_f16(float x) {
  uint32_t u = float_bits(x);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint32_t o;
  if (u >= (127u + 16u) << 23) {
    o = (u > 0x7f800000u) ? 0x7e00u : 0x7c00u;  // NaN -> qNaN, too big -> inf
  } else if (u < (113u << 23)) {
    // Subnormal or zero in fp16: adding a magic number aligns the 10
    // mantissa bits at the bottom and lets the FPU round to nearest even.
    const uint32_t magic_bits = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    float magic, f;
    std::memcpy(&magic, &magic_bits, sizeof magic);
    std::memcpy(&f, &u, sizeof f);
    f += magic;
    o = float_bits(f) - magic_bits;
  } else {
    const uint32_t mant_odd = (u >> 13) & 1u;
    u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;  // rebias, round half down...
    u += mant_odd;                                          // ...or up when odd: RNE
    o = u >> 13;
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}

struct NoCopy {
  void put(size_t, float) const {}
  NoCopy rebase(size_t) const { return *this; }
};
struct CopyF32 {
  float *out;
  void put(size_t i, float x) const { out[i] = x; }
  CopyF32 rebase(size_t off) const { return {out + off}; }
};
struct CopyBF16 {
  uint16_t *out;
  void put(size_t i, float x) const { out[i] = float_to_bf16(x); }
  CopyBF16 rebase(size_t off) const { return {out + off}; }
};
struct CopyF16 {
  uint16_t *out;
  void put(size_t i, float x) const { out[i] = float_to_f16(x); }
  CopyF16 rebase(size_t off) const { return {out + off}; }
};

// printf-style formatting into a std::string for error messages (snprintf
// rather than std::to_string keeps libstdc++ template symbols out of the
// library's dynamic symbol table).
[[gnu::format(printf, 1, 2)]] std::string fmt(const char *f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

inline bool dtype_is(DLDataType t, uint8_t code, uint8_t bits) {
  return t.code == code && t.bits == bits && t.lanes == 1;
}

// Calls fn(writer) with the writer for args->compute_params, so the kernels
// are instantiated once per output type and hold no branch on the dtype.
template <typename Fn>
void with_compute_copy(const tsr_optimizer_step_args *args, const char *who, Fn &&fn) {
  if (!args->compute_params) return fn(NoCopy{});
  DLDataType t = args->compute_dtype;
  if (dtype_is(t, kDLFloat, 32)) return fn(CopyF32{static_cast<float *>(args->compute_params)});
  if (dtype_is(t, kDLBfloat, 16))
    return fn(CopyBF16{static_cast<uint16_t *>(args->compute_params)});
  if (dtype_is(t, kDLFloat, 16)) return fn(CopyF16{static_cast<uint16_t *>(args->compute_params)});
  throw sdk::Error(TSR_ERR_UNSUPPORTED,
                   fmt("%s: compute copy dtype (code %u, bits %u, lanes %u) is not supported; "
                       "use float32, bfloat16 or float16",
                       who, unsigned(t.code), unsigned(t.bits), unsigned(t.lanes)));
}

// Checks what every step needs before touching memory: the struct version,
// the device, non-null arrays, and segments inside [0, n).
void check_step_args(const tsr_optimizer_step_args *args, uint32_t state_count, const char *who) {
  if (!args || args->struct_size < sizeof(tsr_optimizer_step_args))
    throw sdk::Error(TSR_ERR_INVALID, fmt("%s: step args missing or from an older ABI", who));
  if (args->device.device_type != kDLCPU)
    throw sdk::Error(TSR_ERR_UNSUPPORTED,
                     fmt("%s: only the CPU step is implemented (device type %d given); run the "
                         "optimizer on CPU or use an offload plugin",
                         who, int(args->device.device_type)));
  if (args->step < 1)
    throw sdk::Error(TSR_ERR_INVALID,
                     fmt("%s: step must count from 1, got %lld", who, (long long)args->step));
  if (args->n == 0) return;
  if (!args->params || !args->grads)
    throw sdk::Error(TSR_ERR_INVALID, fmt("%s: params and grads must not be NULL", who));
  if (state_count > 0 && !args->state)
    throw sdk::Error(TSR_ERR_INVALID, fmt("%s: state arrays must not be NULL", who));
  for (uint32_t s = 0; s < state_count; ++s)
    if (!args->state[s])
      throw sdk::Error(TSR_ERR_INVALID, fmt("%s: state array %u is NULL", who, s));
  if (args->num_segments > 0 && !args->segments)
    throw sdk::Error(TSR_ERR_INVALID, fmt("%s: segments must not be NULL", who));
  for (size_t k = 0; k < args->num_segments; ++k) {
    const tsr_segment &s = args->segments[k];
    if (s.offset > args->n || s.count > args->n - s.offset)
      throw sdk::Error(TSR_ERR_INVALID,
                       fmt("%s: segment %zu [%zu, %zu + %zu) lies outside [0, %zu)", who, k,
                           s.offset, s.offset, s.count, args->n));
  }
}

// ---------------------------------------------------------------------------
// Kernel: one segment, pointers already offset to its first element.

// Per-step constants, computed once in double (like torch's Python floats)
// and rounded to float for the loop.
struct AdamConsts {
  float scale;   // grad_scale
  float l2;      // weight_decay added to the gradient (Adam), else 0
  float shrink;  // 1 - lr * weight_decay (AdamW), else 1
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2;  // in double first: 1 - 0.999f is off by 1e-5
  float step_size;                         // lr / (1 - beta1^t)
  float bc2_sqrt;                          // sqrt(1 - beta2^t)
  float eps;
};

template <typename Out>
void adam_segment(float *__restrict p, const float *__restrict g, float *__restrict m,
                  float *__restrict v, size_t n, AdamConsts k, Out out) {
  for (size_t i = 0; i < n; ++i) {
    float pi = p[i];
    float gi = g[i] * k.scale;
    if (k.l2 != 0.0f) gi += k.l2 * pi;  // as torch: no 0 * p term (inf/NaN params stay put)
    pi *= k.shrink;
    float mi = m[i] + k.one_minus_beta1 * (gi - m[i]);
    float vi = k.beta2 * v[i] + k.one_minus_beta2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    // torch divides sqrt(v) by sqrt(1 - beta2^t) before adding eps, so eps
    // is compared with the bias-corrected second moment; keep that order.
    float denom = std::sqrt(vi) / k.bc2_sqrt + k.eps;
    pi -= k.step_size * mi / denom;
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
    check_step_args(args, 2, s->name);
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
    with_compute_copy(args, s->name, [&](auto copy) {
      for (size_t k = 0; k < args->num_segments; ++k) {
        const tsr_segment &seg = args->segments[k];
        const size_t off = seg.offset;
        adam_segment(args->params + off, args->grads + off, args->state[0] + off,
                     args->state[1] + off, seg.count, seg.decay ? decayed : base, copy.rebase(off));
      }
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
    TSR_DEVICE_CPU,
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
    TSR_DEVICE_CPU,
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
