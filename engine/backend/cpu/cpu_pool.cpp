// The CPU ops' thread pool (cpu_pool.hpp). Between calls a worker may
// spin for a short while (TESSERA_CPU_SPIN_US, default 100 us) watching
// for the next call, then sleeps on a condition variable. The ops of one
// step follow each other within microseconds, and waking a sleeping thread
// costs tens of microseconds on a VM (an interrupt to a halted virtual
// CPU): in the quickstart MLP's 1.4 ms step that was most of the second
// thread's gain. It spins only while a core is free for it
// (util/spin_policy.hpp: this node's threads fit the cores, the machine's
// runnable threads too) and less after spins that did not pay; otherwise
// it sleeps at once, so a busy machine's cores go to the threads that have
// work. 0 sleeps at once always (as OMP_WAIT_POLICY=PASSIVE does for
// OpenMP).
//
// A call's parts are handed out, not assigned: the caller, once done with
// part 0, takes the parts no worker has taken yet. A worker that is not on
// a core when the call comes (a loaded machine, or asleep and slow to
// wake) then costs the call nothing, where a fixed part per worker made
// the caller wait for it.
#include "backend/cpu/cpu_pool.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "util/error.hpp"
#include "util/spin_policy.hpp"

namespace tessera::cpu {
namespace {

using Clock = std::chrono::steady_clock;

// How long a thread spins before it sleeps, in microseconds: set by
// pool_set_spin_us, else TESSERA_CPU_SPIN_US, else 100.
constexpr long kMaxSpinUs = 1000000;

std::atomic<long> &spin_us() {
  static std::atomic<long> us{spin_us_from(std::getenv("TESSERA_CPU_SPIN_US"))};
  return us;
}

Clock::duration spin_time() {
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::microseconds(spin_us().load(std::memory_order_relaxed)));
}

// Set on the pool's workers, and on a caller while its parallel call runs:
// a parallel_for (or pool_threads) from inside a chunk then runs on its
// thread at once. (Taking call_mu_ again from the thread that holds it would
// be undefined behaviour, or a deadlock for threads().)
thread_local bool t_in_call = false;

struct InCall {
  bool was = t_in_call;
  InCall() { t_in_call = true; }
  ~InCall() { t_in_call = was; }
  InCall(const InCall &) = delete;
  InCall &operator=(const InCall &) = delete;
};

class Pool {
 public:
  // The spin setting is made first, so that it outlives the workers that
  // read it while ~Pool stops them.
  Pool() { spin_us(); }
  ~Pool() { resize(1); }

  void resize(int n) {
    // Inside a chunk the pool is mid-call: the caller's thread holds
    // call_mu_, and a worker's call could not end while it waits for it.
    TSR_CHECK(!t_in_call, TSR_ERR_INVALID,
              "cpu ops pool: the thread count cannot change inside a parallel_for; set it "
              "before the call (cpu_ops_set_threads)");
    std::lock_guard<std::mutex> call(call_mu_);
    const size_t want = static_cast<size_t>(std::max(n, 1) - 1);
    if (want == workers_.size()) return;
    stop_workers();
    // New workers wait for the next call, not one that ran before they were.
    const uint64_t now = generation_.load(std::memory_order_acquire);
    for (size_t i = 0; i < want; ++i) workers_.emplace_back([this, now] { work(now); });
  }

  int threads() {
    if (t_in_call) return 1;  // inside a chunk: nested calls run here
    std::lock_guard<std::mutex> call(call_mu_);
    return static_cast<int>(workers_.size()) + 1;
  }

