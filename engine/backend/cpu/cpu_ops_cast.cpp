// CPU ops, cast: float32 <-> bfloat16 <-> float16, any pair. The one CPU op
// that computes on dtypes other than float32, so the conversions are written
// out here bit by bit rather than left to compiler extensions (_Float16,
// __bf16) whose availability and rounding vary by compiler and target.
//
// Every conversion goes through float32: widening bfloat16 or float16 to
// float32 is exact, so bf16 -> f16 and f16 -> bf16 round once, like a direct
// conversion would. Narrowing rounds to nearest, ties to even; overflow goes
// to infinity; NaN stays NaN (quieted, sign and the top payload bits kept).
#include <cstring>

#include "backend/cpu/cpu_ops_internal.hpp"
#include "util/error.hpp"

namespace tessera::cpu {

static inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

static inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ---------------------------------------------------------------------------
// bfloat16: the top half of a float32.

static inline float bf16_to_f32(uint16_t h) {
  return float_of(static_cast<uint32_t>(h) << 16);
}

static inline uint16_t f32_to_bf16(float f) {
  const uint32_t u = bits_of(f);
  // NaN: truncating could clear every payload bit left and make infinity, so
  // set the quiet bit instead of rounding.
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Round to nearest even on the 16 dropped bits: add just under half, plus
  // one more when the kept part is odd, so an exact half rounds to even. A
  // carry out of the mantissa bumps the exponent, which is the right answer
  // (the largest floats round up to infinity).
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

// ---------------------------------------------------------------------------
// float16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. Largest finite
// 65504, smallest normal 2^-14, smallest subnormal 2^-24.

static inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return float_of(sign | 0x7f800000u | (mant << 13));  // inf, NaN (payload kept)
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float32 (mant < 2^10 and
    // the result, if not zero, is a float32 normal).
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return float_of(sign | bits_of(v));
  }
  // Normal: rebias the exponent from 15 to 127.
  return float_of(sign | ((exp + 112u) << 23) | (mant << 13));
}

static inline uint16_t f32_to_f16(float f) {
  const uint32_t u = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;  // |f|
  if (a > 0x7f800000u)                 // NaN: quiet it, keep the top payload bits
    return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  // 65520 = 0x477ff000 is halfway between 65504 (mantissa 0x3ff, odd) and
  // 65536, so it and everything above (infinity too) rounds to infinity.
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a >= 0x38800000u) {
    // A float16 normal (|f| >= 2^-14): rebias the exponent from 127 to 15
    // in place, then round the 13 dropped mantissa bits to nearest even as
    // in f32_to_bf16. A mantissa carry bumps the exponent, as it should.
    const uint32_t rebased = a - (112u << 23);
    const uint32_t rounded = rebased + 0x0fffu + ((rebased >> 13) & 1u);
    return static_cast<uint16_t>(sign | (rounded >> 13));
  }
  // Subnormal result or zero: the answer is k * 2^-24 for an integer k in
  // [0, 1024] (1024 encodes 2^-14, the smallest normal, which is what
  // rounding up from just below it should give).
  const uint32_t exp = a >> 23;
  // |f| < 2^-25 is under half the smallest subnormal: zero. (2^-25 itself
  // is the tie between 0 and 2^-24 and goes to even, 0, in the branch below.)
  if (exp < 102) return sign;
  // |f| = m * 2^(exp - 150) with the implicit bit restored in m, i.e.
  // m * 2^(exp - 126) units of 2^-24; exp in [102, 112] makes the shift 14..24.
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exp;
  uint32_t k = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (k & 1u))) k++;
  return static_cast<uint16_t>(sign | k);
}

// ---------------------------------------------------------------------------
// The op

namespace {

enum class Kind { F32, BF16, F16 };

Kind kind_of(const char *arg, const DLTensor *t, DLDataType d) {
  if (d.lanes == 1 && d.code == kDLFloat && d.bits == 32) return Kind::F32;
  if (d.lanes == 1 && d.code == kDLBfloat && d.bits == 16) return Kind::BF16;
  if (d.lanes == 1 && d.code == kDLFloat && d.bits == 16) return Kind::F16;
  throw Error(TSR_ERR_UNSUPPORTED, std::string("cast: ") + arg +
                                       " must be float32, bfloat16 or float16, got " + describe(t));
}

// Per-dtype load to float32 and store from float32; cast is one loop of
// store(load(x)). The loops are simple enough for the compiler to inline the
// conversions and, on the widening side, vectorize them.
struct F32 {
  using T = float;
  static float load(float v) { return v; }
  static float store(float v) { return v; }
};
struct BF16 {
  using T = uint16_t;
  static float load(uint16_t v) { return bf16_to_f32(v); }
  static uint16_t store(float v) { return f32_to_bf16(v); }
};
struct F16 {
  using T = uint16_t;
  static float load(uint16_t v) { return f16_to_f32(v); }
  static uint16_t store(float v) { return f32_to_f16(v); }
};

template <typename From, typename To>
void convert(const void *x, void *y, int64_t n) {
  const auto *xp = static_cast<const typename From::T *>(x);
  auto *yp = static_cast<typename To::T *>(y);
  for (int64_t i = 0; i < n; i++) yp[i] = To::store(From::load(xp[i]));
}

template <typename From>
void convert_to(Kind to, const void *x, void *y, int64_t n) {
  switch (to) {
    case Kind::F32:
      convert<From, F32>(x, y, n);
      break;
    case Kind::BF16:
      convert<From, BF16>(x, y, n);
      break;
    case Kind::F16:
      convert<From, F16>(x, y, n);
      break;
  }
}

}  // namespace

tsr_status cast(tsr_host_ctx *ctx, const DLTensor *x, DLTensor *y) noexcept {
  return guarded(ctx, [&] {
    const Flat X = flat("cast", "x", x), Y = flat("cast", "y", y);
    const Kind from = kind_of("x", x, X.dtype), to = kind_of("y", y, Y.dtype);
    TSR_CHECK(X.numel == Y.numel, TSR_ERR_INVALID,
              "cast: x " + describe(x) + " and y " + describe(y) + " differ in element count (" +
                  std::to_string(X.numel) + " vs " + std::to_string(Y.numel) + ")");
    if (X.numel == 0) return;
    if (from == to) {
      // Same dtype: a copy (memmove, so x and y may even overlap).
      if (X.p != Y.p) std::memmove(Y.p, X.p, X.elem_bytes * X.numel);
      return;
    }
    // Elements of different sizes would be read after being overwritten.
    const auto x0 = reinterpret_cast<uintptr_t>(X.p), y0 = reinterpret_cast<uintptr_t>(Y.p);
    const auto x1 = x0 + X.elem_bytes * X.numel, y1 = y0 + Y.elem_bytes * Y.numel;
    TSR_CHECK(!(x0 < y1 && y0 < x1), TSR_ERR_INVALID,
              "cast: x " + describe(x) + " and y " + describe(y) +
                  " overlap in memory (only a same-dtype cast may be done in place)");
    switch (from) {
      case Kind::F32:
        convert_to<F32>(to, X.p, Y.p, X.numel);
        break;
      case Kind::BF16:
        convert_to<BF16>(to, X.p, Y.p, X.numel);
        break;
      case Kind::F16:
        convert_to<F16>(to, X.p, Y.p, X.numel);
        break;
    }
  });
}

}  // namespace tessera::cpu
