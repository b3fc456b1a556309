// [log]: what a run records about itself beyond progress and metrics: the
// time breakdown, a Chrome trace of a window of steps, the plot at the end,
// and the peak FLOP/s that MFU is measured against.
#include <cstdlib>
#include <tessera/cpp/plugin.hpp>

#include "config/settings.hpp"

namespace tessera::config {

namespace {

using sdk::param;
using sdk::param_min;
using sdk::param_number_or;

const tsr_param_decl kLog[] = {
    param("breakdown", TSR_PARAM_BOOL, "false",
          "time per logged interval in data loading, forward, backward, waiting on "
          "communication, optimizer step, checkpointing and eval, in the progress line and "
          "metrics.jsonl (DeepSpeed wall_clock_breakdown)"),
    param("trace", TSR_PARAM_STRING, "\"\"",
          "write a Chrome trace (chrome://tracing, ui.perfetto.dev) of trace_steps to this file; "
          "relative to run.dir; empty: off"),
    // A step number or a window ("#|*": parse_window reads the text).
    param_number_or("trace_steps", "\"\"",
                    "steps the trace covers: \"A-B\" (inclusive), N, or \"all\"; empty: steps 2-6",
                    1, 9e18, "#|*"),
    param("plot", TSR_PARAM_BOOL, "true", "write <run dir>/plot.svg at the end of the run"),
    param_min("peak_tflops", TSR_PARAM_FLOAT, "0.0",
              "peak TFLOP/s of one rank's device, for MFU in the summary; 0: unknown (no MFU)", 0),
};

// "A-B", "N" or "all" into an inclusive window; false when malformed.
bool parse_window(const std::string &text, int64_t &first, int64_t &last) {
  if (text == "all") {
    first = 1;
    last = INT64_MAX;
    return true;
  }
  auto number = [](const std::string &t, int64_t &out) {
    if (t.empty() || t.find_first_not_of("0123456789") != std::string::npos) return false;
    out = std::strtoll(t.c_str(), nullptr, 10);
    return out >= 1;
  };
  auto dash = text.find('-');
  if (dash == std::string::npos) return number(text, first) && number(text, last);
  return number(text.substr(0, dash), first) && number(text.substr(dash + 1), last) &&
         first <= last;
}

}  // namespace

std::span<const tsr_param_decl> log_decls() {
  return kLog;
}

void resolve_log(toml::table &log, Settings &s, const std::string &where) {
  s.log_breakdown = log["breakdown"].value_or(false);
  s.log_plot = log["plot"].value_or(true);
  s.peak_tflops = log["peak_tflops"].value_or(0.0);
  std::string trace = log["trace"].value_or(std::string());
  // Relative to the run directory, like the other files a run writes; the
  // resolved config shows the path it lands at.
  if (!trace.empty() && trace[0] != '/') trace = s.dir + "/" + trace;
  s.log_trace = trace;
  log.insert_or_assign("trace", trace);
  std::string window = log["trace_steps"].value_or(std::string());
  if (!window.empty() && !parse_window(window, s.trace_first, s.trace_last))
    throw ConfigError(where + ": log.trace_steps = \"" + window +
                      "\": expected \"A-B\" (first and last step, inclusive, A <= B), \"N\" "
                      "or \"all\"");
}

}  // namespace tessera::config
