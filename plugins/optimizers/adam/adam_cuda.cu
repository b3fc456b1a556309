// adam / adamw on CUDA: one fused kernel per step over the whole partition
// (all tensors at once), reading fp32 / bf16 / fp16 gradients, updating the
// fp32 master and both moments in place and writing the compute copy in the
// same pass. The kernel itself (grid-stride, 4 elements per thread, 128-bit
// accesses, decay runs as a launch parameter) is common/step_cuda.cuh; the
// math is adam_update in adam.hpp, the same function the CPU step calls.
#include "adam.hpp"
#include "step_cuda.cuh"

namespace tessera::adam {

namespace {

// The per-element update as the kernel calls it: state arrays 0 and 1 are
// exp_avg and exp_avg_sq; segments with decay use the `decayed` constants.
struct AdamOp {
  AdamConsts base, decayed;
  __device__ __forceinline__ float operator()(float p, float g, float &m, float &v,
                                              bool decay) const {
    return adam_update(p, g, m, v, decay ? decayed : base);
  }
};

}  // namespace

void adam_step_cuda(const tsr_host *host, const tsr_optimizer_step_args *args,
                    const AdamConsts &base, const AdamConsts &decayed, const char *who) {
  optim_cuda::run_step(host, args, 2, AdamOp{base, decayed}, who);
}

}  // namespace tessera::adam
