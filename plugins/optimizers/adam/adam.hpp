// adam, adamw: what the CPU step (adam.cpp) and the CUDA step
// (adam_cuda.cu) share: the per-step constants and the update of one
// element. Both devices call adam_update, so they compute the same
// operations in the same order; with IEEE division and square root and no
// contraction into FMA on either side (see CMakeLists.txt), the CUDA step is
// bit-identical to the CPU step.
#pragma once

#include <math.h>
#include <tessera/optimizer.h>

#include "host_device.hpp"

namespace tessera::adam {

// Per-step constants, computed once in double (like torch's Python floats)
// and rounded to float for the loop. A step has two sets: one for segments
// with weight decay and one (l2 = 0, shrink = 1) for segments without.
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

// The vector CPU kernels (adam_simd.hpp) spell the same operations out on
// vectors, in the same order: a change here must be made there too
// (tests/unit/test_optimizers_simd.cpp compares their bits with this).
//
// The update for one element at step t (counting from 1), in torch's order:
//   g  = grad * grad_scale (+ weight_decay * p        when adamw = false)
//   p  = p * (1 - lr * weight_decay)                   when adamw = true
//   m  = m + (1 - beta1) * (g - m)                     (torch's lerp)
//   v  = beta2 * v + (1 - beta2) * g * g
//   p  = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// Returns the new p and updates m and v.
TSR_HD float adam_update(float p, float grad, float &m, float &v, const AdamConsts &k) {
  float g = grad * k.scale;
  if (k.l2 != 0.0f) g += k.l2 * p;  // as torch: no 0 * p term (inf/NaN params stay put)
  p *= k.shrink;
  const float mi = m + k.one_minus_beta1 * (g - m);
  const float vi = k.beta2 * v + k.one_minus_beta2 * g * g;
  m = mi;
  v = vi;
  // torch divides sqrt(v) by sqrt(1 - beta2^t) before adding eps, so eps
  // is compared with the bias-corrected second moment; keep that order.
  const float denom = sqrtf(vi) / k.bc2_sqrt + k.eps;
  return p - k.step_size * mi / denom;
}

#if TSR_PLUGIN_CUDA
// The CUDA step (adam_cuda.cu): one kernel launch over all args->n elements
// on args->stream, or the host's compute stream when that is NULL. `base`
// applies to segments without decay, `decayed` to those with. Throws
// sdk::Error. Arguments already passed check_step_args.
void adam_step_cuda(const tsr_host *host, const tsr_optimizer_step_args *args,
                    const AdamConsts &base, const AdamConsts &decayed, const char *who);
#endif

}  // namespace tessera::adam
