// Header-only helpers for optimizer plugins: argument checks shared by
// every step, and the low-precision compute copy (fp32 -> bf16 / fp16 with
// round-to-nearest-even) written in the same pass as the fp32 master.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>
#include <tessera/cpp/plugin.hpp>

namespace tessera::sdk::optim {

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
[[gnu::format(printf, 1, 2)]] inline std::string fmt(const char *f, ...) {
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
  throw Error(TSR_ERR_UNSUPPORTED,
              fmt("%s: compute copy dtype (code %u, bits %u, lanes %u) is not supported; "
                  "use float32, bfloat16 or float16",
                  who, unsigned(t.code), unsigned(t.bits), unsigned(t.lanes)));
}

// Checks what every step needs before touching memory: the struct version,
// the device, non-null arrays, and segments inside [0, n).
inline void check_step_args(const tsr_optimizer_step_args *args, uint32_t state_count,
                            const char *who) {
  if (!args || args->struct_size < sizeof(tsr_optimizer_step_args))
    throw Error(TSR_ERR_INVALID, fmt("%s: step args missing or from an older ABI", who));
  if (args->device.device_type != kDLCPU)
    throw Error(TSR_ERR_UNSUPPORTED,
                fmt("%s: only the CPU step is implemented (device type %d given); run the "
                    "optimizer on CPU or use an offload plugin",
                    who, int(args->device.device_type)));
  if (args->step < 1)
    throw Error(TSR_ERR_INVALID,
                fmt("%s: step must count from 1, got %lld", who, (long long)args->step));
  if (args->n == 0) return;
  if (!args->params || !args->grads)
    throw Error(TSR_ERR_INVALID, fmt("%s: params and grads must not be NULL", who));
  if (state_count > 0 && !args->state)
    throw Error(TSR_ERR_INVALID, fmt("%s: state arrays must not be NULL", who));
  for (uint32_t s = 0; s < state_count; ++s)
    if (!args->state[s]) throw Error(TSR_ERR_INVALID, fmt("%s: state array %u is NULL", who, s));
  if (args->num_segments > 0 && !args->segments)
    throw Error(TSR_ERR_INVALID, fmt("%s: segments must not be NULL", who));
  for (size_t k = 0; k < args->num_segments; ++k) {
    const tsr_segment &s = args->segments[k];
    if (s.offset > args->n || s.count > args->n - s.offset)
      throw Error(TSR_ERR_INVALID, fmt("%s: segment %zu [%zu, %zu + %zu) lies outside [0, %zu)",
                                       who, k, s.offset, s.offset, s.count, args->n));
  }
}

}  // namespace tessera::sdk::optim
