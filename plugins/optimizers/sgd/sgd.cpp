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
#include <tessera/cpp/plugin.hpp>

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
