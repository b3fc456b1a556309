#include "train/metrics_log.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "util/error.hpp"
#include "util/regular_file.hpp"

namespace fs = std::filesystem;

namespace tessera {

namespace {

// All of `text` at the end of fd, or nothing: a short write is cut back
// off, so that a later line never joins a torn one.
bool append_whole(int fd, const std::string &text, std::string *why) {
  const off_t before = ::lseek(fd, 0, SEEK_END);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      *why = w < 0 ? std::strerror(errno) : "no space written";
      if (before >= 0 && ::ftruncate(fd, before) != 0) {
        // Nothing more to do: the next write starts after the torn part.
      }
      return false;
    }
    done += static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

void check_writable_dir(const std::string &dir, const std::string &what) {
  const std::string probe =
      (fs::path(dir) / (".tessera-write-test-" + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  std::string why;
  if (fd < 0) {
    why = std::strerror(errno);
  } else {
    if (::write(fd, "ok\n", 3) != 3) why = std::strerror(errno);
    if (::close(fd) != 0 && why.empty()) why = std::strerror(errno);
    ::unlink(probe.c_str());
  }
  if (!why.empty())
    throw Error(TSR_ERR_IO, what + " '" + dir + "' is not writable (" + why +
                                "): found at start-up, before any training; give " + what +
                                " a directory you can write to, with space");
}

MetricsLog::MetricsLog(const std::string &dir) : path_((fs::path(dir) / "metrics.jsonl").string()) {
  check_writable_dir(dir, "run.dir");
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path_, ec))) return;
  // Whatever is there, read without blocking (never a FIFO) and bounded.
  std::istringstream in(read_regular(path_, "metrics file", uint64_t{1} << 30));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) earlier_.push_back(line);
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

MetricsLog::MetricsLog(MetricsLog &&o) noexcept
    : path_(std::move(o.path_)),
      fd_(o.fd_),
      started_(o.started_),
      earlier_(std::move(o.earlier_)),
      lost_(o.lost_) {
  o.fd_ = -1;
}

MetricsLog &MetricsLog::operator=(MetricsLog &&o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    started_ = o.started_;
    earlier_ = std::move(o.earlier_);
    lost_ = o.lost_;
    o.fd_ = -1;
  }
  return *this;
}

void MetricsLog::start(const nlohmann::json &first) {
  started_ = true;
  // The earlier run's records before this one's first; from it on, this
  // run's (a torn last line of a killed run goes with them). One exception:
  // a run resumed at its last step writes only the final eval there, and
  // the train record of that step is the earlier run's to keep.
  const int64_t step = first.value("step", int64_t{0});
  const bool eval_first = first.value("type", "") == "eval";
  std::string kept;
  for (const auto &line : earlier_) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer())
      continue;
    const int64_t s = j["step"].get<int64_t>();
    if (s > step || (s == step && !(eval_first && j.value("type", "") == "train"))) continue;
    kept += line + "\n";
  }
  earlier_.clear();
  // Rewritten through a new file renamed into place: the old history is
  // never half gone.
  const std::string tmp = path_ + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  std::string why;
  if (fd < 0) {
    failed(std::strerror(errno));
    return;
  }
  if (!append_whole(fd, kept, &why) || ::fsync(fd) != 0 || ::close(fd) != 0) {
    if (why.empty()) why = std::strerror(errno);
    ::unlink(tmp.c_str());
    failed(why);
    return;
  }
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    failed(std::strerror(errno));
    ::unlink(tmp.c_str());
    return;
  }
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd_ < 0) failed(std::strerror(errno));
}

void MetricsLog::failed(const std::string &why) {
  // Once: a full disk would otherwise print a line per step.
  if (lost_++ == 0)
    std::fprintf(stderr,
                 "tessera: warning: cannot write %s (%s): its records from here on are missing "
                 "(summary.json counts them under metrics_lost); training goes on\n",
                 path_.c_str(), why.c_str());
}

void MetricsLog::append(const nlohmann::json &record) {
  if (path_.empty()) return;
  if (!started_) start(record);
  std::string why;
  if (fd_ < 0) {
    // Opening failed before: try again, the disk may have room now.
    fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      failed(std::strerror(errno));
      return;
    }
  }
  if (!append_whole(fd_, record.dump() + "\n", &why)) failed(why);
}

}  // namespace tessera
