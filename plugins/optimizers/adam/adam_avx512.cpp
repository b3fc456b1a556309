// adam, adamw: the AVX-512 kernels (16 floats a vector), built with
// -mavx512f and run only where the CPU (and the OS, for the register state)
// has AVX-512F (adam.cpp). No FMA: the update rounds after every multiply
// and add, like the scalar loop.
// GCC 12's AVX-512 intrinsics seed their unused pass-through operand with a
// self-initialised variable, which -Wmaybe-uninitialized then reports
// wherever they are inlined (GCC bug 105593, fixed in 12.3 and 13); the
// warning is located in the header, so silencing it there is enough.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif

#include <cstdint>

#include "adam_cpu.hpp"
#include "adam_simd.hpp"

namespace {

using tessera::adam::simd::kGradBF16;
using tessera::adam::simd::kGradF16;
using tessera::adam::simd::kOutBF16;
using tessera::adam::simd::kOutF32;

struct Avx512 {
  using F = __m512;
  static constexpr size_t kWidth = 16;

  static F set1(float x) { return _mm512_set1_ps(x); }
  static F load(const float *p) { return _mm512_loadu_ps(p); }
  static void store(float *p, F x) { _mm512_storeu_ps(p, x); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }
  static void fence() { _mm_sfence(); }

  static __m512i i32(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }

  template <int G>
  static F grad(const void *g, size_t i) {
    if constexpr (G == kGradBF16) {
      // bf16 -> fp32 is exact: the 16 bits become the top half.
      const __m256i h = _mm256_loadu_si256(static_cast<const __m256i *>(g) + i / 16);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else if constexpr (G == kGradF16) {
      // Exact, subnormals included; a NaN keeps its payload and gets the
      // quiet bit, as f16_to_float does.
      return _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i *>(g) + i / 16));
    } else {
      return _mm512_loadu_ps(static_cast<const float *>(g) + i);
    }
  }

  // float_to_bf16 on sixteen lanes: round to nearest even by adding
  // 0x7fff + the lowest kept bit; NaN -> its top half with the quiet bit.
  static __m256i to_bf16(F x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, i32(0x7fffffffu)), i32(0x7f800000u));
    const __m512i bias = _mm512_add_epi32(i32(0x7fffu), _mm512_and_si512(hi, i32(1)));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    const __m512i quiet = _mm512_or_si512(hi, i32(0x40u));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
  }

  // float_to_f16 on sixteen lanes: the conversion instruction rounds to
  // nearest even (overflow to infinity, subnormals exact) like it; every NaN
  // becomes the scalar code's sign | 0x7e00 (the instruction would keep
  // payload bits).
  static __m256i to_f16(F x) {
    const __m512i h = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    const __m512i u = _mm512_castps_si512(x);
    const __m512i quiet =
        _mm512_or_si512(_mm512_srli_epi32(_mm512_and_si512(u, i32(0x80000000u)), 16), i32(0x7e00u));
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, h, quiet));
  }

  template <int O, bool Stream>
  static void out(void *dst, size_t i, F x) {
    if constexpr (O == kOutF32) {
      float *o = static_cast<float *>(dst) + i;
      if constexpr (Stream)
        _mm512_stream_ps(o, x);
      else
        _mm512_storeu_ps(o, x);
    } else {
      __m256i h;
      if constexpr (O == kOutBF16)
        h = to_bf16(x);
      else
        h = to_f16(x);
      __m256i *o = static_cast<__m256i *>(dst) + i / 16;
      if constexpr (Stream)
        _mm256_stream_si256(o, h);
      else
        _mm256_storeu_si256(o, h);
    }
  }
};

static_assert(tessera::adam::kSimdBlock % Avx512::kWidth == 0);
constexpr tessera::adam::SimdKernels kAvx512 = tessera::adam::simd::table<Avx512>();

}  // namespace

const tessera::adam::SimdKernels *tessera::adam::avx512_kernels() {
  return &kAvx512;
}
