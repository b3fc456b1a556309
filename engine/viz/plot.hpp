// Plots of runs from their metrics.jsonl: loss (train and eval), eval
// accuracy, learning rate, throughput, memory and (fp16) the loss scale,
// against step, one colour per run so several runs overlay.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera::viz {

struct RunMetrics {
  std::string label;  // the legend's name for it (the run directory's name)
  std::string dir;
  std::vector<nlohmann::json> lines;
  int skipped = 0;  // lines that did not parse (a run still writing its last one)
};

// Reads DIR/metrics.jsonl; throws when it is missing.
RunMetrics load_run_metrics(const std::string &dir);

// The SVG document. Every series is a <polyline> (markers for sparse ones)
// carrying data-panel, data-series and data-run attributes, so a test or a
// script can find it without rendering.
std::string render_plot(const std::vector<RunMetrics> &runs);

// Renders and writes `path` atomically (a viewer never sees half a file).
void write_plot(const std::vector<RunMetrics> &runs, const std::string &path);

}  // namespace tessera::viz
