// tessera runs: a table of the runs in a directory, from each run's
// summary.json, or its metrics.jsonl while it has none.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/args.hpp"
#include "util/error.hpp"
#include "util/regular_file.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace tessera::cli {

namespace {

const char *kRunsUsage = R"(usage: tessera runs [DIR] [--json]

Lists the runs in DIR (default: runs): each subdirectory holding a
summary.json or metrics.jsonl, oldest first, with its date, steps, final
train loss, eval metric, throughput and status:

  completed    the run finished and wrote summary.json
  failed       the run failed: summary.json has the reason and the rank,
               shown as failed (rank R); --json shows the reason too
  stopped      stopped by SIGTERM or Ctrl-C after saving a checkpoint
  running      no summary yet; metrics.jsonl changed in the last 2 minutes
  incomplete   no summary, and no new metrics for longer: stopped or crashed

  --json       print the table as a JSON array instead
  -h, --help   this help

'tessera plot DIR/NAME...' draws runs; their summary.json has the rest.
)";

// Seconds without new metrics after which a run without a summary counts
// as stopped rather than running.
constexpr double kRunningWindowS = 120;

std::time_t mtime(const fs::path &p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 ? st.st_mtime : 0;
}

std::string format_date(std::time_t t) {
  if (t == 0) return "-";
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", &tm);
  return buf;
}

// "2025-01-31T14:05:09+0100" as time_t (the summary's own clock).
std::time_t parse_iso(const std::string &s) {
  std::tm tm{};
  if (!strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm)) return 0;
  tm.tm_isdst = -1;
  return std::mktime(&tm);
}

json read_json_file(const fs::path &p) {
  std::string text, why;
  if (!sdk::read_regular_file(p.string(), &text, &why)) return nullptr;
  try {
    return json::parse(text);
  } catch (const json::exception &) {
    return nullptr;
  }
}

// One row of the table.
json describe_run(const fs::path &dir) {
  json row = {{"name", dir.filename().string()}, {"dir", dir.string()}};
  json summary = read_json_file(dir / "summary.json");
  // The last train and eval lines (a live run's torn last line is skipped).
  json last_train, last_eval;
  // A run directory anyone could have written into: a FIFO in place of
  // metrics.jsonl is skipped like a missing file, never read.
  std::string metrics, why;
  if (!sdk::read_regular_file((dir / "metrics.jsonl").string(), &metrics, &why,
                              std::numeric_limits<uint64_t>::max()))
    metrics.clear();
  std::istringstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    try {
      json j = json::parse(line);
      if (j.value("type", "") == "train") last_train = j;
      if (j.value("type", "") == "eval") last_eval = j;
    } catch (const json::exception &) {
    }
  }
  std::time_t started = 0;
  if (summary.is_object() && summary.contains("started_at") && summary["started_at"].is_string())
    started = parse_iso(summary["started_at"].get<std::string>());
  // config.toml is written as a run starts.
  if (started == 0) started = mtime(dir / "config.toml");
  if (started == 0) started = mtime(dir / "metrics.jsonl");
  row["date"] = format_date(started);
  row["time"] = static_cast<int64_t>(started);

  auto pick = [&](const char *summary_key, const json &line, const char *line_key) -> json {
    if (summary.is_object() && summary.contains(summary_key) && summary[summary_key].is_number())
      return summary[summary_key];
    if (line.is_object() && line.contains(line_key) && line[line_key].is_number())
      return line[line_key];
    return nullptr;
  };
  row["steps"] = pick("steps", last_train, "step");
  row["train_loss"] = pick("train_loss", last_train, "loss");
  row["eval_accuracy"] = pick("eval_accuracy", last_eval, "eval_accuracy");
  row["eval_loss"] = pick("eval_loss", last_eval, "eval_loss");
  row["samples_per_s"] = pick("samples_per_s", last_train, "samples_per_s");
  if (summary.is_object()) {
    row["status"] = summary.value("status", "completed");
    if (row["status"] == "failed") {
      row["reason"] = summary.value("reason", "");
      row["failed_rank"] = summary.contains("failed_rank") ? summary["failed_rank"] : json(nullptr);
    }
  } else {
    const double idle = std::difftime(std::time(nullptr), mtime(dir / "metrics.jsonl"));
    row["status"] =
        fs::exists(dir / "metrics.jsonl") && idle < kRunningWindowS ? "running" : "incomplete";
  }
  return row;
}

