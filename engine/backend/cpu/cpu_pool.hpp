// A small pool of threads for the CPU ops' loops: the matrix products'
// splits (OpenBLAS itself runs one thread), attention, activations,
// layernorm. Its size follows cpu_ops_set_threads (run.threads, or the
// cores divided by the ranks on the machine), so the ops never use more
// cores than the rank was given.
#pragma once

#include <cstdint>
#include <functional>

namespace tessera::cpu {

// Sets the number of threads parallel_for may use, the caller included
// (1: everything runs on the caller). Starts or stops workers as needed.
void pool_set_threads(int n);
int pool_threads();

// How long an idle worker (and a caller waiting for its workers) may spin
// before sleeping, in microseconds; 0 sleeps at once. The default is
// TESSERA_CPU_SPIN_US, else 100. A bound, not a promise: a thread spins
// only while a core is free for it (util/spin_policy.hpp), and less after
// spins that did not pay.
void pool_set_spin_us(long us);
long pool_spin_us();
// The spin time a TESSERA_CPU_SPIN_US value asks for: 100 when unset or
// empty; anything but whole microseconds 0..1000000 throws, naming the
// variable (read once, when the pool is first used).
long spin_us_from(const char *value);

// Calls fn(begin, end) on disjoint chunks covering [0, n), in parallel on
// the pool, and returns when every chunk is done. Chunks hold at least
// `grain` items, so small loops stay on the caller. fn must not throw.
// A call made while another thread's call is running (the ops are not
// meant to be entered from two threads, but a plugin may) runs serially on
// its caller instead of waiting.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)> &fn);

}  // namespace tessera::cpu
