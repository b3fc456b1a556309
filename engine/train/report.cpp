#include "train/report.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "train/monitor.hpp"
#include "train/run_lock.hpp"
#include "util/error.hpp"

namespace tessera {

namespace {

// The run report's extra lines (observe.cpp fills these summary fields).
std::string si(double v, const char *unit) {
  static const char *prefixes[] = {"", "k", "M", "G", "T", "P"};
  size_t i = 0;
  while (std::fabs(v) >= 1000 && i + 1 < std::size(prefixes)) {
    v /= 1000;
    ++i;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3g %s%s", v, prefixes[i], unit);
  return buf;
}

void print_compute(const nlohmann::json &s) {
  if (!s.contains("flops_per_s") || !s["flops_per_s"].is_number()) return;
  std::string line = si(s["flops_per_s"].get<double>(), "FLOP/s") + " achieved";
  if (s.value("world_size", 1) > 1)
    line += " (" + si(s["flops_per_s_per_rank"].get<double>(), "FLOP/s") + " per rank)";
  if (s.contains("mfu") && s["mfu"].is_number()) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "; MFU %.1f%% of %g TFLOP/s per rank",
                  100.0 * s["mfu"].get<double>(), s["peak_tflops"].get<double>());
    line += buf;
  } else {
    line += "; MFU: set log.peak_tflops to the device's peak";
  }
  std::printf("  compute          %s\n", line.c_str());
}

void print_breakdown(const nlohmann::json &s) {
  if (!s.contains("time_breakdown") || !s["time_breakdown"].is_object()) return;
  const auto &b = s["time_breakdown"];
  const double total = b.value("total", 0.0);
  if (!(total > 0)) return;
  static const char *keys[][2] = {{"data", "data"},           {"forward", "forward"},
                                  {"backward", "backward"},   {"comm_wait", "comm wait"},
                                  {"optimizer", "optimizer"}, {"checkpoint", "checkpoint"},
                                  {"eval", "eval"},           {"other", "other"}};
  std::string line;
  for (const auto &k : keys) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s %.0f%%", line.empty() ? "" : " | ", k[1],
                  100.0 * b.value(k[0], 0.0) / total);
    line += buf;
  }
  char dur[32];
  if (total < 60)
    std::snprintf(dur, sizeof dur, "%.3g s", total);
  else
    std::snprintf(dur, sizeof dur, "%s", format_duration(total).c_str());
  std::printf("  time (rank 0)    %s of %s\n", line.c_str(), dur);
}

void print_memory_by_rank(const nlohmann::json &s) {
  if (!s.contains("peak_memory_by_rank") || !s["peak_memory_by_rank"].is_array()) return;
  const auto &ranks = s["peak_memory_by_rank"];
  const size_t shown = std::min<size_t>(ranks.size(), 8);
  for (size_t i = 0; i < shown; ++i) {
    const auto &r = ranks[i];
    std::string line;
    // The host's purposes (purpose_name), in the order of docs/architecture.md's memory table.
    for (const char *k :
         {"parameters", "gradients", "optimizer state", "activations", "communication", "other"}) {
      if (!r.contains(k) || !r[k].is_number() || r[k].get<double>() <= 0) continue;
      char buf[96];
      std::snprintf(buf, sizeof buf, "%s%s %.2f MiB", line.empty() ? "" : ", ", k,
                    r[k].get<double>() / 1048576.0);
      line += buf;
    }
    std::printf("    rank %-9d %s; process RSS %.0f MiB\n", r.value("rank", 0), line.c_str(),
                r.value("rss", 0.0) / 1048576.0);
  }
  if (ranks.size() > shown)
    std::printf("    (%zu more ranks in summary.json)\n", ranks.size() - shown);
}

void print_files(const nlohmann::json &s) {
  if (!s.contains("files") || !s["files"].is_object()) return;
  const auto &f = s["files"];
  auto show = [&](const char *key, const char *label, const char *hint) {
    if (f.contains(key) && f[key].is_string())
      std::printf("  %-16s %s%s\n", label, f[key].get<std::string>().c_str(), hint);
  };
  show("summary", "summary", "");
  show("metrics", "metrics", "");
  show("plot", "plot", "  (open in a browser; 'tessera plot DIR...' compares runs)");
  show("trace", "trace", "  (open in ui.perfetto.dev or chrome://tracing)");
}

}  // namespace

