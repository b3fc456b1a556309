// Opening a file that a config, a checkpoint or a user names, without
// hanging on it. open(2) on a FIFO waits for a writer, and reading a FIFO,
// a socket or a character device (/dev/zero, a terminal) may never end: a
// reader refuses anything but a regular file before it reads a byte, and
// says what the path is instead. Header-only, so that the engine and the
// plugins (which never link against the engine) share one copy.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

namespace tessera::sdk {

// What a path that is not a regular file is, for messages.
inline const char *file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// A descriptor open read-only on a regular file, closed with the object.
struct RegularFile {
  int fd = -1;
  uint64_t size = 0;     // at open
  bool refused = false;  // the path exists but is not a regular file
  int error = 0;         // otherwise, when fd < 0: errno of the failed call
  std::string why;       // when fd < 0: what went wrong, without the path

  RegularFile() = default;
  RegularFile(const RegularFile &) = delete;
  RegularFile &operator=(const RegularFile &) = delete;
  RegularFile(RegularFile &&o) noexcept
      : fd(o.fd), size(o.size), refused(o.refused), error(o.error), why(std::move(o.why)) {
    o.fd = -1;
  }
  ~RegularFile() {
    if (fd >= 0) ::close(fd);
  }
  explicit operator bool() const { return fd >= 0; }
  // Hands the descriptor over (the caller closes it).
  int release() {
    const int out = fd;
    fd = -1;
    return out;
  }
};

// Opens `path` (symbolic links followed) if it is a regular file. The type
// is checked before opening, so that a device is never opened (opening
// some has effects), and again on the descriptor, opened non-blocking, so
// that a FIFO swapped in between cannot block the open either.
inline RegularFile open_regular_file(const std::string &path) {
  RegularFile f;
  auto type_why = [](mode_t mode) {
    return std::string("is ") + file_type_name(mode) +
           ", not a regular file: tessera reads only regular files (reading this one could "
           "block or never end); give the path of the file itself";
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    f.error = errno;
    f.why = std::strerror(f.error);
    return f;
  }
  if (!S_ISREG(st.st_mode)) {
    f.refused = true;
    f.why = type_why(st.st_mode);
    return f;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    f.error = errno;
    f.why = std::strerror(f.error);
    return f;
  }
  if (::fstat(fd, &st) != 0) {
    f.error = errno;
    f.why = std::strerror(f.error);
    ::close(fd);
    return f;
  }
  if (!S_ISREG(st.st_mode)) {
    f.refused = true;
    f.why = type_why(st.st_mode);
    ::close(fd);
    return f;
  }
  // Regular files ignore O_NONBLOCK; cleared anyway, so that the descriptor
  // behaves as any other for whoever reads it.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  f.fd = fd;
  f.size = static_cast<uint64_t>(st.st_size);
  return f;
}

// Reads all of a regular file into *out; a file of more than `max` bytes
// (a config or a manifest has no business being gigabytes) is refused
// without reading it. False with *why (without the path) on failure, and
// *refused (when given) true if the path is not a regular file.
inline bool read_regular_file(const std::string &path, std::string *out, std::string *why,
                              uint64_t max = uint64_t{1} << 30, bool *refused = nullptr) {
  RegularFile f = open_regular_file(path);
  if (refused) *refused = f.refused;
  if (!f) {
    *why = f.why;
    return false;
  }
  if (f.size > max) {
    *why = "is " + std::to_string(f.size) + " bytes, more than the " + std::to_string(max) +
           " this reader accepts";
    return false;
  }
  out->clear();
  out->reserve(static_cast<size_t>(f.size));
  char buf[65536];
  for (;;) {
    const ssize_t r = ::read(f.fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      *why = std::string("read failed: ") + std::strerror(errno);
      return false;
    }
    if (r == 0) return true;
    // A file that grows while it is read still stops at the bound.
    if (out->size() + static_cast<size_t>(r) > max) {
      *why = "grew past the " + std::to_string(max) + " bytes this reader accepts";
      return false;
    }
    out->append(buf, static_cast<size_t>(r));
  }
}

}  // namespace tessera::sdk
