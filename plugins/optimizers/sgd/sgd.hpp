// sgd: what the CPU step (sgd.cpp) and the CUDA step (sgd_cuda.cu) share:
// the per-step constants and the update of one element. Both devices call
// sgd_update, so they compute the same operations in the same order; with
// IEEE division and no contraction into FMA on either side (see
// CMakeLists.txt), the CUDA step is bit-identical to the CPU step.
#pragma once

#include <tessera/optimizer.h>

#include "host_device.hpp"

namespace tessera::sgd {

// Per-step constants, rounded once from the double config and args.
struct SgdStep {
  float lr;            // this step's learning rate
  float scale;         // grad_scale
  float weight_decay;  // L2 added to the gradient in decaying segments
  float momentum;
  float keep;  // 1 - dampening
  bool has_momentum;
  bool nesterov;
  bool first;  // step 1: torch clones the gradient into the buffer
};

// The update for one element, in torch.optim.SGD's order:
//   g   = grad * grad_scale + weight_decay * p        (decay only where the segment says so)
//   buf = g                                           (step 1: a copy, no dampening)
//   buf = momentum * buf + (1 - dampening) * g        (later steps)
//   d   = nesterov ? g + momentum * buf : buf         (d = g when momentum == 0)
//   p   = p - lr * d
// Returns the new p; `buf` is read and written only with momentum.
TSR_HD float sgd_update(float p, float grad, float &buf, bool decay, const SgdStep &k) {
  float g = grad * k.scale;
  const float wd = decay ? k.weight_decay : 0.0f;
  if (wd != 0.0f) g += wd * p;  // as torch: no 0 * p term (inf/NaN params stay put)
  if (!k.has_momentum) return p - k.lr * g;
  // Step 1 ignores whatever the buffer held (torch clones g into it).
  const float b = k.first ? g : k.momentum * buf + k.keep * g;
  buf = b;
  const float d = k.nesterov ? g + k.momentum * b : b;
  return p - k.lr * d;
}

#if TSR_PLUGIN_CUDA
// The CUDA step (sgd_cuda.cu): one kernel launch over all args->n elements
// on args->stream, or the host's compute stream when that is NULL. Throws
// sdk::Error. Arguments already passed check_step_args.
void sgd_step_cuda(const tsr_host *host, const tsr_optimizer_step_args *args, const SgdStep &k);
#endif

}  // namespace tessera::sgd
