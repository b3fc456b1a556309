// The engine's own config sections, declared with the same tsr_param_decl
// tables plugins use, and the typed settings resolved from them.
#pragma once

#include <tessera/abi.h>

#include <span>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace tessera::config {

struct ScheduleSettings {
  std::string type;  // constant | warmup | warmup_decay | warmup_cosine | one_cycle
  int64_t warmup_steps = 0;
  std::string warmup_type;  // linear | log
  double warmup_min_lr = 0;
  double warmup_min_ratio = 0;
  double cos_min_ratio = 0;
  int64_t total_steps = 0;  // 0: the run's total
  double cycle_min_lr = 0, cycle_max_lr = 0, decay_lr_rate = 0;
  int64_t cycle_first_step_size = 0, cycle_second_step_size = 0, decay_step_size = 0;
};

struct Fp16Settings {
  double initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  double min_loss_scale = 1;
  double loss_scale = 0;  // 0: dynamic
};

// [monitor] (monitor_section.cpp): the directories DeepSpeed's monitor
// outputs write into; "" when that output is off.
struct MonitorSettings {
  std::string tensorboard_dir;
  std::string csv_dir;
};

struct Settings {
  // [run]
  std::string name, device, precision, dir;
  std::vector<std::string> plugin_path;
  int64_t seed = 42, epochs = 0, steps = 0, log_every = 50, eval_every = 0, threads = 0;
  double gradient_clipping = 0;
  uint64_t max_gpu_memory = 0;  // bytes; 0: no cap
  // [batch]
  int64_t global_batch = 0, micro_batch = 0, accumulation = 0;
  // [data]
  int64_t workers = 1, prefetch = 2;
  ScheduleSettings schedule;
  Fp16Settings fp16;
  // [comm]
  int64_t comm_timeout_s = 300;
  int64_t comm_heartbeat_timeout_s = 20;  // 0: off
  std::string comm_interface;
  bool comm_shm = true;  // CPU collectives through /dev/shm when every rank is on one host
  // [checkpoint]
  std::string ckpt_dir, resume;
  int64_t ckpt_every = 0, ckpt_keep = 0;
  bool ckpt_final = true;             // checkpoint.final: save after the last step
  bool ckpt_allow_nonfinite = false;  // checkpoint.allow_nonfinite: resume from NaN/inf values
  // [log] (log_section.cpp)
  bool log_breakdown = false, log_plot = true;
  std::string log_trace;                    // resolved path; "" = no trace
  int64_t trace_first = 0, trace_last = 0;  // inclusive steps; 0: the default window
  double peak_tflops = 0;                   // per rank; 0: unknown
  MonitorSettings monitor;
};

// "24GiB", "500MB", "1e9" -> bytes ("" -> 0); a bad size throws ConfigError
// naming `where`.
uint64_t parse_bytes(const std::string &text, const std::string &where);

// Declared keys of each engine section.
struct EngineSection {
  const char *name;
  std::span<const tsr_param_decl> decls;
  std::vector<std::string> passthrough;  // sub-sections or "plugin"
};
const std::vector<EngineSection> &engine_sections();

// [log] (log_section.cpp): its declarations, and its resolution into `s`
// (after run.dir is known; the trace path is resolved against it in `log`).
std::span<const tsr_param_decl> log_decls();
void resolve_log(toml::table &log, Settings &s, const std::string &where);

// [monitor] (monitor_section.cpp): its sub-sections, and their resolution
// into `s` (after run.dir is known); `monitor` gets the resolved keys.
std::vector<std::string> monitor_subsections();
void resolve_monitor(const Document &doc, Settings &s, toml::table &monitor);

// Plugin slots: the section name, its kind, the default plugin ("" when
// the section is required or optional without default) and whether the
// run needs it.
struct PluginSlot {
  const char *section;
  const char *kind;
  const char *default_plugin;
  bool required_for_train;
};
const std::vector<PluginSlot> &plugin_slots();

// Validates the engine sections of `doc` and resolves the batch rule for
// `world_size`. Unknown top-level sections are errors too. Evaluation
// (`training` false) needs only batch.micro: the rule is for training.
Settings resolve_settings(const Document &doc, uint32_t world_size, toml::table *resolved_out,
                          bool training = true);

// Derives (global, micro, accumulation) from what was given, with
// DeepSpeed's rule global = micro * accumulation * world; a mismatch throws
// with all four numbers.
void resolve_batch(int64_t &global, int64_t &micro, int64_t &accumulation, uint32_t world_size,
                   const std::string &where);

}  // namespace tessera::config