  void run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)> &fn) {
    if (n <= 0) return;
    // Another thread's call running: this one runs serially on its caller.
    std::unique_lock<std::mutex> call(call_mu_, std::defer_lock);
    if (!t_in_call) (void)call.try_lock();
    const InCall in_call;
    const int64_t most = call.owns_lock() ? static_cast<int64_t>(workers_.size()) + 1 : 1;
    const int64_t parts =
        std::min<int64_t>(most, std::max<int64_t>(1, n / std::max<int64_t>(grain, 1)));
    if (parts <= 1) {
      fn(0, n);
      return;
    }
    // The call's fields are written before the generation is published
    // (release); a worker reads them after seeing it (acquire). Under mu_,
    // so that a worker about to sleep either sees the new generation or is
    // counted in sleepers_ and woken, and so that the fields a worker reads
    // belong to the generation it read with them.
    bool wake;
    uint64_t call_no;
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &fn;
      n_ = n;
      parts_ = parts;
      pending_.store(static_cast<int>(parts - 1), std::memory_order_relaxed);
      call_no = generation_.load(std::memory_order_relaxed) + 1;
      claim_.store(claim_word(call_no, 1), std::memory_order_relaxed);  // part 0 is ours
      generation_.store(call_no, std::memory_order_release);
      wake = sleepers_ > 0;
    }
    if (wake) wake_.notify_all();
    fn(0, n / parts);  // the caller takes part 0
    // Then the parts no worker has taken: one not on a core holds nothing up.
    for (int64_t p; claim(call_no, parts, &p);) {
      fn(n * p / parts, n * (p + 1) / parts);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
    const auto done = [this] { return pending_.load(std::memory_order_acquire) == 0; };
    if (!spin_until(done, spin_time(), caller_backoff_)) {
      const Clock::time_point t0 = Clock::now();
      std::unique_lock<std::mutex> lk(mu_);
      done_.wait(lk, done);
      caller_backoff_.slept(Clock::now() - t0, spin_time());
    }
  }

 private:
  // claim_ holds the call's number (its low 48 bits) above the next part
  // to hand out (16 bits: parts never exceed the threads).
  static uint64_t claim_word(uint64_t call_no, int64_t part) {
    return (call_no << 16) | static_cast<uint64_t>(part);
  }

  // Takes the next part of call `call_no` into *part; false when every
  // part is taken or that call is over (a worker late for it must not take
  // a part of the next one, whose fields it has not read).
  bool claim(uint64_t call_no, int64_t parts, int64_t *part) {
    uint64_t w = claim_.load(std::memory_order_acquire);
    for (;;) {
      if ((w >> 16) != (call_no & ((uint64_t{1} << 48) - 1))) return false;
      const int64_t next = static_cast<int64_t>(w & 0xffffu);
      if (next >= parts) return false;
      if (claim_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel)) {
        *part = next;
        return true;
      }
    }
  }

  void work(uint64_t seen) {
    t_in_call = true;  // a parallel_for inside a chunk runs on this worker
    SpinBackoff backoff;
    const auto next = [&] {
      return stop_.load(std::memory_order_acquire) ||
             generation_.load(std::memory_order_acquire) != seen;
    };
    for (;;) {
      if (!spin_until(next, spin_time(), backoff)) {
        const Clock::time_point t0 = Clock::now();
        std::unique_lock<std::mutex> lk(mu_);
        ++sleepers_;
        wake_.wait(lk, next);
        --sleepers_;
        lk.unlock();
        backoff.slept(Clock::now() - t0, spin_time());
      }
      if (stop_.load(std::memory_order_acquire)) return;
      const std::function<void(int64_t, int64_t)> *fn;
      int64_t n, parts;
      {
        // The fields of the call just published; mu_ also orders them
        // against a later call's writes.
        std::lock_guard<std::mutex> lk(mu_);
        seen = generation_.load(std::memory_order_acquire);
        fn = fn_;
        n = n_;
        parts = parts_;
      }
      for (int64_t p; claim(seen, parts, &p);) {
        (*fn)(n * p / parts, n * (p + 1) / parts);
        if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
          std::lock_guard<std::mutex> lk(mu_);  // the caller may be between its check and wait
          done_.notify_one();
        }
      }
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_.store(true, std::memory_order_release);
    }
    wake_.notify_all();
    for (auto &t : workers_) t.join();
    workers_.clear();
    stop_.store(false, std::memory_order_release);
  }

  std::mutex call_mu_;  // one parallel call (or resize) at a time
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t, int64_t)> *fn_ = nullptr;
  int64_t n_ = 0, parts_ = 0;
  std::atomic<int> pending_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> claim_{0};  // claim_word: the call and its next part
  SpinBackoff caller_backoff_;      // under call_mu_
  int sleepers_ = 0;                // workers waiting on wake_, under mu_
  std::atomic<bool> stop_{false};
};

Pool &pool() {
  static Pool p;
  return p;
}

}  // namespace

void pool_set_threads(int n) {
  spin_set_rank_threads(static_cast<unsigned>(std::max(n, 1)));
  pool().resize(n);
}
int pool_threads() {
  return pool().threads();
}
void pool_set_spin_us(long us) {
  spin_us().store(std::clamp(us, 0L, kMaxSpinUs), std::memory_order_relaxed);
}
long spin_us_from(const char *value) {
  if (!value || !*value) return 100;
  char *end = nullptr;
  errno = 0;
  const long v = std::strtol(value, &end, 10);
  TSR_CHECK(errno == 0 && end && *end == '\0' && v >= 0 && v <= kMaxSpinUs, TSR_ERR_INVALID,
            std::string("TESSERA_CPU_SPIN_US=") + value +
                ": expected whole microseconds from 0 (sleep at once) to " +
                std::to_string(kMaxSpinUs) + "; unset it for the default, 100");
  return v;
}
long pool_spin_us() {
  return spin_us().load(std::memory_order_relaxed);
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)> &fn) {
  pool().run(n, grain, fn);
}

}  // namespace tessera::cpu
