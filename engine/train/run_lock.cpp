#include "train/run_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "train/metrics_log.hpp"
#include "util/error.hpp"

namespace fs = std::filesystem;

namespace tessera {

namespace {

std::string holder_text() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  char when[64] = {};
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&now, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S%z", &tm);
  return std::string("host ") + host + ", PID " + std::to_string(::getpid()) + ", started " + when;
}

// What the lock file says about its holder (one line), or "unknown".
std::string read_holder(int fd) {
  char buf[512];
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "unknown holder";
  std::string s(buf, static_cast<size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s.empty() ? "unknown holder" : s;
}

}  // namespace

RunLock::RunLock(const std::vector<std::string> &dirs, const std::vector<std::string> &roles) {
  std::vector<fs::path> locked;
  try {
    for (size_t i = 0; i < dirs.size(); ++i) {
      const std::string &dir = dirs[i], &role = roles[i];
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec)
        throw Error(TSR_ERR_IO, role + " '" + dir + "' cannot be created (" + ec.message() +
                                    "; is a part of the path a file?): found at start-up, "
                                    "before any training");
      if (!fs::is_directory(dir, ec))
        throw Error(TSR_ERR_IO, role + " '" + dir + "' is not a directory");
      const fs::path canon = fs::canonical(dir, ec);
      bool again = false;
      for (const auto &l : locked) again = again || (!ec && l == canon);
      if (again) continue;
      check_writable_dir(dir, role);
      const std::string file = (fs::path(dir) / ".tessera.lock").string();
      const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
      if (fd < 0)
        throw Error(TSR_ERR_IO,
                    role + " '" + dir + "': cannot open its lock file: " + std::strerror(errno));
      if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        const std::string holder = read_holder(fd);
        ::close(fd);
        if (e == EWOULDBLOCK)
          throw RunDirInUse(
              TSR_ERR_CONFIG,
              role + " '" + dir + "' is in use by another tessera job (" + holder +
                  "): two jobs in one directory mix their checkpoints and metrics. Wait "
                  "for it to end, stop it, or give this run its own " +
                  role);
        throw Error(TSR_ERR_IO,
                    role + " '" + dir + "': cannot lock " + file + ": " + std::strerror(e));
      }
      fds_.push_back(fd);
      locked.push_back(ec ? fs::path(dir) : canon);
      // The holder, for the message of a job refused later.
      const std::string text = holder_text() + "\n";
      if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) < 0) {
        // The lock holds without the note; a refused job then says "unknown holder".
      }
    }
  } catch (...) {
    for (int fd : fds_) ::close(fd);
    fds_.clear();
    throw;
  }
}

bool run_dir_held_by_another(const std::string &dir) {
  const std::string file = (fs::path(dir) / ".tessera.lock").string();
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;  // never locked
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);  // drops the shared lock, if taken
  return held;
}

RunLock::~RunLock() {
  for (int fd : fds_) ::close(fd);
}

}  // namespace tessera
