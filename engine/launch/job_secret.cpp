#include "launch/job_secret.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "util/crypto.hpp"
#include "util/error.hpp"
#include "util/text.hpp"

namespace tessera {

namespace {

// One line from standard input, read a byte at a time (what follows is the
// supervisor's), within `timeout_ms`.
std::string read_stdin_line(int timeout_ms) {
  std::string line;
  while (line.size() < 4096) {
    pollfd p{0, POLLIN, 0};
    const int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    char c;
    const ssize_t n = ::read(0, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == '\n') break;
    line.push_back(c);
  }
  return line;
}

}  // namespace

std::string new_job_secret() {
  return to_hex(random_bytes(32).data(), 32);
}

void check_job_secret(const std::string &secret, const std::string &origin) {
  if (secret.size() < 16)
    throw Error(TSR_ERR_CONFIG, origin +
                                    ": the job secret is shorter than 16 characters (make one "
                                    "with: head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n')");
  for (char c : secret)
    if (static_cast<unsigned char>(c) < 0x21 || static_cast<unsigned char>(c) > 0x7e)
      throw Error(TSR_ERR_CONFIG,
                  origin + ": the job secret must be printable ASCII without spaces");
}

std::string read_job_secret_file(const std::string &path) {
  // Non-blocking: a FIFO in its place is refused below instead of waiting
  // for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0)
    throw Error(TSR_ERR_IO, "--job-secret-file " + path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(TSR_ERR_CONFIG, "--job-secret-file " + path + ": not a regular file");
  }
  if (st.st_uid != ::getuid() || (st.st_mode & 077) != 0) {
    ::close(fd);
    throw Error(TSR_ERR_CONFIG, "--job-secret-file " + path +
                                    ": must be owned by you and readable by nobody else "
                                    "(chmod 600 " +
                                    path + ")");
  }
  char buf[4096];
  ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  if (n < 0)
    throw Error(TSR_ERR_IO, "--job-secret-file " + path + ": cannot read: " + std::strerror(errno));
  const std::string s = trim(std::string(buf, static_cast<size_t>(n)));
  check_job_secret(s, "--job-secret-file " + path);
  return s;
}

std::string launcher_job_secret(const std::string &file, bool from_stdin, int nnodes) {
  if (!file.empty()) return read_job_secret_file(file);
  if (const char *e = std::getenv("TESSERA_JOB_SECRET"); e && *e) {
    check_job_secret(e, "TESSERA_JOB_SECRET");
    return e;
  }
  if (from_stdin && nnodes > 1) {
    const std::string line = read_stdin_line(60000);
    if (line.rfind("secret ", 0) == 0) {
      const std::string s = trim(line.substr(7));
      check_job_secret(s, "the head launcher's job secret");
      return s;
    }
    throw Error(TSR_ERR_CONFIG,
                "--watch-stdin: the head launcher sent no job secret within 60 s (a node launcher "
                "of a --hostfile job gets it over ssh; started by hand, give --job-secret-file)");
  }
  if (nnodes > 1)
    throw Error(TSR_ERR_CONFIG,
                "--nnodes > 1: every node's launcher needs the same job secret: --job-secret-file "
                "FILE (mode 600, the same contents on every node) or TESSERA_JOB_SECRET");
  return new_job_secret();
}

}  // namespace tessera
