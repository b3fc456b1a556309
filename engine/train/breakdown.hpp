// Where a run's time goes (log.breakdown): the training thread's time split
// into data loading, forward, backward, waiting on communication, optimizer
// step, checkpointing and eval, summed per logged interval and over the
// run. Each part is timed directly; what no part covers shows as "other",
// so the parts' sum against the wall time says how complete the picture is.
// Single-threaded: the training thread owns it.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "util/trace.hpp"

namespace tessera {

enum class Part : int { data, forward, backward, comm_wait, optimizer, checkpoint, eval };
constexpr int kParts = 7;
// Key in metrics.jsonl and summary.json ("comm_wait", ...).
const char *part_key(Part p);

class Breakdown {
 public:
  using Seconds = std::array<double, kParts>;

  // Counts time blocked in collectives while it lives.
  Breakdown();
  ~Breakdown();
  Breakdown(const Breakdown &) = delete;
  Breakdown &operator=(const Breakdown &) = delete;

  // Times one part from construction to stop() (or destruction), and draws
  // it on the trace's compute track while the window is open. Time blocked
  // on collectives inside data, forward, backward and optimizer moves to
  // comm_wait (a stage-3 gather in forward is communication, not compute);
  // eval and checkpoint keep theirs, since a user asks how long they took.
  class Scope {
   public:
    Scope(Breakdown *b, Part p, const char *span_name);
    ~Scope() { stop(); }
    Scope(const Scope &) = delete;
    Scope &operator=(const Scope &) = delete;
    void stop();

   private:
    Breakdown *b_;
    Part part_;
    const char *span_;  // null when the trace window was closed at the start
    int64_t step_, t0_, waited0_;
  };
  [[nodiscard]] Scope time(Part p, const char *span_name) { return Scope(this, p, span_name); }

  // The parts and the wall time since the last interval began, as metrics:
  // {"steps", "total", one key per part, "other"} in seconds.
  nlohmann::json take_interval(int64_t steps);
  // Starts the next interval now (after the progress line, so printing it
  // counts in no interval).
  void restart_interval();

  // Over the run so far.
  const Seconds &totals() {
    settle();
    return total_;
  }
  // Wall seconds since construction.
  double wall() const;

 private:
  void add(Part p, double s) {
    interval_[static_cast<size_t>(p)] += s;
    total_[static_cast<size_t>(p)] += s;
  }
  // Collectives waited on outside every scope (a loss average, a stop
  // check between steps) count as comm_wait too: anything added to the
  // loop later is covered without a scope of its own.
  void settle();
  Seconds interval_{}, total_{};
  int64_t start_ns_, interval_start_ns_;
  int64_t settled_waits_ns_;     // trace::waited_ns() at the last settle()
  int64_t scoped_waits_ns_ = 0;  // of which scopes have accounted since
};

}  // namespace tessera
