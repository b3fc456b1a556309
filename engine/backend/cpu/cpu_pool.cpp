// The CPU ops' thread pool (cpu_pool.hpp). Between calls a worker first
// spins for a short while (TESSERA_CPU_SPIN_US, default 100 us) watching
// for the next call, then sleeps on a condition variable. The ops of one
// step follow each other within microseconds, and waking a sleeping thread
// costs tens of microseconds on a VM (an interrupt to a halted virtual
// CPU): in the quickstart MLP's 1.4 ms step that was most of the second
// thread's gain. Past the spin the workers sleep, so an idle pool does not
// hold cores that OpenBLAS, the data loader or another rank wants; 0 sleeps
// at once (as OMP_WAIT_POLICY=PASSIVE does for OpenMP).
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

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TSR_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define TSR_CPU_RELAX() asm volatile("yield")
#else
#define TSR_CPU_RELAX() std::this_thread::yield()
#endif

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

// Spins until done() or the spin time has passed; true if done() held.
template <typename Done>
bool spin_until(const Done &done) {
  if (done()) return true;
  const Clock::duration budget = spin_time();
  if (budget == Clock::duration::zero()) return false;
  const Clock::time_point until = Clock::now() + budget;
  for (unsigned i = 1;; ++i) {
    TSR_CPU_RELAX();
    // Every so often give the core away: with more threads than cores (a
    // loaded machine, run.threads above the cores) the thread that holds
    // the work may be waiting for this one's core.
    if ((i & 63u) == 0) std::this_thread::yield();
    if (done()) return true;
    if ((i & 255u) == 0 && Clock::now() >= until) return done();
  }
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
    for (size_t i = 0; i < want; ++i) workers_.emplace_back([this, i, now] { work(i + 1, now); });
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
    // counted in sleepers_ and woken.
    bool wake;
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &fn;
      n_ = n;
      parts_ = parts;
      pending_.store(static_cast<int>(parts - 1), std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
      wake = sleepers_ > 0;
    }
    if (wake) wake_.notify_all();
    fn(0, n / parts);  // the caller takes part 0
    if (!spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock<std::mutex> lk(mu_);
      done_.wait(lk, [this] { return pending_.load(std::memory_order_acquire) == 0; });
    }
  }

 private:
  void work(size_t part, uint64_t seen) {
    t_in_call = true;  // a parallel_for inside a chunk runs on this worker
    const auto next = [&] {
      return stop_.load(std::memory_order_acquire) ||
             generation_.load(std::memory_order_acquire) != seen;
    };
    for (;;) {
      if (!spin_until(next)) {
        std::unique_lock<std::mutex> lk(mu_);
        ++sleepers_;
        wake_.wait(lk, next);
        --sleepers_;
      }
      if (stop_.load(std::memory_order_acquire)) return;
      const std::function<void(int64_t, int64_t)> *fn;
      int64_t n, parts;
      {
        // The fields of the call just published; mu_ also orders them
        // against a later call's writes, which wait for this one's pending_.
        std::lock_guard<std::mutex> lk(mu_);
        seen = generation_.load(std::memory_order_acquire);
        fn = fn_;
        n = n_;
        parts = parts_;
      }
      const int64_t p = static_cast<int64_t>(part);
      if (p >= parts) continue;  // not needed this time
      (*fn)(n * p / parts, n * (p + 1) / parts);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lk(mu_);  // the caller may be between its check and wait
        done_.notify_one();
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
  int sleepers_ = 0;  // workers waiting on wake_, under mu_
  std::atomic<bool> stop_{false};
};

Pool &pool() {
  static Pool p;
  return p;
}

}  // namespace

void pool_set_threads(int n) {
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
