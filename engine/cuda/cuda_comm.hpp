// The collectives of a CUDA run: one tsr_comm table that sends tensors on
// the GPU (kDLCUDA) to NCCL and tensors in host memory (kDLCPU,
// kDLCUDAHost) to Gloo, which CUDA runs keep for small host-side values
// (loss sums, step counts, flags). Built only with the CUDA parts.
//
// The table's functions find this object through the host ctx: the
// host's RunFacts::comm_state must point at the CudaComm (DistContext's
// comm_state() gives it when DistOptions::cuda is set).
//
// Work items: NCCL's carry a tag in their lowest address bit (both kinds
// are heap objects, at least 8-byte aligned), so wait() knows where each
// came from. barrier() waits on both: NCCL first, then Gloo.
#pragma once

#include <tessera/host.h>

namespace tessera {

class GlooComm;
class NcclComm;

class CudaComm {
 public:
  // Either may be null when a run has only one kind of tensor to reduce;
  // a collective that needs the missing one fails with TSR_ERR_UNSUPPORTED.
  CudaComm(GlooComm *gloo, NcclComm *nccl) : gloo_(gloo), nccl_(nccl) {}

  static const tsr_comm *table();

  tsr_status all_reduce(tsr_host_ctx *ctx, DLTensor *t, tsr_reduce_op op, tsr_comm_work **work);
  tsr_status reduce_scatter(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out, tsr_reduce_op op,
                            tsr_comm_work **work);
  tsr_status all_gather(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out, tsr_comm_work **work);
  tsr_status broadcast(tsr_host_ctx *ctx, DLTensor *t, uint32_t root, tsr_comm_work **work);
  tsr_status barrier(tsr_host_ctx *ctx);
  tsr_status wait(tsr_host_ctx *ctx, tsr_comm_work *work);

  GlooComm *gloo() const { return gloo_; }
  NcclComm *nccl() const { return nccl_; }

 private:
  GlooComm *gloo_;
  NcclComm *nccl_;
};

}  // namespace tessera
