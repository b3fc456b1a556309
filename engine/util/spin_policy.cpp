// When a waiting thread may spin (spin_policy.hpp).
#include "util/spin_policy.hpp"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

unsigned read_allowed_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

struct State {
  std::atomic<unsigned> cores{read_allowed_cores()};
  std::atomic<unsigned> ranks{1}, threads{1};
  // The machine: its online cores, and /proc/loadavg kept open (pread at
  // offset 0 reads it afresh; -1 where it cannot be read: that check is
  // then skipped).
  long online = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  int loadavg = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  // The last reading: whether the runnable threads fitted, and when (ns
  // of the steady clock); a reader claims the next one through `reading`.
  std::atomic<bool> fits{true};
  std::atomic<int64_t> read_at{0};
  std::atomic<bool> reading{false};
};

State &state() {
  static State s;
  return s;
}

// The fourth field of /proc/loadavg, "R/T": R threads runnable now,
// machine-wide (the reader itself among them); -1 if unreadable.
long runnable_now(int fd) {
  char buf[128];
  const ssize_t n = fd >= 0 ? ::pread(fd, buf, sizeof buf - 1, 0) : -1;
  if (n <= 0) return -1;
  buf[n] = '\0';
  const char *p = buf;
  for (int field = 0; field < 3; field++) {
    while (*p && *p != ' ') p++;
    while (*p == ' ') p++;
  }
  char *end = nullptr;
  const long r = std::strtol(p, &end, 10);
  return end != p && *end == '/' ? r : -1;
}

// Whether the machine's runnable threads fit its cores, read again when the
// last reading is over a millisecond old (by one thread; the others take
// the last reading meanwhile).
bool machine_fits(State &s) {
  constexpr int64_t kFreshNs = 1000000;
  const int64_t now = Clock::now().time_since_epoch().count();
  if (s.loadavg < 0 || now - s.read_at.load(std::memory_order_relaxed) < kFreshNs ||
      s.reading.exchange(true, std::memory_order_acquire))
    return s.fits.load(std::memory_order_relaxed);
  const long r = runnable_now(s.loadavg);
  const bool fits = r < 0 || r <= s.online;
  s.fits.store(fits, std::memory_order_relaxed);
  s.read_at.store(now, std::memory_order_relaxed);
  s.reading.store(false, std::memory_order_release);
  return fits;
}

}  // namespace

void spin_set_local_ranks(unsigned ranks) {
  state().ranks.store(std::max(1u, ranks), std::memory_order_relaxed);
  state().cores.store(read_allowed_cores(), std::memory_order_relaxed);
}

void spin_set_rank_threads(unsigned threads) {
  state().threads.store(std::max(1u, threads), std::memory_order_relaxed);
  state().cores.store(read_allowed_cores(), std::memory_order_relaxed);
}

unsigned spin_allowed_cores() {
  return state().cores.load(std::memory_order_relaxed);
}

bool spin_core_free() {
  State &s = state();
  const unsigned long node = static_cast<unsigned long>(s.ranks.load(std::memory_order_relaxed)) *
                             s.threads.load(std::memory_order_relaxed);
  if (node > s.cores.load(std::memory_order_relaxed)) return false;
  return machine_fits(s);
}

}  // namespace tessera
