#include "comm/local_comm.hpp"

#include <cstring>

#include "util/error.hpp"

namespace tessera {

namespace {

size_t bytes_of(const DLTensor *t) {
  size_t n = 1;
  for (int32_t i = 0; i < t->ndim; ++i) n *= static_cast<size_t>(t->shape[i]);
  return n * ((t->dtype.bits * t->dtype.lanes + 7) / 8);
}

tsr_status copy_through(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out, tsr_comm_work **work,
                        const char *op) {
  if (work) *work = nullptr;
  return guarded(ctx, [&] {
    TSR_CHECK(bytes_of(in) == bytes_of(out), TSR_ERR_INVALID,
              std::string(op) + ": input and output sizes differ for a world of one");
    if (in->data == out->data && in->byte_offset == out->byte_offset) return;
    char *dst = static_cast<char *>(out->data) + out->byte_offset;
    const char *src = static_cast<const char *>(in->data) + in->byte_offset;
#ifdef TESSERA_HAVE_CUDA
    // A CUDA run of one rank: device buffers, copied in compute-stream order.
    if (in->device.device_type == kDLCUDA || out->device.device_type == kDLCUDA) {
      copy_with_gpu(dst, src, bytes_of(in));
      return;
    }
#endif
    std::memmove(dst, src, bytes_of(in));
  });
}

}  // namespace

tsr_status LocalComm::all_reduce(tsr_host_ctx *, DLTensor *, tsr_reduce_op, tsr_comm_work **work) {
  if (work) *work = nullptr;
  return TSR_OK;  // the sum or mean over one rank is the tensor itself
}

tsr_status LocalComm::reduce_scatter(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out,
                                     tsr_reduce_op, tsr_comm_work **work) {
  return copy_through(ctx, in, out, work, "reduce_scatter");
}

tsr_status LocalComm::all_gather(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out,
                                 tsr_comm_work **work) {
  return copy_through(ctx, in, out, work, "all_gather");
}

tsr_status LocalComm::broadcast(tsr_host_ctx *, DLTensor *, uint32_t, tsr_comm_work **work) {
  if (work) *work = nullptr;
  return TSR_OK;
}

tsr_status LocalComm::barrier(tsr_host_ctx *) {
  return TSR_OK;
}

tsr_status LocalComm::wait(tsr_host_ctx *, tsr_comm_work *) {
  return TSR_OK;
}

Comm &local_comm() {
  static LocalComm comm;
  return comm;
}

}  // namespace tessera
