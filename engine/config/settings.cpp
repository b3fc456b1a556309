// The engine's config schema and its resolution into typed settings.
#include "config/settings.hpp"

#include <cctype>
#include <cstdlib>
#include <tessera/cpp/meminfo.hpp>
#include <tessera/cpp/plugin.hpp>

#include "config/validate.hpp"

namespace tessera::config {

using sdk::param;
using sdk::param_choice;
using sdk::param_min;
using sdk::param_number_or;
using sdk::param_range;

namespace {

const tsr_param_decl kRun[] = {
    param("name", TSR_PARAM_STRING, "\"tessera\"",
          "run name; the run directory defaults to runs/<name>"),
    param_choice("device", "\"auto\"", "where compute runs: auto picks cuda when a GPU is present",
                 "auto|cpu|cuda"),
    param_choice("precision", "\"fp32\"",
                 "compute precision; bf16 and fp16 keep fp32 master weights", "fp32|bf16|fp16"),
    param_min("seed", TSR_PARAM_INT, "42", "seed for initialisation, shuffling and dropout", 0),
    param_min("epochs", TSR_PARAM_INT, "0", "epochs to train (used when steps = 0)", 0),
    param_min("steps", TSR_PARAM_INT, "0", "optimizer steps to train; 0: derive from epochs", 0),
    param_min("log_every", TSR_PARAM_INT, "50", "print progress and write metrics every N steps",
              1),
    param_min("eval_every", TSR_PARAM_INT, "0",
              "evaluate every N steps; 0: at the end of each epoch", 0),
    param("dir", TSR_PARAM_STRING, "\"\"", "run directory; empty: runs/<name>"),
    param("plugin_path", TSR_PARAM_STRING_ARRAY, "[]",
          "extra directories searched for plugins, relative to the config file"),
    param("deepspeed", TSR_PARAM_STRING, "\"\"",
          "a DeepSpeed JSON config layered on top of this file"),
    // Bounded: each thread is a stack and a share of every op; a number
    // beyond any machine is a typo, refused before a thread is made.
    param_range("threads", TSR_PARAM_INT, "0", "CPU threads per rank; 0: cores / local ranks", 0,
                4096),
    param_min("gradient_clipping", TSR_PARAM_FLOAT, "0.0",
              "clip gradients to this global L2 norm; 0: off", 0),
    // A number of bytes or a size with its unit ("#|*": parse_bytes reads the text).
    param_number_or("max_gpu_memory", "\"\"",
                    "cap on the GPU memory one rank may allocate (\"24GiB\", \"500MB\", bytes); "
                    "empty: no cap",
                    0, 1e18, "#|*"),
};
const tsr_param_decl kBatch[] = {
    param_min("global", TSR_PARAM_INT, "0",
              "samples per optimizer step over all ranks (DeepSpeed train_batch_size); 0: micro x "
              "accumulation x world",
              0),
    param_min("micro", TSR_PARAM_INT, "0",
              "samples per forward pass per rank (DeepSpeed train_micro_batch_size_per_gpu)", 0),
    param_min("accumulation", TSR_PARAM_INT, "0",
              "micro-batches per step (DeepSpeed gradient_accumulation_steps); 0: derived", 0),
};
const tsr_param_decl kData[] = {
    param_range("workers", TSR_PARAM_INT, "1", "loader threads per rank", 0, 256),
    param_range("prefetch", TSR_PARAM_INT, "2", "batches prepared ahead of the step", 1, 1024),
};
const tsr_param_decl kSchedule[] = {
    param_choice("type", "\"constant\"", "learning-rate schedule",
                 "constant|warmup|warmup_decay|warmup_cosine|one_cycle"),
    param_min("warmup_steps", TSR_PARAM_INT, "0", "steps of warmup (DeepSpeed warmup_num_steps)",
              0),
    param_choice("warmup_type", "\"linear\"", "shape of the warmup ramp", "linear|log"),
    param_min("warmup_min_lr", TSR_PARAM_FLOAT, "0.0", "lr at step 0 for warmup and warmup_decay",
              0),
    param_range("warmup_min_ratio", TSR_PARAM_FLOAT, "0.0",
                "warmup_cosine: start lr as a fraction of optimizer.lr", 0, 1),
    param_range("cos_min_ratio", TSR_PARAM_FLOAT, "0.0",
                "warmup_cosine: final lr as a fraction of optimizer.lr", 0, 1),
    param_min("total_steps", TSR_PARAM_INT, "0", "steps the decay spans; 0: the run's total", 0),
    param_min("cycle_min_lr", TSR_PARAM_FLOAT, "0.0", "one_cycle: lowest lr", 0),
    param_min("cycle_max_lr", TSR_PARAM_FLOAT, "0.0", "one_cycle: peak lr; 0: optimizer.lr", 0),
    param_min("cycle_first_step_size", TSR_PARAM_INT, "2000", "one_cycle: steps from min to max",
              1),
    param_min("cycle_second_step_size", TSR_PARAM_INT, "0",
              "one_cycle: steps from max back to min; 0: same as first", 0),
    param_min("decay_lr_rate", TSR_PARAM_FLOAT, "0.0", "one_cycle: decay rate after the cycle", 0),
    param_min("decay_step_size", TSR_PARAM_INT, "0",
              "one_cycle: decay interval after the cycle; 0: no decay", 0),
};
const tsr_param_decl kFp16[] = {
    param_range("initial_scale_power", TSR_PARAM_FLOAT, "16", "initial loss scale is 2^this", 0,
                64),
    param_min("loss_scale_window", TSR_PARAM_INT, "1000",
              "steps without overflow before the scale doubles", 1),
    param_min("hysteresis", TSR_PARAM_INT, "2", "overflows tolerated before the scale halves", 1),
    param_min("min_loss_scale", TSR_PARAM_FLOAT, "1.0", "the scale never drops below this", 0),
    param_min("loss_scale", TSR_PARAM_FLOAT, "0.0", "a fixed loss scale; 0: dynamic", 0),
};
const tsr_param_decl kCheckpoint[] = {
    param("dir", TSR_PARAM_STRING, "\"\"", "where checkpoints go; empty: <run dir>/ckpt"),
    param_min("every", TSR_PARAM_INT, "0", "save every N steps; 0: only at the end", 0),
    param_min("keep", TSR_PARAM_INT, "3", "checkpoints kept; older ones are removed", 1),
    param("final", TSR_PARAM_BOOL, "true",
          "save a checkpoint after the last step; false: only every N steps and on a signal "
          "(benchmarks of large models)"),
    param("resume", TSR_PARAM_STRING, "\"\"",
          "\"auto\": continue from the latest checkpoint in dir, if any; a path: from that "
          "checkpoint; empty: start fresh"),
    param("allow_nonfinite", TSR_PARAM_BOOL, "false",
          "resume from a checkpoint whose weights or optimizer state hold NaN or infinity "
          "(refused by default, naming the value)"),
};

const tsr_param_decl kComm[] = {
    // Durations bounded by a week: a larger number is a typo, and seconds
    // past 2^63 ns overflow the clocks they are added to.
    param_range("timeout_s", TSR_PARAM_INT, "300",
                "seconds a collective or the rendezvous may wait before the job fails", 1, 604800),
    param_range("heartbeat_timeout_s", TSR_PARAM_INT, "20",
                "seconds without a heartbeat (twice a second) after which a rank is named as "
                "stopped (SIGSTOP, a hung host) and the job fails; 0: off",
                0, 604800),
    param("interface", TSR_PARAM_STRING, "\"\"",
          "network interface Gloo binds to (also GLOO_SOCKET_IFNAME); empty: the route to the "
          "master"),
    param("shm", TSR_PARAM_BOOL, "true",
          "CPU collectives through shared memory when every rank is on this host; false: Gloo "
          "over TCP always"),
};

// "run.log_every" for "log_every": a key given without its section (as in
// `--set log_every=100`), found among the engine sections' keys; "" when
// no section declares it.
std::string section_of_key(const std::string &key) {
  for (const auto &sec : engine_sections())
    for (const auto &d : sec.decls)
      if (key == d.name) return std::string(sec.name) + "." + key;
  return "";
}

}  // namespace

uint64_t parse_bytes(const std::string &text, const std::string &where) {
  if (text.empty()) return 0;
  // The grammar plugins read too (TESSERA_HOST_MEMORY_AVAILABLE): one parser.
  uint64_t bytes = 0;
  if (sdk::parse_size(text, &bytes)) return bytes;
  throw ConfigError(where + " = \"" + text +
                    "\": expected a positive size such as \"24GiB\", \"500MB\" or a byte count");
}

const std::vector<EngineSection> &engine_sections() {
  static const std::vector<EngineSection> s = {
      {"run", kRun, {}},           {"batch", kBatch, {}},    {"data", kData, {"train", "eval"}},
      {"schedule", kSchedule, {}}, {"fp16", kFp16, {}},      {"checkpoint", kCheckpoint, {}},
      {"comm", kComm, {}},         {"log", log_decls(), {}}, {"monitor", {}, monitor_subsections()},
  };
  return s;
}

const std::vector<PluginSlot> &plugin_slots() {
  static const std::vector<PluginSlot> s = {
      {"model", TSR_KIND_MODEL, "", true},
      {"data.train", TSR_KIND_DATASET, "", true},
      {"data.eval", TSR_KIND_DATASET, "", false},
      {"sampler", TSR_KIND_SAMPLER, "distributed", true},
      {"optimizer", TSR_KIND_OPTIMIZER, "", true},
      {"zero", TSR_KIND_ZERO, "stage0", true},
      {"offload", TSR_KIND_OFFLOAD, "none", true},
  };
  return s;
}

void resolve_batch(int64_t &global, int64_t &micro, int64_t &accum, uint32_t world,
                   const std::string &where) {
  const int64_t w = world;
  auto mismatch = [&](const std::string &why) {
    throw ConfigError(
        where + ": batch sizes do not fit: global (train_batch_size) = " + std::to_string(global) +
        ", micro (train_micro_batch_size_per_gpu) = " + std::to_string(micro) +
        ", accumulation (gradient_accumulation_steps) = " + std::to_string(accum) +
        ", world size = " + std::to_string(w) + "; need global = micro x accumulation x world (" +
        why + ")");
  };
  if (global > 0 && micro > 0 && accum > 0) {
    if (global != micro * accum * w)
      mismatch(std::to_string(micro * accum * w) + " != " + std::to_string(global));
  } else if (global > 0 && micro > 0) {
    if (global % (micro * w) != 0) mismatch("global is not a multiple of micro x world");
    accum = global / (micro * w);
  } else if (global > 0 && accum > 0) {
    if (global % (accum * w) != 0) mismatch("global is not a multiple of accumulation x world");
    micro = global / (accum * w);
  } else if (micro > 0) {
    if (accum == 0) accum = 1;
    global = micro * accum * w;
  } else if (global > 0) {
    accum = 1;
    if (global % w != 0) mismatch("global is not a multiple of world");
    micro = global / w;
  } else {
    throw ConfigError(where +
                      ": [batch] needs 'global' or 'micro' (DeepSpeed train_batch_size or "
                      "train_micro_batch_size_per_gpu)");
  }
  if (micro <= 0 || accum <= 0) mismatch("micro and accumulation must be at least 1");
}

namespace {

// Top-level names must be engine sections or plugin slots.
void check_top_level(const Document &doc) {
  std::vector<std::string> known;
  for (const auto &s : engine_sections()) known.push_back(s.name);
  for (const auto &p : plugin_slots())
    if (std::string(p.section).find('.') == std::string::npos) known.push_back(p.section);
  for (const auto &[k, v] : doc.root()) {
    std::string key(k.str());
    bool ok = false;
    for (const auto &n : known) ok |= (n == key);
    if (!ok) {
      std::string msg = doc.where(key, &v) + ": unknown section or key '" + key + "'";
      std::string dym = did_you_mean(key, known);
      if (dym.empty()) dym = section_of_key(key);
      if (!dym.empty()) msg += "; did you mean '" + dym + "'?";
      throw ConfigError(msg);
    }
  }
}

// The engine's sections, validated (defaults filled in), and typed reads
// of their keys.
struct EngineSections {
  toml::table all;
  std::string str(const char *sec, const char *key) {
    return std::string(all[sec][key].value_or(std::string()));
  }
  int64_t i64(const char *sec, const char *key) { return all[sec][key].value_or(int64_t{0}); }
  double f64(const char *sec, const char *key) { return all[sec][key].value_or(0.0); }
};

void read_run(EngineSections &c, const Document &doc, Settings &s) {
  s.name = c.str("run", "name");
  s.device = c.str("run", "device");
  s.precision = c.str("run", "precision");
  s.dir = c.str("run", "dir");
  if (s.dir.empty()) s.dir = "runs/" + s.name;
  if (auto *arr = c.all["run"]["plugin_path"].as_array())
    for (const auto &e : *arr) s.plugin_path.push_back(e.value_or(std::string()));
  s.seed = c.i64("run", "seed");
  s.epochs = c.i64("run", "epochs");
  s.steps = c.i64("run", "steps");
  s.log_every = c.i64("run", "log_every");
  s.eval_every = c.i64("run", "eval_every");
  s.threads = c.i64("run", "threads");
  s.gradient_clipping = c.f64("run", "gradient_clipping");
  s.max_gpu_memory =
      parse_bytes(c.str("run", "max_gpu_memory"),
                  doc.where("run.max_gpu_memory", find(doc.root(), "run.max_gpu_memory")) +
                      ": run.max_gpu_memory");
}

// [batch], fitted to the world size; the resolved config gets all three.
void read_batch(EngineSections &c, const Document &doc, Settings &s, uint32_t world,
                bool training) {
  s.global_batch = c.i64("batch", "global");
  s.micro_batch = c.i64("batch", "micro");
  s.accumulation = c.i64("batch", "accumulation");
  if (!training && s.micro_batch > 0) {
    // Evaluation reads batches of micro and nothing else, so a run's own
    // config.toml (resolved for its world size) evaluates at any.
    s.accumulation = 1;
    s.global_batch = s.micro_batch * world;
  } else {
    resolve_batch(s.global_batch, s.micro_batch, s.accumulation, world,
                  doc.where("batch", find(doc.root(), "batch")));
  }
  c.all["batch"].as_table()->insert_or_assign("global", s.global_batch);
  c.all["batch"].as_table()->insert_or_assign("micro", s.micro_batch);
  c.all["batch"].as_table()->insert_or_assign("accumulation", s.accumulation);
}

void read_schedule(EngineSections &c, ScheduleSettings &sc) {
  sc.type = c.str("schedule", "type");
  sc.warmup_steps = c.i64("schedule", "warmup_steps");
  sc.warmup_type = c.str("schedule", "warmup_type");
  sc.warmup_min_lr = c.f64("schedule", "warmup_min_lr");
  sc.warmup_min_ratio = c.f64("schedule", "warmup_min_ratio");
  sc.cos_min_ratio = c.f64("schedule", "cos_min_ratio");
  sc.total_steps = c.i64("schedule", "total_steps");
  sc.cycle_min_lr = c.f64("schedule", "cycle_min_lr");
  sc.cycle_max_lr = c.f64("schedule", "cycle_max_lr");
  sc.cycle_first_step_size = c.i64("schedule", "cycle_first_step_size");
  sc.cycle_second_step_size = c.i64("schedule", "cycle_second_step_size");
  sc.decay_lr_rate = c.f64("schedule", "decay_lr_rate");
  sc.decay_step_size = c.i64("schedule", "decay_step_size");
}

void read_fp16_and_comm(EngineSections &c, Settings &s) {
  s.fp16.initial_scale_power = c.f64("fp16", "initial_scale_power");
  s.fp16.loss_scale_window = c.i64("fp16", "loss_scale_window");
  s.fp16.hysteresis = c.i64("fp16", "hysteresis");
  s.fp16.min_loss_scale = c.f64("fp16", "min_loss_scale");
  s.fp16.loss_scale = c.f64("fp16", "loss_scale");
  s.comm_timeout_s = c.i64("comm", "timeout_s");
  s.comm_heartbeat_timeout_s = c.i64("comm", "heartbeat_timeout_s");
  s.comm_interface = c.str("comm", "interface");
  s.comm_shm = c.all["comm"]["shm"].value_or(true);
  if (s.comm_interface.empty())
    if (const char *e = std::getenv("GLOO_SOCKET_IFNAME")) s.comm_interface = e;
}

void read_checkpoint(EngineSections &c, Settings &s) {
  s.ckpt_dir = c.str("checkpoint", "dir");
  if (s.ckpt_dir.empty()) s.ckpt_dir = s.dir + "/ckpt";
  // The resolved config shows where things actually go. Its DeepSpeed JSON
  // is merged in already: naming it again would apply it twice, from a
  // path relative to another directory.
  c.all["run"].as_table()->insert_or_assign("dir", s.dir);
  c.all["run"].as_table()->insert_or_assign("deepspeed", std::string());
  c.all["checkpoint"].as_table()->insert_or_assign("dir", s.ckpt_dir);
  s.ckpt_every = c.i64("checkpoint", "every");
  s.resume = c.str("checkpoint", "resume");
  s.ckpt_keep = c.i64("checkpoint", "keep");
  s.ckpt_final = c.all["checkpoint"]["final"].value_or(true);
  s.ckpt_allow_nonfinite = c.all["checkpoint"]["allow_nonfinite"].value_or(false);
}

}  // namespace

Settings resolve_settings(const Document &doc, uint32_t world, toml::table *resolved_out,
                          bool training) {
  check_top_level(doc);
  EngineSections c;
  for (const auto &sec : engine_sections()) {
    toml::table t = validate_section(doc, sec.name, sec.decls, sec.passthrough);
    for (const auto &p : sec.passthrough) t.erase(p);
    c.all.insert_or_assign(sec.name, t);
  }
  Settings s;
  read_run(c, doc, s);
  read_batch(c, doc, s, world, training);
  s.workers = c.i64("data", "workers");
  s.prefetch = c.i64("data", "prefetch");
  read_schedule(c, s.schedule);
  read_fp16_and_comm(c, s);
  read_checkpoint(c, s);
  resolve_log(*c.all["log"].as_table(), s,
              doc.where("log.trace_steps", find(doc.root(), "log.trace_steps")));
  resolve_monitor(doc, s, *c.all["monitor"].as_table());
  if (resolved_out) *resolved_out = std::move(c.all);
  return s;
}

}  // namespace tessera::config
