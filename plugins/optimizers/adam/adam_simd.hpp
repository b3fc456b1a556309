// adam, adamw: the body of the vector CPU kernels, written once over an
// instruction set's operations V (adam_avx2.cpp, adam_avx512.cpp define V
// in their anonymous namespace, so every instance of these templates is
// internal to its file and built for that file's instruction set only).
//
// The update is adam_update (adam.hpp) on V::kWidth lanes at a time, the
// same operations in the same order:
//   g = grad * scale; g = g + l2 * p (l2 != 0 only); p = p * shrink
//   m = m + (1 - beta1) * (g - m); v = beta2 * v + ((1 - beta2) * g) * g
//   p = p - (step_size * m) / (sqrt(v) / bc2_sqrt + eps)
// What V provides: F (the float vector), kWidth, set1, load, store, add,
// sub, mul, div, sqrt (all IEEE, rounded once each), grad<G>(ptr, i)
// (gradient type G widened exactly, as the SDK's readers), out<O, Stream>
// (ptr, i, x) (x rounded to compute-copy type O, as the SDK's writers), and
// fence() (orders the non-temporal stores before the step returns).
#pragma once

#include <cstddef>

#include "adam_cpu.hpp"

namespace tessera::adam::simd {

// Gradient types G and compute-copy types O, numbered as the table slots of
// SimdKernels.
constexpr int kGradF32 = 0, kGradBF16 = 1, kGradF16 = 2;
constexpr int kOutNone = 0, kOutF32 = 1, kOutBF16 = 2, kOutF16 = 3;

// L2 (weight decay added to the gradient) and Stream (non-temporal stores of
// the compute copy) are template arguments so the loop holds no branch.
template <class V, int G, int O, bool L2, bool Stream>
void loop(float *__restrict p, const void *grads, float *__restrict m, float *__restrict v,
          size_t n, const AdamConsts &k, void *out) {
  using F = typename V::F;
  const F scale = V::set1(k.scale), l2 = V::set1(k.l2), shrink = V::set1(k.shrink);
  const F beta2 = V::set1(k.beta2), omb1 = V::set1(k.one_minus_beta1);
  const F omb2 = V::set1(k.one_minus_beta2), step = V::set1(k.step_size);
  const F bc2 = V::set1(k.bc2_sqrt), eps = V::set1(k.eps);
  for (size_t i = 0; i < n; i += V::kWidth) {
    F pi = V::load(p + i);
    F g = V::mul(V::template grad<G>(grads, i), scale);
    if constexpr (L2) g = V::add(g, V::mul(l2, pi));
    pi = V::mul(pi, shrink);
    F mi = V::load(m + i);
    F vi = V::load(v + i);
    mi = V::add(mi, V::mul(omb1, V::sub(g, mi)));
    vi = V::add(V::mul(beta2, vi), V::mul(V::mul(omb2, g), g));
    const F denom = V::add(V::div(V::sqrt(vi), bc2), eps);
    pi = V::sub(pi, V::div(V::mul(step, mi), denom));
    V::store(m + i, mi);
    V::store(v + i, vi);
    V::store(p + i, pi);
    if constexpr (O != kOutNone) V::template out<O, Stream>(out, i, pi);
  }
}

template <class V, int G, int O>
void kernel(float *p, const void *grads, float *m, float *v, size_t n, const AdamConsts &k,
            void *out, bool stream) {
  // The same test as adam_update's: no l2 * p term at all without decay.
  const bool l2 = k.l2 != 0.0f;
  if (O != kOutNone && stream) {
    if (l2)
      loop<V, G, O, true, true>(p, grads, m, v, n, k, out);
    else
      loop<V, G, O, false, true>(p, grads, m, v, n, k, out);
    V::fence();
  } else if (l2) {
    loop<V, G, O, true, false>(p, grads, m, v, n, k, out);
  } else {
    loop<V, G, O, false, false>(p, grads, m, v, n, k, out);
  }
}

template <class V>
constexpr SimdKernels table() {
  return SimdKernels{{
      {kernel<V, kGradF32, kOutNone>, kernel<V, kGradF32, kOutF32>, kernel<V, kGradF32, kOutBF16>,
       kernel<V, kGradF32, kOutF16>},
      {kernel<V, kGradBF16, kOutNone>, kernel<V, kGradBF16, kOutF32>,
       kernel<V, kGradBF16, kOutBF16>, kernel<V, kGradBF16, kOutF16>},
      {kernel<V, kGradF16, kOutNone>, kernel<V, kGradF16, kOutF32>, kernel<V, kGradF16, kOutBF16>,
       kernel<V, kGradF16, kOutF16>},
  }};
}

}  // namespace tessera::adam::simd
