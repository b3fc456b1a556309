// Collectives across GPU ranks on NCCL, behind the ABI's tsr_comm table
// (through CudaComm, which sends host tensors to Gloo). Built only with the
// CUDA parts (TESSERA_HAVE_CUDA).
//
// Stream and event ordering. Three streams of engine/backend/cuda/device.hpp take
// part: compute (every op), comm (every collective) and the host thread.
// A collective issued by the host thread:
//
//   compute: ──[ops that wrote the input]──●ready ........ ◆wait(done)──[ops that read the output]
//                                          │                ▲
//   comm:    ..........(waits on ready)────┴─[NCCL kernel]─●done
//
//   1. records `ready` on the compute stream: the input is final once all
//      work queued there so far has run;
//   2. makes the comm stream wait on `ready` (cudaStreamWaitEvent);
//   3. launches the NCCL kernel on the comm stream;
//   4. records the op's own `done` event on the comm stream.
// None of this blocks the host: the call returns at once and the compute
// stream carries on with independent work (backward of the next layer)
// while the collective runs. wait(work) makes the compute stream wait on
// `done` (cudaStreamWaitEvent, no host block), so ops queued after it see
// the result; a blocking call (work == NULL) does the same before it
// returns. The host sees results only after synchronize(), as with any op.
// Buffers of a collective must not be freed or rewritten by compute work
// queued before wait() (the caching allocator reuses in compute-stream
// order, and wait() is what orders the comm stream's use before it).
// Collectives run on the comm stream one after another, in issue order,
// identical on every rank (NCCL's rule: every rank issues the same
// collectives in the same order).
//
// No hangs. The communicator is non-blocking (config.blocking = 0), so its
// set-up and every collective can be aborted. A watchdog thread follows the
// collectives in flight (cudaEventQuery on their `done` events) and the NCCL
// communicator's asynchronous error; a monitor thread, which makes no CUDA
// call (a CUDA call can block behind another thread's blocking copy), keeps
// the deadlines and watches the store's abort key. When a
// collective has not completed within the timeout, NCCL reports an error,
// or another rank posted abort, it aborts the communicator (ncclCommAbort),
// posts the reason under the abort key ("rank R: [comm] NCCL all_reduce
// (collective #N) ...") unless a peer's is already there, logs it and ends
// the process: status 75 (kStoppedByPeerStatus) when a peer failed first or
// the collective timed out waiting for peers, 1 for an error of its own.
#pragma once

#include <nccl.h>
#include <tessera/host.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "backend/cuda/device.hpp"
#include "comm/store.hpp"

namespace tessera {

class NcclComm {
 public:
  // Joins the NCCL communicator of `world` ranks. The device must be
  // selected already (cuda::select_device). Rank 0 publishes the unique id
  // under prefix + "/nccl_id"; every rank then initialises within `timeout`
  // or throws Error(TSR_ERR_COMM) naming the ranks that never arrived.
  NcclComm(StoreClient &store, uint32_t rank, uint32_t world, std::chrono::seconds timeout,
           const std::string &prefix);
  // Waits for the collectives in flight (within the timeout), then
  // finalises and destroys the communicator; aborts it instead when that
  // does not complete.
  ~NcclComm();
  NcclComm(const NcclComm &) = delete;
  NcclComm &operator=(const NcclComm &) = delete;

  // The tsr_comm operations, for tensors on kDLCUDA (the selected device)
  // in float32, bfloat16, float16, float64, int32, int64, int8 or uint8.
  // `ctx` is only where errors are reported. A work item comes back from
  // NcclComm::wait only (see CudaComm for tagged handles).
  tsr_status all_reduce(tsr_host_ctx *ctx, DLTensor *t, tsr_reduce_op op, tsr_comm_work **work);
  tsr_status reduce_scatter(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out, tsr_reduce_op op,
                            tsr_comm_work **work);
  tsr_status all_gather(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out, tsr_comm_work **work);
  tsr_status broadcast(tsr_host_ctx *ctx, DLTensor *t, uint32_t root, tsr_comm_work **work);
  // Blocks the host until every rank has reached it and every collective
  // issued before it on this rank has completed.
  tsr_status barrier(tsr_host_ctx *ctx);
  tsr_status wait(tsr_host_ctx *ctx, tsr_comm_work *work);

  uint32_t rank() const { return rank_; }
  uint32_t world() const { return world_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Collectives issued so far (the sequence number of the last one).
  int64_t issued() const { return seq_.load(); }

 private:
  struct Op;
  // Queues one collective on the comm stream as described at the top.
  // `call` is empty for a collective of no elements (only the events then).
  std::shared_ptr<Op> launch(const char *name, int64_t bytes, tsr_comm_work **work,
                             const std::function<ncclResult_t(cudaStream_t)> &call);
  // Waits while a non-blocking NCCL call is still being carried out.
  ncclResult_t settle(ncclResult_t r, const std::string &what);
  // The abort reason a peer posted ("rank R: why"), or "" (none, or ours).
  std::string peer_abort(StoreClient &store);
  void watchdog();  // CUDA side: events and NCCL's error
  void monitor();   // host side: deadlines and the store
  // Aborts the communicator, posts `reason` (unless a peer's is there),
  // logs it and exits with `status`. Never returns.
  [[noreturn]] void fail(const std::string &reason, int status);
  // Ranks whose posted progress is behind collective `seq`.
  std::string ranks_behind(const std::string &key, int64_t seq);
  void abort_comm();
  void note_completed(int64_t seq);

  StoreClient &store_;
  std::unique_ptr<StoreClient> watch_store_;  // the watchdog's own connection
  uint32_t rank_, world_;
  std::chrono::milliseconds timeout_;
  std::string prefix_;
  ncclComm_t comm_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  void *scratch_ = nullptr;  // the barrier's one element

  std::mutex mu_;  // issue order, in_flight_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Op>> in_flight_;
  std::atomic<int64_t> seq_{0};
  std::atomic<bool> stop_{false}, aborted_{false};
  std::thread watchdog_, monitor_;

  // What the monitor knows of the collectives in flight, without CUDA.
  struct Pending {
    int64_t seq;
    std::chrono::steady_clock::time_point issued;
    std::string what;
  };
  std::mutex pending_mu_;  // never held across a CUDA or NCCL call
  std::deque<Pending> pending_;
  std::atomic<int64_t> completed_{0};  // every collective up to this one completed
};

}  // namespace tessera
