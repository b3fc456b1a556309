// fp32 <-> bf16 / fp16 conversions on bit patterns (uint16_t), for plugins
// and the engine alike: round to nearest even on the way down, exact on the
// way up, NaNs kept NaN. Header-only, no dependency but the C library.
#pragma once

#include <cstdint>
#include <cstring>

namespace tessera::sdk {

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

// bf16 -> fp32, exact: a bf16 is the top half of a float.
inline float bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// fp16 -> fp32, exact (every fp16 value is a float), subnormals, infinities
// and NaN (payload kept, quiet bit set) included.
inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0u);
  } else if (exp != 0) {
    u = sign | ((exp + (127u - 15u)) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;
  } else {
    // Subnormal: shift the mantissa up until its leading 1 is the implicit
    // bit, lowering the exponent once per shift.
    uint32_t e = 127u - 15u + 1u;
    while (!(mant & 0x400u)) {
      mant <<= 1;
      --e;
    }
    u = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

}  // namespace tessera::sdk