std::string format_duration(double s) {
  if (s < 0 || !std::isfinite(s)) return "?";
  long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

Reporter::Reporter(const std::string &run_dir, bool primary, int64_t total_steps)
    : dir_(run_dir), primary_(primary), total_(total_steps) {
  if (!primary_) return;
  metrics_ = MetricsLog(dir_);
  if (auto m = run_monitors(dir_)) {
    monitors_ = std::make_unique<Monitors>(*m);
    if (std::string what = monitors_->describe(); !what.empty())
      std::printf("tessera: monitor: %s\n", what.c_str());
  }
}

Reporter::~Reporter() = default;

void Reporter::append(const nlohmann::json &line) {
  metrics_.append(line);
}

std::string format_breakdown(const nlohmann::json &b) {
  const double total = b.value("total", 0.0);
  const double steps = std::max(1.0, b.value("steps", 1.0));
  if (!(total > 0)) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g ms/step:", total / steps * 1e3);
  std::string out = buf;
  // The step's own parts always; checkpoint, eval and other when they show.
  static const char *keys[][2] = {
      {"data", "data"},     {"forward", "fwd"},     {"backward", "bwd"}, {"comm_wait", "comm"},
      {"optimizer", "opt"}, {"checkpoint", "ckpt"}, {"eval", "eval"},    {"other", "other"}};
  for (size_t i = 0; i < std::size(keys); ++i) {
    double pct = 100.0 * b.value(keys[i][0], 0.0) / total;
    if (i >= 5 && pct < 0.5) continue;
    std::snprintf(buf, sizeof buf, " %s %.0f%%", keys[i][1], pct);
    out += buf;
  }
  // An offloaded update runs beside the step: its parts in ms per step.
  if (b.contains("offload") && b["offload"].is_object()) {
    const auto &o = b["offload"];
    std::snprintf(buf, sizeof buf, " | offload ms/step:");
    out += buf;
    static const char *parts[][2] = {{"d2h", "d2h"},
                                     {"cpu_step", "cpu"},
                                     {"h2d", "h2d"},
                                     {"device_share", "gpu share"},
                                     {"wait", "waited"}};
    for (const auto &p : parts) {
      std::snprintf(buf, sizeof buf, " %s %.0f", p[1], o.value(p[0], 0.0) / steps * 1e3);
      out += buf;
    }
    // CUDA: the GPU's own idle time at those waits, from its events.
    if (o.contains("gpu_waited")) {
      std::snprintf(buf, sizeof buf, " (gpu idle %.0f)", o.value("gpu_waited", 0.0) / steps * 1e3);
      out += buf;
    }
  }
  return out;
}

void Reporter::progress(int64_t step, int64_t epoch, double loss, double lr, double sps,
                        double elapsed, const nlohmann::json &extra) {
  if (!primary_) return;
  double eta =
      step > 0 ? elapsed / static_cast<double>(step) * static_cast<double>(total_ - step) : -1;
  int width = static_cast<int>(std::to_string(total_).size());
  std::string tail;
  if (extra.contains("breakdown")) tail = " | " + format_breakdown(extra["breakdown"]);
  std::printf("step %*lld/%lld | epoch %lld | loss %.4f | lr %.3e | %.0f samples/s | ETA %s%s\n",
              width, static_cast<long long>(step), static_cast<long long>(total_),
              static_cast<long long>(epoch), loss, lr, sps, format_duration(eta).c_str(),
              tail.c_str());
  std::fflush(stdout);
  nlohmann::json line = {{"type", "train"},     {"step", step}, {"epoch", epoch},
                         {"loss", loss},        {"lr", lr},     {"samples_per_s", sps},
                         {"elapsed_s", elapsed}};
  // Wall-clock seconds since the epoch, so a line lines up with what other
  // tools sampled meanwhile (iostat, nvidia-smi, /proc/PID/io).
  line["time"] =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (const auto &[k, v] : extra.items()) line[k] = v;
  append(line);
  if (monitors_) monitors_->train(step, loss, lr, sps);
}

void Reporter::eval(int64_t step, int64_t epoch, const EvalResult &r) {
  if (!primary_) return;
  if (r.accuracy >= 0)
    std::printf("eval at step %lld | loss %.4f | accuracy %.4f | %lld samples\n",
                static_cast<long long>(step), r.loss, r.accuracy, static_cast<long long>(r.count));
  else
    std::printf("eval at step %lld | loss %.4f | %lld samples\n", static_cast<long long>(step),
                r.loss, static_cast<long long>(r.count));
  std::fflush(stdout);
  nlohmann::json j = {{"type", "eval"},
                      {"step", step},
                      {"epoch", epoch},
                      {"eval_loss", r.loss},
                      {"samples", r.count}};
  if (r.accuracy >= 0) j["eval_accuracy"] = r.accuracy;
  append(j);
  if (monitors_) monitors_->eval(step, r.loss, r.accuracy);
}

void Reporter::write_summary(const nlohmann::json &given) {
  if (!primary_) return;
  nlohmann::json summary = given;
  summary["metrics_lost"] = metrics_.lost();
  std::string tmp = dir_ + "/summary.json.tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << summary.dump(2) << "\n";
    if (!out) throw Error(TSR_ERR_IO, tmp + ": write failed");
  }
  std::filesystem::rename(tmp, dir_ + "/summary.json");
}

