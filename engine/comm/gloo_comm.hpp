// Collectives across CPU ranks on Gloo (TCP transport), behind the ABI's
// tsr_comm table. Every collective runs on one communication thread, in
// the order it was issued, so reductions overlap the caller's compute; each
// has a timeout whose error names the operation and the ranks that had not
// reached it.
#pragma once

#include <tessera/host.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/comm.hpp"
#include "comm/shm_group.hpp"
#include "comm/store.hpp"

namespace gloo {
class Context;
}

namespace tessera {

class GlooComm final : public Comm {
 public:
  // Connects every rank through the store (keys under `prefix`). `iface`
  // names the network interface to bind ("" for the store's route).
  // With `shm`, ranks that are all on this host exchange data through a
  // shared-memory segment (ShmGroup) instead of Gloo's TCP.
  GlooComm(StoreClient &store, uint32_t rank, uint32_t world, std::chrono::seconds timeout,
           const std::string &iface, const std::string &hostname, const std::string &prefix,
           bool shm = true);
  ~GlooComm();

  // The collectives (comm/comm.hpp); CudaComm sends host tensors here.
  tsr_status all_reduce(tsr_host_ctx *ctx, DLTensor *t, tsr_reduce_op op,
                        tsr_comm_work **work) override;
  tsr_status reduce_scatter(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out, tsr_reduce_op op,
                            tsr_comm_work **work) override;
  tsr_status all_gather(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out,
                        tsr_comm_work **work) override;
  tsr_status broadcast(tsr_host_ctx *ctx, DLTensor *t, uint32_t root,
                       tsr_comm_work **work) override;
  tsr_status barrier(tsr_host_ctx *ctx) override;

  // Queues a collective; returns its work item (nullptr when `blocking`
  // ran it to completion already). `name` names it in errors and in the
  // trace, beside its payload `bytes`.
  tsr_status submit(tsr_host_ctx *ctx, const char *name, std::function<void()> fn,
                    tsr_comm_work **work, int64_t bytes = -1);
  tsr_status wait(tsr_host_ctx *ctx, tsr_comm_work *work) override;

  std::shared_ptr<gloo::Context> context() const { return context_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  uint32_t rank() const { return rank_; }
  uint32_t world() const { return world_; }
  // Scratch for reduce-scatter, grown on demand (by the collective running
  // now: one at a time, on the communication thread or a waiting caller).
  void *scratch(size_t bytes);
  // The shared-memory group, when the collectives go through it.
  ShmGroup *shm() const { return shm_.get(); }
  // How the ranks exchange data, for the start-up report.
  const std::string &transport() const { return transport_; }

 private:
  struct Work;
  void loop();
  void execute(Work &w);
  void heartbeat();
  std::string missing_ranks(int64_t seq);

  StoreClient &store_;
  uint32_t rank_, world_;
  std::chrono::milliseconds timeout_;
  std::string prefix_;
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<ShmGroup> shm_;
  std::string transport_;
  std::vector<char> scratch_;

  std::mutex mu_;
  std::condition_variable cv_;               // work queued or finished
  std::condition_variable hb_cv_;            // the heartbeat's, woken only to stop
  std::deque<std::shared_ptr<Work>> queue_;  // issued, not started
  bool running_ = false;                     // a collective is running (any thread)
  bool stop_ = false;
  int64_t seq_ = 0;                      // collectives issued by this rank
  std::string broken_;                   // the first failure; every later collective fails with it
  std::atomic<int64_t> current_seq_{0};  // the collective running now
  std::thread thread_, heartbeat_;
};

}  // namespace tessera
