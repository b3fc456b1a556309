#include "train/report.hpp"

#include <filesystem>

#include "util/error.hpp"

namespace tessera {

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
  metrics_.open(dir_ + "/metrics.jsonl", std::ios::trunc);
  if (!metrics_) throw Error(TSR_ERR_IO, dir_ + "/metrics.jsonl: cannot open for writing");
}

void Reporter::append(const nlohmann::json &line) {
  metrics_ << line.dump() << "\n";
  metrics_.flush();
}

void Reporter::progress(int64_t step, int64_t epoch, double loss, double lr, double sps,
                        double elapsed) {
  if (!primary_) return;
  double eta =
      step > 0 ? elapsed / static_cast<double>(step) * static_cast<double>(total_ - step) : -1;
  int width = static_cast<int>(std::to_string(total_).size());
  std::printf("step %*lld/%lld | epoch %lld | loss %.4f | lr %.3e | %.0f samples/s | ETA %s\n",
              width, static_cast<long long>(step), static_cast<long long>(total_),
              static_cast<long long>(epoch), loss, lr, sps, format_duration(eta).c_str());
  std::fflush(stdout);
  append({{"type", "train"},
          {"step", step},
          {"epoch", epoch},
          {"loss", loss},
          {"lr", lr},
          {"samples_per_s", sps},
          {"elapsed_s", elapsed}});
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
}

void Reporter::write_summary(const nlohmann::json &summary) {
  if (!primary_) return;
  std::string tmp = dir_ + "/summary.json.tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << summary.dump(2) << "\n";
    if (!out) throw Error(TSR_ERR_IO, tmp + ": write failed");
  }
  std::filesystem::rename(tmp, dir_ + "/summary.json");
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
  std::printf("  peak memory      %.1f MiB (engine allocations)\n",
              num("peak_memory_bytes") / 1048576.0);
  if (s.contains("checkpoint") && s["checkpoint"].is_string())
    std::printf("  checkpoint       %s\n", s["checkpoint"].get<std::string>().c_str());
  std::printf("  run directory    %s\n", dir_.c_str());
  std::fflush(stdout);
}

}  // namespace tessera
