// sgd on CUDA: one fused kernel per step over the whole partition (all
// tensors at once), reading fp32 / bf16 / fp16 gradients, updating the fp32
// master and momentum buffer in place and writing the compute copy in the
// same pass. The kernel itself (grid-stride, 4 elements per thread, 128-bit
// accesses, decay runs as a launch parameter) is common/step_cuda.cuh; the
// math is sgd_update in sgd.hpp, the same function the CPU step calls.
#include "sgd.hpp"
#include "step_cuda.cuh"

namespace tessera::sgd {

namespace {

// The per-element update as the kernel calls it: state array 0 is the
// momentum buffer (absent without momentum), there is no array 1.
struct SgdOp {
  SgdStep k;
  __device__ __forceinline__ float operator()(float p, float g, float &buf, float &,
                                              bool decay) const {
    return sgd_update(p, g, buf, decay, k);
  }
};

}  // namespace

void sgd_step_cuda(const tsr_host *host, const tsr_optimizer_step_args *args, const SgdStep &k) {
  optim_cuda::run_step(host, args, k.has_momentum ? 1u : 0u, SgdOp{k}, "sgd");
}

}  // namespace tessera::sgd
