#include "launch/core_dump.hpp"

#include <glob.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <fstream>

#include "util/text.hpp"

namespace tessera {

namespace {

// The signals whose default action dumps core (signal(7)).
bool dumps_core(int sig) {
  switch (sig) {
    case SIGQUIT:
    case SIGILL:
    case SIGTRAP:
    case SIGABRT:
    case SIGBUS:
    case SIGFPE:
    case SIGSEGV:
    case SIGSYS:
    case SIGXCPU:
    case SIGXFSZ:
      return true;
    default:
      return false;
  }
}

std::string first_line(const char *path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The workers run this binary (the launcher starts them from it).
// Expands core(5)'s specifiers that the launcher can know afterwards; the
// others (time, the crashing thread, ...) become '*' for a glob.
std::string expand(const std::string &pattern, pid_t pid, int sig, bool *wild) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    switch (pattern[++i]) {
      case '%':
        out += '%';
        break;
      case 'p':
      case 'P':
        out += std::to_string(pid);
        break;
      case 'e':
      case 'f':
        out += "tessera";
        break;
      case 'E': {
        std::string e = self_exe();
        for (char &c : e)
          if (c == '/') c = '!';
        out += e;
        break;
      }
      case 'h': {
        char host[256] = {};
        ::gethostname(host, sizeof host - 1);
        out += host;
        break;
      }
      case 's':
        out += std::to_string(sig);
        break;
      case 'u':
        out += std::to_string(::getuid());
        break;
      case 'g':
        out += std::to_string(::getgid());
        break;
      default:
        out += '*';
        *wild = true;
    }
  }
  return out;
}

// The newest file matching a glob pattern ("" when none).
std::string newest_match(const std::string &pattern) {
  glob_t g{};
  std::string best;
  time_t best_time = 0;
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) {
      struct stat st {};
      if (::stat(g.gl_pathv[i], &st) == 0 && (best.empty() || st.st_mtime >= best_time)) {
        best = g.gl_pathv[i];
        best_time = st.st_mtime;
      }
    }
  }
  ::globfree(&g);
  return best;
}

}  // namespace

std::string core_dump_note(pid_t pid, int status, const std::string &cwd) {
  return core_dump_note(pid, status, cwd, first_line("/proc/sys/kernel/core_pattern"),
                        first_line("/proc/sys/kernel/core_uses_pid") == "1");
}

std::string core_dump_note(pid_t pid, int status, const std::string &cwd,
                           const std::string &core_pattern, bool core_uses_pid) {
  if (!WIFSIGNALED(status) || !dumps_core(WTERMSIG(status))) return "";
  const std::string p = std::to_string(pid);
  if (!WCOREDUMP(status)) {
    struct rlimit rl {};
    if (::getrlimit(RLIMIT_CORE, &rl) == 0 && rl.rlim_cur == 0)
      return "no core dump: the core size limit is 0; run 'ulimit -c unlimited' in this shell "
             "before 'tessera run' to get one (docs/debugging.md)";
    return "no core dump was written (kernel.core_pattern is '" + core_pattern +
           "'; is its directory writable?)";
  }
  if (!core_pattern.empty() && core_pattern[0] == '|') {
    // A handler program receives the core on its standard input.
    std::string handler = core_pattern.substr(1, core_pattern.find(' ') - 1);
    if (handler.find("systemd-coredump") != std::string::npos)
      return "core dumped to systemd-coredump; open it with: coredumpctl gdb " + p;
    if (handler.find("apport") != std::string::npos)
      return "core dumped to apport (see /var/crash/; apport-unpack it, then: gdb " + self_exe() +
             " CoreDump)";
    return "core dumped to the handler '" + handler + "' (kernel.core_pattern is '" + core_pattern +
           "')";
  }
  bool wild = false;
  std::string path =
      expand(core_pattern.empty() ? "core" : core_pattern, pid, WTERMSIG(status), &wild);
  if (core_uses_pid && core_pattern.find("%p") == std::string::npos) path += "." + p;
  if (path[0] != '/') path = cwd + "/" + path;
  std::string found = wild ? newest_match(path) : path;
  struct stat st {};
  if (found.empty() || ::stat(found.c_str(), &st) != 0)
    return "core dumped, expected at " + path + " (not found there)";
  return "core dumped to " + found + "; open it with: gdb " + self_exe() + " " + found;
}

}  // namespace tessera
