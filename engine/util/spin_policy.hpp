// When a waiting thread may spin (watch memory for its partner) rather
// than sleep: only while a core is free for it. A spinning thread holds a
// core; on a machine with more runnable threads than cores that core is
// taken from the thread being waited for (another rank, the pool's caller)
// or from other work on the node. And a thread that keeps yielding is
// worse off than one that sleeps: the kernel's scheduler (EEVDF) moves a
// yielder's deadline back a slice at every yield, so once its partner is
// done it waits behind every other runnable thread, while a woken sleeper
// runs at once. With two CPU-bound processes beside a 2-rank job on two
// cores, spinning and yielding made a 7.7 s test take 120 s (issue 53).
//
// Two checks, both cheap enough for every wait:
//  - this node's tessera threads (local ranks x threads per rank, as the
//    engine and the CPU pool declare them) fit the cores this process may
//    run on (sched_getaffinity: taskset, cgroup cpusets);
//  - the machine's runnable threads right now (/proc/loadavg's fourth
//    field, read at most once a millisecond per process) do not outnumber
//    its online cores: other jobs count too.
// And spins adapt (SpinBackoff): a spin that ran out before its partner
// came halves the next one's budget, so a wait that does not pay stops
// spinning after a few rounds; one that paid gives the full budget back.
#pragma once

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tessera {

// The ranks of this job on this node (LOCAL_WORLD_SIZE, a shared-memory
// group's size); at least 1. Also re-reads the cores this thread may use.
void spin_set_local_ranks(unsigned ranks);
// The threads each rank runs its ops on (the CPU pool's size, the caller
// included); at least 1. Also re-reads the cores this thread may use.
void spin_set_rank_threads(unsigned threads);
// The cores this process may run on, as last read (at least 1).
unsigned spin_allowed_cores();

// Whether a core is free for a spinning thread now (the two checks above).
bool spin_core_free();

// One waiter's spin budget, adapted to how its spins went (not shared
// between threads).
struct SpinBackoff {
  unsigned misses = 0;  // spins in a row that ran out before the wait ended

  std::chrono::steady_clock::duration budget(std::chrono::steady_clock::duration full) const {
    return full / (1 << (misses < 10 ? misses : 10));
  }
  void paid() { misses = 0; }
  void missed() {
    if (misses < 10) ++misses;
  }
  // A wait that slept: one shorter than the full budget would have been
  // a spin that paid.
  void slept(std::chrono::steady_clock::duration waited, std::chrono::steady_clock::duration full) {
    if (waited < full) paid();
  }
};

inline void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");  // the CPU's hint, not the scheduler's
#endif
}

// Spins until done() holds, the backoff's share of `full` has passed, or
// no core is free any more; true if done() held. It never yields to the
// scheduler (see above): past the spin the caller sleeps.
template <typename Done>
bool spin_until(const Done &done, std::chrono::steady_clock::duration full, SpinBackoff &backoff) {
  using Clock = std::chrono::steady_clock;
  if (done()) return true;
  if (full <= Clock::duration::zero() || !spin_core_free()) return false;
  const Clock::time_point until = Clock::now() + backoff.budget(full);
  for (unsigned i = 1;; ++i) {
    spin_pause();
    if (done()) {
      backoff.paid();
      return true;
    }
    if ((i & 255u) == 0 && (Clock::now() >= until || !spin_core_free())) {
      if (done()) return true;
      backoff.missed();
      return false;
    }
  }
}

}  // namespace tessera
