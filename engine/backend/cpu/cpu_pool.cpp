// The CPU ops' thread pool (cpu_pool.hpp). Workers sleep on a condition
// variable between calls: the ops run a few times per layer, so a wake-up
// (microseconds) is small against the work, and idle workers must not spin
// on cores that OpenBLAS or another rank wants.
#include "backend/cpu/cpu_pool.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace tessera::cpu {
namespace {

class Pool {
 public:
  ~Pool() { resize(1); }

  void resize(int n) {
    std::lock_guard<std::mutex> call(call_mu_);
    const size_t want = static_cast<size_t>(std::max(n, 1) - 1);
    if (want == workers_.size()) return;
    stop_workers();
    // New workers wait for the next call, not one that ran before they were.
    uint64_t now;
    {
      std::lock_guard<std::mutex> lk(mu_);
      now = generation_;
    }
    for (size_t i = 0; i < want; ++i) workers_.emplace_back([this, i, now] { work(i + 1, now); });
  }

  int threads() {
    std::lock_guard<std::mutex> call(call_mu_);
    return static_cast<int>(workers_.size()) + 1;
  }

  void run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)> &fn) {
    if (n <= 0) return;
    std::unique_lock<std::mutex> call(call_mu_, std::try_to_lock);
    const int64_t most = call.owns_lock() ? static_cast<int64_t>(workers_.size()) + 1 : 1;
    const int64_t parts =
        std::min<int64_t>(most, std::max<int64_t>(1, n / std::max<int64_t>(grain, 1)));
    if (parts <= 1) {
      fn(0, n);
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &fn;
      n_ = n;
      parts_ = parts;
      pending_ = static_cast<int>(parts - 1);
      ++generation_;
    }
    wake_.notify_all();
    fn(0, n / parts);  // the caller takes part 0
    std::unique_lock<std::mutex> lk(mu_);
    done_.wait(lk, [this] { return pending_ == 0; });
    fn_ = nullptr;
  }

 private:
  void work(size_t part, uint64_t seen) {
    for (;;) {
      const std::function<void(int64_t, int64_t)> *fn;
      int64_t n, parts;
      {
        std::unique_lock<std::mutex> lk(mu_);
        wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (static_cast<int64_t>(part) >= parts_) continue;  // not needed this time
        fn = fn_;
        n = n_;
        parts = parts_;
      }
      const int64_t p = static_cast<int64_t>(part);
      (*fn)(n * p / parts, n * (p + 1) / parts);
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto &t : workers_) t.join();
    workers_.clear();
    stop_ = false;
  }

  std::mutex call_mu_;  // one parallel call (or resize) at a time
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t, int64_t)> *fn_ = nullptr;
  int64_t n_ = 0, parts_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
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

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)> &fn) {
  pool().run(n, grain, fn);
}

}  // namespace tessera::cpu
