#include "comm/cuda_comm.hpp"

#include <cstdint>
#include <string>

#include "backend/cuda/device.hpp"
#include "comm/gloo_comm.hpp"
#include "comm/local_comm.hpp"
#include "comm/nccl_comm.hpp"
#include "util/error.hpp"

namespace tessera {

namespace {

constexpr uintptr_t kNcclTag = 1;

tsr_comm_work *tag_nccl(tsr_comm_work *w) {
  return w ? reinterpret_cast<tsr_comm_work *>(reinterpret_cast<uintptr_t>(w) | kNcclTag) : nullptr;
}

bool on_gpu(const DLTensor *t) {
  return t && t->device.device_type == kDLCUDA;
}

tsr_status missing(tsr_host_ctx *ctx, const char *op, const char *what) {
  return report_error(ctx, TSR_ERR_UNSUPPORTED,
                      std::string(op) + ": this run has no " + what + " communicator");
}

}  // namespace

void copy_with_gpu(void *dst, const void *src, size_t bytes) {
  TSR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda::compute_stream()));
}

tsr_status CudaComm::all_reduce(tsr_host_ctx *ctx, DLTensor *t, tsr_reduce_op op,
                                tsr_comm_work **work) {
  if (work) *work = nullptr;
  if (on_gpu(t)) {
    if (!nccl_) return missing(ctx, "all_reduce", "NCCL");
    tsr_status s = nccl_->all_reduce(ctx, t, op, work);
    if (work) *work = tag_nccl(*work);
    return s;
  }
  return gloo_ ? gloo_->all_reduce(ctx, t, op, work) : missing(ctx, "all_reduce", "Gloo");
}

tsr_status CudaComm::reduce_scatter(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out,
                                    tsr_reduce_op op, tsr_comm_work **work) {
  if (work) *work = nullptr;
  if (on_gpu(in) != on_gpu(out))
    return report_error(ctx, TSR_ERR_INVALID,
                        "reduce_scatter: input and output must both be on the GPU or both in "
                        "host memory");
  if (on_gpu(in)) {
    if (!nccl_) return missing(ctx, "reduce_scatter", "NCCL");
    tsr_status s = nccl_->reduce_scatter(ctx, in, out, op, work);
    if (work) *work = tag_nccl(*work);
    return s;
  }
  return gloo_ ? gloo_->reduce_scatter(ctx, in, out, op, work)
               : missing(ctx, "reduce_scatter", "Gloo");
}

tsr_status CudaComm::all_gather(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out,
                                tsr_comm_work **work) {
  if (work) *work = nullptr;
  if (on_gpu(in) != on_gpu(out))
    return report_error(ctx, TSR_ERR_INVALID,
                        "all_gather: input and output must both be on the GPU or both in host "
                        "memory");
  if (on_gpu(in)) {
    if (!nccl_) return missing(ctx, "all_gather", "NCCL");
    tsr_status s = nccl_->all_gather(ctx, in, out, work);
    if (work) *work = tag_nccl(*work);
    return s;
  }
  return gloo_ ? gloo_->all_gather(ctx, in, out, work) : missing(ctx, "all_gather", "Gloo");
}

tsr_status CudaComm::broadcast(tsr_host_ctx *ctx, DLTensor *t, uint32_t root,
                               tsr_comm_work **work) {
  if (work) *work = nullptr;
  if (on_gpu(t)) {
    if (!nccl_) return missing(ctx, "broadcast", "NCCL");
    tsr_status s = nccl_->broadcast(ctx, t, root, work);
    if (work) *work = tag_nccl(*work);
    return s;
  }
  return gloo_ ? gloo_->broadcast(ctx, t, root, work) : missing(ctx, "broadcast", "Gloo");
}

tsr_status CudaComm::barrier(tsr_host_ctx *ctx) {
  if (nccl_) {
    tsr_status s = nccl_->barrier(ctx);
    if (s != TSR_OK) return s;
  }
  return gloo_ ? gloo_->barrier(ctx) : TSR_OK;
}

tsr_status CudaComm::wait(tsr_host_ctx *ctx, tsr_comm_work *work) {
  if (!work) return TSR_OK;
  const auto bits = reinterpret_cast<uintptr_t>(work);
  if (bits & kNcclTag) {
    auto *w = reinterpret_cast<tsr_comm_work *>(bits & ~kNcclTag);
    return nccl_ ? nccl_->wait(ctx, w) : missing(ctx, "wait", "NCCL");
  }
  return gloo_ ? gloo_->wait(ctx, work) : missing(ctx, "wait", "Gloo");
}

}  // namespace tessera
