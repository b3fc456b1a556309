// What a training run records about itself beyond losses ([log]): the time
// breakdown, the Chrome trace of a window of steps, memory in the metrics,
// and at the end the run report (FLOP/s and MFU, peak memory of every rank
// by purpose, breakdown totals, where the files are) and the plot. The
// trainer calls a handful of hooks; everything else lives here.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "train/breakdown.hpp"
#include "train/job.hpp"
#include "train/session.hpp"

namespace tessera {

class RunObserver {
 public:
  RunObserver(const Job &job, Session &s, int64_t total_steps);
  ~RunObserver();
  RunObserver(const RunObserver &) = delete;
  RunObserver &operator=(const RunObserver &) = delete;

  // Times a part of the step (see Breakdown::Scope).
  [[nodiscard]] Breakdown::Scope time(Part p, const char *span_name) {
    return breakdown_.time(p, span_name);
  }
  // Called as step `step` (1-based) begins: opens or closes the trace window.
  void begin_step(int64_t step);
  // Extra fields for the metrics line of a logged interval of `steps`
  // steps: memory, and the breakdown when log.breakdown is on.
  nlohmann::json at_log(int64_t steps);
  // After the progress line: the next interval starts now.
  void restart_interval() { breakdown_.restart_interval(); }

  // Collective (every rank calls it, after the last checkpoint): gathers
  // every rank's peak memory and breakdown, writes the trace and the plot
  // (rank 0), and adds the run report to `summary`.
  void finish(nlohmann::json &summary);

 private:
  nlohmann::json gather_memory();
  nlohmann::json gather_breakdown(nlohmann::json &rank0);
  std::string write_trace();
  std::string write_plot();
  // The offload backend's seconds since the last call (ABI 1.2 stats), or
  // null when it reports none.
  nlohmann::json offload_interval();

  const Job &job_;
  Session &s_;
  Breakdown breakdown_;
  int64_t trace_first_ = 0, trace_last_ = 0;  // inclusive; 0: no trace
  std::string started_at_;
  tsr_offload_stats offload_last_{};
  tsr_speculate_stats spec_last_{};
  double wait_last_ = 0;
  uint64_t early_last_ = 0;  // flight.ranges_in_backward at the last interval
};

// Local time as ISO 8601 with offset ("2025-01-31T14:05:09+0100").
std::string iso_time_now();

}  // namespace tessera
