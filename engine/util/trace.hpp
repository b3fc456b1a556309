// Process-wide timing hooks shared by the trainer, the loader and the
// collectives: spans for the Chrome trace of a window of steps (log.trace)
// and the time the calling thread spends blocked on collectives (the
// "comm_wait" part of log.breakdown). A process-wide switch rather than an
// object handed around, because the collectives run behind the plugin ABI
// where no engine object can be threaded through. Both are off by default;
// off, a hook costs one relaxed atomic load.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::trace {

// A track of the timeline. On a CPU run: compute is the training thread;
// communication the collectives' own thread; copy the loader threads
// preparing host batches (a GPU run adds its host-device copies there);
// offload the offload backend's optimizer step, which runs on the host CPU.
enum class Stream : int { compute = 0, communication = 1, copy = 2, offload = 3 };
constexpr int kStreams = 4;
const char *stream_name(Stream s);

struct Event {
  std::string name;
  Stream stream = Stream::compute;
  int lane = 0;       // a second loader thread gets its own row
  int64_t begin = 0;  // steady-clock nanoseconds
  int64_t end = 0;
  int64_t step = -1;   // the optimizer step it belongs to
  int64_t bytes = -1;  // collectives: payload
};

namespace detail {
inline std::atomic<bool> recording{false};
inline std::atomic<bool> counting{false};
inline std::atomic<int64_t> waited_ns{0};
inline std::atomic<int64_t> step{-1};
}  // namespace detail

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- Trace -------------------------------------------------------------
inline bool recording() {
  return detail::recording.load(std::memory_order_relaxed);
}
// The step being traced now (-1 outside the window).
inline int64_t current_step() {
  return detail::step.load(std::memory_order_relaxed);
}
// Opens or closes the window; `step` labels what is recorded from now on.
void set_recording(bool on, int64_t step);
// Records `e`; an event without a step gets the current one.
void record(Event e);
// Everything recorded so far, cleared.
std::vector<Event> take();
// A steady-clock stamp as wall-clock nanoseconds: ranks on one machine
// then line up exactly, and across machines to NTP's accuracy.
int64_t wall_ns(int64_t steady_ns);
// Events as Chrome trace JSON objects (pid = rank, tid = stream), plus the
// process and thread names, comma-separated without brackets (so ranks'
// parts concatenate). Timestamps are microseconds after `base_wall_ns`
// (the job's first event, so they stay small and exact as doubles).
std::string chrome_events(const std::vector<Event> &events, uint32_t rank, int64_t base_wall_ns);

// Times a scope onto a track while the window is open. The step is the one
// it began in: a loader thread may finish after the window closed.
class Span {
 public:
  Span(Stream s, const char *name, int64_t bytes = -1, int lane = 0)
      : name_(recording() ? name : nullptr), stream_(s), lane_(lane), bytes_(bytes) {
    if (!name_) return;
    step_ = current_step();
    begin_ = now_ns();
  }
  ~Span() {
    if (name_) record(Event{name_, stream_, lane_, begin_, now_ns(), step_, bytes_});
  }
  Span(const Span &) = delete;
  Span &operator=(const Span &) = delete;

 private:
  const char *name_;
  Stream stream_;
  int lane_;
  int64_t bytes_, begin_ = 0, step_ = -1;
};

// ---- Blocked on collectives ----------------------------------------------
inline bool counting_waits() {
  return detail::counting.load(std::memory_order_relaxed);
}
void set_counting_waits(bool on);
inline void add_wait(int64_t ns) {
  detail::waited_ns.fetch_add(ns, std::memory_order_relaxed);
}
// Nanoseconds blocked so far (monotonic; callers take differences).
inline int64_t waited_ns() {
  return detail::waited_ns.load(std::memory_order_relaxed);
}

}  // namespace tessera::trace
