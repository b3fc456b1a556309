// adam, adamw: the AVX2 kernels (8 floats a vector), built with -mavx2
// -mf16c and run only where the CPU has both (adam.cpp). No FMA: the update
// rounds after every multiply and add, like the scalar loop.
#include <immintrin.h>

#include <cstdint>

#include "adam_cpu.hpp"
#include "adam_simd.hpp"

namespace {

using tessera::adam::simd::kGradBF16;
using tessera::adam::simd::kGradF16;
using tessera::adam::simd::kOutBF16;
using tessera::adam::simd::kOutF32;

struct Avx2 {
  using F = __m256;
  static constexpr size_t kWidth = 8;

  static F set1(float x) { return _mm256_set1_ps(x); }
  static F load(const float *p) { return _mm256_loadu_ps(p); }
  static void store(float *p, F x) { _mm256_storeu_ps(p, x); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }
  static void fence() { _mm_sfence(); }

  static __m256i i32(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }

  // Eight 32-bit lanes holding 16-bit values (or 0 / -1 masks) -> eight
  // 16-bit lanes. The pack works inside each 128-bit half, so the two
  // 64-bit groups that hold lanes 0-3 and 4-7 are gathered afterwards.
  static __m128i narrow(__m256i x) {
    const __m256i packed = _mm256_packs_epi32(x, x);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
  }
  static __m128i narrow_unsigned(__m256i x) {
    const __m256i packed = _mm256_packus_epi32(x, x);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
  }

  template <int G>
  static F grad(const void *g, size_t i) {
    if constexpr (G == kGradBF16) {
      // bf16 -> fp32 is exact: the 16 bits become the top half.
      const __m128i h = _mm_loadu_si128(static_cast<const __m128i *>(g) + i / 8);
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else if constexpr (G == kGradF16) {
      // Exact, subnormals included; a NaN keeps its payload and gets the
      // quiet bit, as f16_to_float does.
      return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i *>(g) + i / 8));
    } else {
      return _mm256_loadu_ps(static_cast<const float *>(g) + i);
    }
  }

  // float_to_bf16 on eight lanes: round to nearest even by adding
  // 0x7fff + the lowest kept bit; NaN -> its top half with the quiet bit.
  static __m128i to_bf16(F x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, i32(0x7fffffffu)), i32(0x7f800000u));
    const __m256i bias = _mm256_add_epi32(i32(0x7fffu), _mm256_and_si256(hi, i32(1)));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    const __m256i quiet = _mm256_or_si256(hi, i32(0x40u));
    return narrow_unsigned(_mm256_blendv_epi8(rounded, quiet, nan));
  }

  // float_to_f16 on eight lanes: F16C rounds to nearest even (overflow to
  // infinity, subnormals exact) like it; every NaN becomes the scalar
  // code's sign | 0x7e00 (F16C would keep payload bits).
  static __m128i to_f16(F x) {
    const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
    const __m256i u = _mm256_castps_si256(x);
    const __m256i quiet =
        _mm256_or_si256(_mm256_srli_epi32(_mm256_and_si256(u, i32(0x80000000u)), 16), i32(0x7e00u));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    return _mm_blendv_epi8(h, narrow_unsigned(quiet), narrow(nan));
  }

  template <int O, bool Stream>
  static void out(void *dst, size_t i, F x) {
    if constexpr (O == kOutF32) {
      float *o = static_cast<float *>(dst) + i;
      if constexpr (Stream)
        _mm256_stream_ps(o, x);
      else
        _mm256_storeu_ps(o, x);
    } else {
      __m128i h;
      if constexpr (O == kOutBF16)
        h = to_bf16(x);
      else
        h = to_f16(x);
      __m128i *o = static_cast<__m128i *>(dst) + i / 8;
      if constexpr (Stream)
        _mm_stream_si128(o, h);
      else
        _mm_storeu_si128(o, h);
    }
  }
};

static_assert(tessera::adam::kSimdBlock % Avx2::kWidth == 0);
constexpr tessera::adam::SimdKernels kAvx2 = tessera::adam::simd::table<Avx2>();

}  // namespace

const tessera::adam::SimdKernels *tessera::adam::avx2_kernels() {
  return &kAvx2;
}
