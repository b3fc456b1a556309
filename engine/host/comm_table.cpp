// The one adapter from the ABI's tsr_comm table to the engine's collectives:
// each entry finds the host behind the ctx and calls its Comm (the run's
// Gloo, NCCL or CUDA router, else the world of one). The Comm itself knows
// nothing of the Host (comm/comm.hpp).
#include "comm/comm.hpp"
#include "comm/local_comm.hpp"
#include "host/host.hpp"
#include "util/error.hpp"

namespace tessera {

Comm &Host::comm() const {
  return facts_.comm ? *facts_.comm : local_comm();
}

namespace {

// A ctx without a host (a plugin's stray call) still gets an answer.
Comm &comm_of(tsr_host_ctx *ctx) {
  Host *h = host_from_ctx(ctx);
  return h ? h->comm() : local_comm();
}

tsr_status t_all_reduce(tsr_host_ctx *ctx, DLTensor *t, tsr_reduce_op op, tsr_comm_work **work) {
  return comm_of(ctx).all_reduce(ctx, t, op, work);
}
tsr_status t_reduce_scatter(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out, tsr_reduce_op op,
                            tsr_comm_work **work) {
  return comm_of(ctx).reduce_scatter(ctx, in, out, op, work);
}
tsr_status t_all_gather(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out,
                        tsr_comm_work **work) {
  return comm_of(ctx).all_gather(ctx, in, out, work);
}
tsr_status t_broadcast(tsr_host_ctx *ctx, DLTensor *t, uint32_t root, tsr_comm_work **work) {
  return comm_of(ctx).broadcast(ctx, t, root, work);
}
tsr_status t_barrier(tsr_host_ctx *ctx) {
  return comm_of(ctx).barrier(ctx);
}
tsr_status t_wait(tsr_host_ctx *ctx, tsr_comm_work *work) {
  return comm_of(ctx).wait(ctx, work);
}

const tsr_comm kTable = {tsr_comm_STRUCT_SIZE,
                         t_all_reduce,
                         t_reduce_scatter,
                         t_all_gather,
                         t_broadcast,
                         t_barrier,
                         t_wait};

}  // namespace

const tsr_comm *host_comm_table() {
  return &kTable;
}

}  // namespace tessera
