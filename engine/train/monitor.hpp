// DeepSpeed's monitor outputs ([monitor], docs/observability.md): the
// scalars of each progress line and evaluation as TensorBoard events and
// CSV files, under DeepSpeed's tag names (Train/Samples/train_loss, ...) so
// that dashboards made for DeepSpeed runs find them. The x axis is the
// optimizer step, as in metrics.jsonl and the progress lines.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "config/settings.hpp"
#include "util/tfevents.hpp"

namespace tessera {

class Monitors {
 public:
  // Opens the outputs `m` turns on; throws tessera::Error naming a
  // directory or file that cannot be written.
  explicit Monitors(const config::MonitorSettings &m);

  void train(int64_t step, double loss, double lr, double samples_per_s);
  void eval(int64_t step, double loss, double accuracy);  // accuracy < 0: not a classifier
  // "TensorBoard event files in DIR" and the like, for the start-up report.
  std::string describe() const;

 private:
  void scalar(const std::string &tag, double value, int64_t step);
  void csv_row(const std::string &tag, double value, int64_t step);
  std::unique_ptr<EventFileWriter> tensorboard_;
  std::string tensorboard_dir_, csv_dir_;
  std::set<std::string> csv_files_;  // files this process has checked for a header
};

// How the job layer tells the run's Reporter which outputs [monitor] asked
// for: the trainer builds the Reporter from the run directory alone, so
// the settings wait here under that directory until it does.
void set_run_monitors(const std::string &run_dir, const config::MonitorSettings &m);
std::optional<config::MonitorSettings> run_monitors(const std::string &run_dir);

}  // namespace tessera
