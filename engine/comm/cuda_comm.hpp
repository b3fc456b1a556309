// The collectives of a CUDA run: a Comm that sends tensors on the GPU
// (kDLCUDA) to NCCL and tensors in host memory (kDLCPU, kDLCUDAHost) to
// Gloo, which CUDA runs keep for small host-side values (loss sums, step
// counts, flags). Built only with the CUDA parts; DistContext::comm() gives
// it when DistOptions::cuda is set.
//
// Work items: NCCL's carry a tag in their lowest address bit (both kinds
// are heap objects, at least 8-byte aligned), so wait() knows where each
// came from. barrier() waits on both: NCCL first, then Gloo.
#pragma once

#include "comm/comm.hpp"

namespace tessera {

class GlooComm;
class NcclComm;

class CudaComm final : public Comm {
 public:
  // Either may be null when a run has only one kind of tensor to reduce;
  // a collective that needs the missing one fails with TSR_ERR_UNSUPPORTED.
  CudaComm(GlooComm *gloo, NcclComm *nccl) : gloo_(gloo), nccl_(nccl) {}

  tsr_status all_reduce(tsr_host_ctx *ctx, DLTensor *t, tsr_reduce_op op,
                        tsr_comm_work **work) override;
  tsr_status reduce_scatter(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out, tsr_reduce_op op,
                            tsr_comm_work **work) override;
  tsr_status all_gather(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out,
                        tsr_comm_work **work) override;
  tsr_status broadcast(tsr_host_ctx *ctx, DLTensor *t, uint32_t root,
                       tsr_comm_work **work) override;
  tsr_status barrier(tsr_host_ctx *ctx) override;
  tsr_status wait(tsr_host_ctx *ctx, tsr_comm_work *work) override;

  GlooComm *gloo() const { return gloo_; }
  NcclComm *nccl() const { return nccl_; }

 private:
  GlooComm *gloo_;
  NcclComm *nccl_;
};

}  // namespace tessera
