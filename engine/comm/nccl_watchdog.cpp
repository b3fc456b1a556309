// The NCCL communicator's watchdog (nccl_comm.hpp): it follows every
// collective in flight, notices a peer's failure through the store, and on a
// timeout or an error aborts the communicator and ends the process with the
// status that tells the launcher who failed first.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "backend/cuda/device.hpp"
#include "comm/nccl_comm_internal.hpp"
#include "comm/store.hpp"
#include "util/error.hpp"

namespace tessera {

using namespace nccl_detail;

namespace {
std::atomic<bool> g_exiting{false};
}  // namespace

void nccl_detail::watch_exit() {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit([] { g_exiting = true; }); });
}

bool nccl_detail::process_exiting() {
  return g_exiting.load();
}

void NcclComm::abort_comm() {
  // ncclCommAbort should return promptly; if it does not (a wedged proxy
  // thread), the process must still get out: the caller waits at most
  // kAbortGrace and leaves the rest to the exit.
  if (!comm_ || aborted_.exchange(true)) return;
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto d = std::make_shared<Done>();
  ncclComm_t c = comm_;
  std::thread([c, d] {
    (void)ncclCommAbort(c);
    std::lock_guard<std::mutex> lk(d->mu);
    d->done = true;
    d->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lk(d->mu);
  if (!d->cv.wait_for(lk, kAbortGrace, [&] { return d->done; }))
    spdlog::warn("rank {}: ncclCommAbort did not return within {} s", rank_, kAbortGrace.count());
}

std::string NcclComm::peer_abort(StoreClient &store) {
  std::string why;
  if (!store.check(abort_key(prefix_), &why)) return "";
  if (why.rfind("rank " + std::to_string(rank_) + ":", 0) == 0) return "";  // ours
  return why;
}

std::string NcclComm::ranks_behind(const std::string &key, int64_t seq) {
  std::string out;
  for (uint32_t q = 0; q < world_; ++q) {
    if (q == rank_) continue;
    std::string v;
    const int64_t theirs =
        watch_store_->check(key + std::to_string(q), &v) ? std::strtoll(v.c_str(), nullptr, 10) : 0;
    if (theirs < seq) out += (out.empty() ? "" : ", ") + std::to_string(q);
  }
  return out;
}

void NcclComm::fail(const std::string &reason, int status) {
  // Only the first failure speaks; a second thread failing meanwhile
  // waits for the exit.
  static std::atomic<bool> failing{false};
  if (process_exiting() || failing.exchange(true))
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  const std::string text = "rank " + std::to_string(rank_) + ": " + reason;
  try {
    post_abort_cause(*watch_store_, prefix_, text);  // the first failure is the cause
  } catch (const std::exception &) {
    // Best effort: the launcher still sees the exit status.
  }
  spdlog::error("{}; stopping (status {})", text, status);
  spdlog::default_logger()->flush();
  std::fflush(stdout);
  std::fflush(stderr);
  abort_comm();
  ::_exit(status);
}

void NcclComm::watchdog() {
  try {
    cuda::bind_thread();
  } catch (const std::exception &e) {
    fail(std::string("NCCL watchdog could not bind the device: ") + e.what(), kOwnFailureStatus);
  }
  while (!stop_) {
    // Collectives complete in order; the oldest one left is the one every
    // later collective waits behind. No lock is held across a CUDA call.
    std::shared_ptr<Op> oldest;
    for (;;) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        oldest = in_flight_.empty() ? nullptr : in_flight_.front();
      }
      if (!oldest) break;
      const cudaError_t q = cudaEventQuery(oldest->done);
      if (q == cudaErrorNotReady) break;
      if (q == cudaErrorCudartUnloading || process_exiting()) return;  // the exit, not a fault
      if (q != cudaSuccess)
        fail("CUDA error while " + oldest->describe() + " was in flight: " + cudaGetErrorName(q) +
                 " (" + cudaGetErrorString(q) + ")",
             kOwnFailureStatus);
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (!in_flight_.empty() && in_flight_.front() == oldest) in_flight_.pop_front();
      }
      note_completed(oldest->seq);
    }

    if (process_exiting()) return;
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      const std::string during = oldest ? " during " + oldest->describe() : "";
      // A remote error means a peer went away: it is the cause, not us.
      const bool remote = async == ncclRemoteError;
      fail(std::string(remote ? "[comm] " : "") + "NCCL error" + during + ": " +
               ncclGetErrorString(async) + " (" + ncclGetLastError(comm_) + ")",
           remote ? kStoppedByPeerStatus : kOwnFailureStatus);
    }

    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_for(lk, kPollEvents, [&] { return stop_.load(); });
  }
}

void NcclComm::monitor() {
  const std::string progress_key = prefix_ + "/nccl_seq/";
  int64_t posted = -1;
  auto next_store = Clock::now();
  while (!stop_) {
    // The oldest collective not yet seen complete, and how long it has run.
    bool late = false;
    Pending oldest{};
    {
      std::lock_guard<std::mutex> lk(pending_mu_);
      while (!pending_.empty() && pending_.front().seq <= completed_) pending_.pop_front();
      if (!pending_.empty() && Clock::now() - pending_.front().issued > timeout_) {
        late = true;
        oldest = pending_.front();
      }
    }

    if (Clock::now() >= next_store || late) {
      next_store = Clock::now() + kPollStore;
      try {
        const std::string why = peer_abort(*watch_store_);
        if (!why.empty()) {
          std::fprintf(stderr, "%s\n", peer_stop_message(why, rank_).c_str());
          std::fflush(stderr);
          abort_comm();
          ::_exit(kStoppedByPeerStatus);
        }
        // How far this rank has got, so a peer that times out can name
        // the ranks that never issued its collective.
        const int64_t now = seq_.load();
        if (now != posted) {
          watch_store_->set(progress_key + std::to_string(rank_), std::to_string(now));
          posted = now;
        }
      } catch (const std::exception &e) {
        if (stop_ || process_exiting()) break;
        std::fprintf(stderr, "tessera: rank %u lost the rendezvous store (%s); stopping\n", rank_,
                     e.what());
        std::fflush(stderr);
        abort_comm();
        ::_exit(kStoppedByPeerStatus);
      }
    }

    if (late) {
      const std::string behind = ranks_behind(progress_key, oldest.seq);
      // The watchdog may lag (a CUDA query can wait behind another thread's
      // blocking copy), so name the oldest collective not seen complete.
      fail("[comm] " + oldest.what + " was not seen to complete within " + seconds(timeout_) +
               " (comm.timeout_s; this rank issued " + std::to_string(seq_.load()) +
               " collectives); ranks that had not issued it: " +
               (behind.empty() ? "none (all issued it; NCCL_DEBUG=WARN may tell more)" : behind),
           kStoppedByPeerStatus);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace tessera
