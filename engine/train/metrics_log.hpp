// metrics.jsonl of a run directory, kept whole across resumes: the first
// record a run writes replaces the earlier run's records from that step on
// (a resumed run repeats the steps after its checkpoint), and keeps the
// ones before, so the file is one consistent history however often the run
// resumed. (A fresh run in an old run directory replaces everything from
// its first logged step: all of it, unless the old run logged more often.) A write that fails (disk
// full, quota) warns once, is counted, and never leaves a torn line; training goes on.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera {

class MetricsLog {
 public:
  MetricsLog() = default;
  // Checks `dir` is writable now (a test file, then removed) and reads the
  // records an earlier run left in dir/metrics.jsonl.
  explicit MetricsLog(const std::string &dir);
  ~MetricsLog();
  MetricsLog(const MetricsLog &) = delete;
  MetricsLog &operator=(const MetricsLog &) = delete;
  MetricsLog(MetricsLog &&o) noexcept;
  MetricsLog &operator=(MetricsLog &&o) noexcept;

  // One record ({"type", "step", ...}), on a line of its own.
  void append(const nlohmann::json &record);
  // Records that could not be written.
  int64_t lost() const { return lost_; }
  const std::string &path() const { return path_; }

 private:
  void start(const nlohmann::json &first);
  void failed(const std::string &why);

  std::string path_;
  int fd_ = -1;
  bool started_ = false;
  std::vector<std::string> earlier_;  // the earlier run's lines
  int64_t lost_ = 0;
};

// Throws Error (TSR_ERR_IO) unless a file can be created, written and
// removed in `dir` (which must exist): found at start-up, not at the first
// save or metrics line. `what` names the directory's role ("run.dir").
void check_writable_dir(const std::string &dir, const std::string &what);

}  // namespace tessera
