// Private to the NCCL communicator's two files, nccl_comm.cpp (set-up and
// collectives) and nccl_watchdog.cpp (the watchdog, failure and abort):
// the timings they share and the collective in flight they both follow.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "comm/nccl_comm.hpp"

namespace tessera {

namespace nccl_detail {

using Clock = std::chrono::steady_clock;

// Exit status of a rank that stops for an error of its own.
constexpr int kOwnFailureStatus = 1;
// How long ncclCommAbort may take before the process exits anyway.
constexpr auto kAbortGrace = std::chrono::seconds(10);
// How often the watchdog looks at the events, and at the store.
constexpr auto kPollEvents = std::chrono::milliseconds(20);
constexpr auto kPollStore = std::chrono::milliseconds(250);

inline std::string seconds(std::chrono::milliseconds ms) {
  return std::to_string(ms.count() / 1000) + " s";
}

// Whether the process has begun to exit (set by an atexit handler that
// watch_exit() registers before the first communicator starts its threads,
// so it runs before the CUDA runtime's own teardown). A communicator that
// outlives main (one never destroyed) then sees its events fail and the
// store go away: that is the exit, not a failure to report.
void watch_exit();
bool process_exiting();

}  // namespace nccl_detail

// One collective in flight. The caller's handle and the watchdog each hold
// a reference: the watchdog keeps following it after wait() has returned,
// because wait() only orders the compute stream after it.
struct NcclComm::Op {
  std::string name;
  int64_t seq = 0, bytes = -1;
  cudaEvent_t done = nullptr;
  nccl_detail::Clock::time_point issued;
  ~Op() {
    if (done) (void)cudaEventDestroy(done);  // freed once complete, if still pending
  }
  std::string describe() const {
    return "NCCL " + name + " (collective #" + std::to_string(seq) +
           (bytes >= 0 ? ", " + std::to_string(bytes) + " bytes" : "") + ")";
  }
};

}  // namespace tessera