bool is_run_dir(const fs::path &d) {
  return fs::exists(d / "summary.json") || fs::exists(d / "metrics.jsonl");
}

std::string num(const json &v, const char *fmt) {
  if (!v.is_number()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, fmt, v.get<double>());
  return buf;
}

// "failed (rank 1)" for a failed run that names its rank.
std::string status_text(const json &r) {
  std::string s = r["status"].get<std::string>();
  if (r.contains("failed_rank") && r["failed_rank"].is_number_integer())
    s += " (rank " + std::to_string(r["failed_rank"].get<int64_t>()) + ")";
  return s;
}

void print_table(const std::vector<json> &rows) {
  std::vector<std::vector<std::string>> cells = {
      {"NAME", "DATE", "STEPS", "LOSS", "EVAL", "SAMPLES/S", "STATUS"}};
  for (const auto &r : rows) {
    std::string eval = r["eval_accuracy"].is_number() ? "acc " + num(r["eval_accuracy"], "%.4f")
                       : r["eval_loss"].is_number()   ? "loss " + num(r["eval_loss"], "%.4f")
                                                      : "-";
    cells.push_back({r["name"].get<std::string>(), r["date"].get<std::string>(),
                     num(r["steps"], "%.0f"), num(r["train_loss"], "%.4f"), eval,
                     num(r["samples_per_s"], "%.0f"), status_text(r)});
  }
  std::vector<size_t> width(cells[0].size(), 0);
  for (const auto &row : cells)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  for (const auto &row : cells) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      // Numbers right-aligned, text left.
      const bool right = c >= 2 && c <= 5;
      std::string pad(width[c] - row[c].size(), ' ');
      line += right ? pad + row[c] : row[c] + (c + 1 < row.size() ? pad : "");
      if (c + 1 < row.size()) line += "  ";
    }
    std::printf("%s\n", line.c_str());
  }
}

int runs_body(const Parsed &p) {
  if (p.positional.size() > 1) throw UsageError("tessera runs: expected at most one DIR");
  const fs::path root = p.positional.empty() ? fs::path("runs") : fs::path(p.positional[0]);
  if (!fs::is_directory(root))
    throw Error(TSR_ERR_IO, root.string() +
                                ": no such directory (runs go to run.dir, default "
                                "runs/<run.name>)");
  std::vector<json> rows;
  if (is_run_dir(root)) rows.push_back(describe_run(root));  // DIR is itself a run
  std::vector<fs::path> dirs;
  for (const auto &e : fs::directory_iterator(root))
    if (e.is_directory() && is_run_dir(e.path())) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  for (const auto &d : dirs) rows.push_back(describe_run(d));
  std::stable_sort(rows.begin(), rows.end(), [](const json &a, const json &b) {
    return a["time"].get<int64_t>() < b["time"].get<int64_t>();
  });
  if (p.has("--json")) {
    std::cout << json(rows).dump(2) << std::endl;
    return 0;
  }
  if (rows.empty()) {
    std::printf("no runs in %s (a run directory holds summary.json or metrics.jsonl)\n",
                root.string().c_str());
    return 0;
  }
  print_table(rows);
  return 0;
}

}  // namespace

int cmd_runs(const Args &args) {
  return run_command("runs", kRunsUsage, runs_body, args,
                     {{"--json", false, false}, {"--help", false, false}, {"-h", false, false}});
}

}  // namespace tessera::cli
