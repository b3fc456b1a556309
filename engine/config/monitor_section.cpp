// [monitor]: DeepSpeed's monitor outputs. [monitor.tensorboard] writes
// TensorBoard event files and [monitor.csv_monitor] one CSV file per metric,
// both into output_path/job_name (DeepSpeed's "tensorboard" and
// "csv_monitor" keys map here); W&B and Comet are refused: tessera has no
// client for them.
#include <filesystem>
#include <tessera/cpp/plugin.hpp>

#include "config/settings.hpp"
#include "config/validate.hpp"

namespace tessera::config {

namespace {

using sdk::param;

const tsr_param_decl kTensorboard[] = {
    param("enabled", TSR_PARAM_BOOL, "false",
          "write TensorBoard event files of loss, lr, throughput and eval metrics"),
    param("output_path", TSR_PARAM_STRING, "\"\"",
          "directory the job's log directory goes in; empty: the run directory"),
    param("job_name", TSR_PARAM_STRING, "\"\"",
          "the log directory under output_path; empty: \"tensorboard\""),
};
const tsr_param_decl kCsv[] = {
    param("enabled", TSR_PARAM_BOOL, "false",
          "write one CSV file per metric (step,value rows), as DeepSpeed's csv_monitor"),
    param("output_path", TSR_PARAM_STRING, "\"\"",
          "directory the job's CSV directory goes in; empty: the run directory"),
    param("job_name", TSR_PARAM_STRING, "\"\"",
          "the CSV directory under output_path; empty: \"csv_monitor\""),
};

// The output's directory, or "" when it is off; `t` gets the resolved keys.
std::string resolve_output(const Document &doc, const std::string &section,
                           std::span<const tsr_param_decl> decls, const char *default_job,
                           const std::string &run_dir, toml::table &t) {
  t = validate_section(doc, section, decls);
  if (!t["enabled"].value_or(false)) return "";
  std::string base = t["output_path"].value_or(std::string());
  std::string job = t["job_name"].value_or(std::string());
  if (base.empty()) base = run_dir;
  if (job.empty()) job = default_job;
  const std::string dir = (std::filesystem::path(base) / job).string();
  t.insert_or_assign("output_path", base);
  t.insert_or_assign("job_name", job);
  return dir;
}

}  // namespace

std::vector<std::string> monitor_subsections() {
  return {"tensorboard", "csv_monitor", "wandb", "comet"};
}

void resolve_monitor(const Document &doc, Settings &s, toml::table &monitor) {
  for (const char *other : {"wandb", "comet"}) {
    const std::string key = std::string("monitor.") + other;
    const toml::node *n = find(doc.root(), key);
    if (!n || !n->is_table()) continue;
    if (!(*n->as_table())["enabled"].value_or(false)) continue;  // off: nothing to refuse
    throw ConfigError(doc.where(key, n) + ": " + key + ": " +
                      (std::string(other) == "wandb" ? "Weights & Biases" : "Comet") +
                      " is not supported (tessera has no client for it); use "
                      "monitor.tensorboard (`wandb sync --sync-tensorboard DIR` uploads its "
                      "event files) or monitor.csv_monitor, or set enabled = false");
  }
  toml::table tb, csv;
  s.monitor.tensorboard_dir =
      resolve_output(doc, "monitor.tensorboard", kTensorboard, "tensorboard", s.dir, tb);
  s.monitor.csv_dir = resolve_output(doc, "monitor.csv_monitor", kCsv, "csv_monitor", s.dir, csv);
  monitor.insert_or_assign("tensorboard", std::move(tb));
  monitor.insert_or_assign("csv_monitor", std::move(csv));
}

}  // namespace tessera::config
