// The engine's collectives behind one interface: a world of one
// (LocalComm), Gloo and shared memory across CPU ranks (GlooComm), and, in
// CUDA runs, the router that sends GPU tensors to NCCL and host tensors to
// Gloo (CudaComm). A Comm knows nothing of the Host: host/comm_table.cpp is
// the one adapter from the ABI's tsr_comm table to the Comm the run holds.
//
// The operations are the ABI's (tessera/host.h says what each does); `ctx`
// is only where an error is reported (a plugin's call reports through its
// own ctx; the engine's own calls may pass nullptr). Asynchronous ones hand
// back a work item for wait(), or nullptr when they ran to completion.
#pragma once

#include <tessera/host.h>

namespace tessera {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual tsr_status all_reduce(tsr_host_ctx *ctx, DLTensor *t, tsr_reduce_op op,
                                tsr_comm_work **work) = 0;
  virtual tsr_status reduce_scatter(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out,
                                    tsr_reduce_op op, tsr_comm_work **work) = 0;
  virtual tsr_status all_gather(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out,
                                tsr_comm_work **work) = 0;
  virtual tsr_status broadcast(tsr_host_ctx *ctx, DLTensor *t, uint32_t root,
                               tsr_comm_work **work) = 0;
  virtual tsr_status barrier(tsr_host_ctx *ctx) = 0;
  virtual tsr_status wait(tsr_host_ctx *ctx, tsr_comm_work *work) = 0;
};

}  // namespace tessera