std::string write_failed_summary(const std::string &run_dir, const std::string &name,
                                 const std::string &reason, int failed_rank, uint32_t world_size,
                                 bool unless_held) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) return "";
  // A run.dir another job holds is that job's: a job refused by its lock
  // (or failing beside it) writes nothing there, not even its failure.
  if (unless_held && run_dir_held_by_another(run_dir)) return "";
  const std::string path = run_dir + "/summary.json";
  nlohmann::json s = nlohmann::json::object();
  {
    std::ifstream in(path);
    if (in) s = nlohmann::json::parse(in, nullptr, false);
    if (!s.is_object()) s = nlohmann::json::object();
  }
  if (!s.contains("name")) s["name"] = name;
  if (!s.contains("world_size")) s["world_size"] = world_size;
  s["status"] = "failed";
  s["reason"] = reason;
  s["failed_rank"] = failed_rank >= 0 ? nlohmann::json(failed_rank) : nlohmann::json(nullptr);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << s.dump(2) << "\n";
    if (!out) return "";
  }
  fs::rename(tmp, path, ec);
  return ec ? "" : path;
}

void Reporter::print_summary(const nlohmann::json &s) {
  if (!primary_) return;
  auto num = [&](const char *k) {
    return s.contains(k) && s[k].is_number() ? s[k].get<double>() : -1.0;
  };
  std::printf("\n== summary ==\n");
  std::printf("  steps            %lld (%lld samples)\n", static_cast<long long>(num("steps")),
              static_cast<long long>(num("samples")));
  std::printf("  train loss       %.4f\n", num("train_loss"));
  if (s.contains("eval_loss") && !s["eval_loss"].is_null())
    std::printf("  eval loss        %.4f\n", num("eval_loss"));
  if (s.contains("eval_accuracy") && !s["eval_accuracy"].is_null())
    std::printf("  eval accuracy    %.4f\n", num("eval_accuracy"));
  std::printf("  throughput       %.0f samples/s\n", num("samples_per_s"));
  std::printf("  wall time        %s (training %s)\n", format_duration(num("wall_s")).c_str(),
              format_duration(num("train_s")).c_str());
  print_compute(s);
  print_breakdown(s);
  std::printf("  peak memory      %.1f MiB (engine allocations)\n",
              num("peak_memory_bytes") / 1048576.0);
  print_memory_by_rank(s);
  if (s.contains("checkpoint") && s["checkpoint"].is_string())
    std::printf("  checkpoint       %s\n", s["checkpoint"].get<std::string>().c_str());
  std::printf("  run directory    %s\n", dir_.c_str());
  print_files(s);
  std::fflush(stdout);
}

}  // namespace tessera
