// The collectives of a world of one process: every collective is a copy or
// a no-op. The run's Comm when no other is set (host/comm_table.cpp).
#pragma once

#include <cstddef>

#include "comm/comm.hpp"

namespace tessera {

class LocalComm final : public Comm {
 public:
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
};

// The one LocalComm (it holds no state).
Comm &local_comm();

#ifdef TESSERA_HAVE_CUDA
// Copies `bytes` from src to dst where either may be GPU memory, in the
// compute stream's order: a CUDA run of one rank. It lives with the CUDA
// collectives (comm/cuda_comm.cpp, built only with the toolkit), so this
// world of one, built everywhere, needs none of the device runtime.
void copy_with_gpu(void *dst, const void *src, size_t bytes);
#endif

}  // namespace tessera
