// What the user sees of a run: progress lines, eval lines, metrics.jsonl,
// summary.json and the closing summary.
#pragma once

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "train/metrics_log.hpp"

namespace tessera {

class Monitors;

struct EvalResult {
  double loss = 0;
  double accuracy = -1;  // -1 when the model does not classify
  int64_t count = 0;
};

class Reporter {
 public:
  // Only rank 0 writes files and progress; other ranks stay quiet. Rank 0
  // checks the run directory is writable here, at start-up. The [monitor]
  // outputs registered for `run_dir` (set_run_monitors) receive every
  // progress and eval line too.
  Reporter(const std::string &run_dir, bool primary, int64_t total_steps);
  ~Reporter();

  // `extra` joins the metrics line (memory, the breakdown); a breakdown
  // also shows, compact, at the end of the progress line.
  void progress(int64_t step, int64_t epoch, double loss, double lr, double samples_per_s,
                double elapsed_s, const nlohmann::json &extra = nlohmann::json::object());
  void eval(int64_t step, int64_t epoch, const EvalResult &r);
  void write_summary(const nlohmann::json &summary);
  void print_summary(const nlohmann::json &summary);
  bool primary() const { return primary_; }

 private:
  void append(const nlohmann::json &line);
  std::string dir_;
  bool primary_;
  int64_t total_;
  MetricsLog metrics_;
  std::unique_ptr<Monitors> monitors_;
};

std::string format_duration(double seconds);

// A failed run's summary.json (docs/observability.md): status "failed",
// `reason` and the failing rank (-1: none named), over whatever summary the
// run had written, so `tessera runs` shows it failed rather than running.
// Nothing is written when `run_dir` does not exist (the run never started)
// or, with `unless_held`, while another process holds its lock (another
// job's directory; a rank of a running job must pass false, its rank 0
// holds the lock). Returns the file written, or "".
std::string write_failed_summary(const std::string &run_dir, const std::string &name,
                                 const std::string &reason, int failed_rank, uint32_t world_size,
                                 bool unless_held = true);

// "1.2 ms/step: data 2% | fwd 31% | ..." from a breakdown object of
// metrics.jsonl (parts in seconds over `steps` steps).
std::string format_breakdown(const nlohmann::json &breakdown);

}  // namespace tessera
