// exp and tanh for the CPU ops' hot loops, written without branches or
// library calls so that a loop over them vectorizes: glibc's expf and tanhf
// are scalar calls, and in the GPT-2 step they took a fifth of the time
// (GELU forward and backward, softmax, attention). Accuracy: a few ulp,
// well inside what the ops promise (their tests compare against double and
// against PyTorch at 1e-5 relative).
#pragma once

#include <cstdint>
#include <cstring>

// Hot loops are compiled three times (AVX-512, AVX2, baseline) and the
// widest the processor supports is picked when the library loads. None of
// the clones may fuse a multiply and an add (the ops' files build with
// -ffp-contract=off), so every clone rounds exactly like the baseline and
// results do not depend on the machine.
// Not under TSan: the clones' resolvers run while the dynamic loader
// relocates the binary, before TSan's runtime is up, and its
// instrumentation of them crashes at start.
#if defined(__SANITIZE_THREAD__)
#define TSR_OPS_CLONES
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TSR_OPS_CLONES
#endif
#endif
#ifndef TSR_OPS_CLONES
#define TSR_OPS_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

namespace tessera::cpu {

inline float bits_to_float(int32_t i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}
inline int32_t float_to_bits(float f) {
  int32_t i;
  std::memcpy(&i, &f, sizeof i);
  return i;
}

// e^x, Cephes' method: x = n ln2 + r with |r| <= ln2 / 2, e^r by a degree-6
// polynomial, 2^n put into the exponent bits. x is clamped to
// [-87.3, 88.3] (e^x is then 1.2e-38 to 2.2e38: no subnormals, no inf),
// so callers that need exp(-inf) = 0 exactly must not rely on this (the
// softmaxes here never evaluate masked entries). NaN in gives NaN out.
inline float exp_v(float x) {
  const float hi = 88.3762626647949f, lo = -87.3365447504f;
  x = x > hi ? hi : x;
  x = x < lo ? lo : x;
  // n = round(x / ln2) by the 1.5 * 2^23 shift: adding it leaves the
  // rounded integer in the low mantissa bits.
  const float shift = 12582912.0f;
  const float t = x * 1.44269504088896341f + shift;
  const float n = t - shift;
  const int32_t ni = float_to_bits(t) - float_to_bits(shift);
  // r = x - n ln2, with ln2 split so that n * ln2_hi is exact.
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = (p * r) * r + r + 1.0f;
  return er * bits_to_float((ni + 127) << 23);
}

// The largest of x[0..n) (-inf when n = 0): sixteen lanes, lane k taking
// the elements j = k mod 16 of the whole chunks, the tail in lane 0, then
// the lanes in order. A NaN never replaces a number. Written with a vector
// type because GCC does not vectorize a float max reduction without
// -ffast-math (a plain loop ran one vmaxss per element).
inline float max_lanes16(const float *x, int64_t n) {
  typedef float F16 __attribute__((vector_size(64)));
  F16 m;
  for (int k = 0; k < 16; k++) m[k] = -__builtin_inff();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    F16 v;
    std::memcpy(&v, x + j, sizeof v);
    m = m < v ? v : m;
  }
  float mx = m[0];
  for (; j < n; j++) mx = x[j] > mx ? x[j] : mx;
  for (int k = 1; k < 16; k++) mx = m[k] > mx ? m[k] : mx;
  return mx;
}

// tanh(x). Near 0 the odd Taylor series (|x| < 0.3: the first term left
// out is below 2e-8 relative); elsewhere 1 - 2 / (e^2|x| + 1), with the
// sign put back. Both are computed and one selected, so there is no branch.
inline float tanh_v(float x) {
  const float a = x < 0.0f ? -x : x;
  const float a2 = a * a;
  // x - x^3/3 + 2x^5/15 - 17x^7/315 + 62x^9/2835
  float s = 62.0f / 2835.0f;
  s = s * a2 - 17.0f / 315.0f;
  s = s * a2 + 2.0f / 15.0f;
  s = s * a2 - 1.0f / 3.0f;
  const float small = a + a * a2 * s;
  // exp_v clamps, so a huge |x| gives 1 - 2 / 2.2e38 = 1 with no inf.
  const float large = 1.0f - 2.0f / (exp_v(2.0f * a) + 1.0f);
  const float t = a < 0.3f ? small : large;
  return x < 0.0f ? -t : t;
}

}  // namespace tessera::cpu
