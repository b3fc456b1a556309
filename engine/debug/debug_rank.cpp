#include "debug/debug_rank.hpp"

#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "debug/terminal.hpp"
#include "util/error.hpp"
#include "util/text.hpp"

namespace tessera {

namespace {

// Whole-line messages on stderr: the launcher forwards a worker's output a
// line at a time, prefixed with its rank.
void say(const std::string &line) {
  std::fprintf(stderr, "tessera: %s\n", line.c_str());
  std::fflush(stderr);
}

bool countdown_due(int64_t left) {
  return left % 30 == 0 || left == 10 || left <= 5;
}

}  // namespace

void add_debug_ranks(DebugOptions &o, const std::string &value) {
  size_t start = 0;
  for (;;) {
    size_t comma = value.find(',', start);
    std::string item = trim(value.substr(start, comma - start));
    if (item == "all") {
      o.all = true;
    } else {
      char *end = nullptr;
      long r = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || r < 0 || r > 1 << 24)
        throw Error(TSR_ERR_CONFIG, "--debug-rank '" + value +
                                        "': expected a rank number, a list of them (0,2) "
                                        "or 'all'");
      o.ranks.insert(static_cast<uint32_t>(r));
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
}

int64_t parse_debug_wait(const std::string &text, const std::string &what) {
  errno = 0;
  char *end = nullptr;
  const long long s = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || s < 0)
    throw Error(TSR_ERR_CONFIG, what + " '" + text +
                                    "' is not a number of seconds (0: wait until a debugger "
                                    "attaches)");
  if (errno == ERANGE || s > kMaxDebugWaitS)
    throw Error(TSR_ERR_CONFIG, what + " '" + text + "' is more than " +
                                    std::to_string(kMaxDebugWaitS) +
                                    " seconds (a week), the longest a rank waits for its "
                                    "debugger; 0 waits without a limit");
  return s;
}

DebugOptions debug_options_from_env() {
  DebugOptions o;
  const char *ranks = std::getenv("TESSERA_DEBUG_RANKS");
  if (!ranks || !*ranks) return o;
  add_debug_ranks(o, ranks);
  if (const char *w = std::getenv("TESSERA_DEBUG_WAIT"); w && *w)
    o.wait_s = parse_debug_wait(w, "TESSERA_DEBUG_WAIT");
  if (const char *w = std::getenv("TESSERA_DEBUG_WITH")) o.with = w;
  if (!o.with.empty() && o.with != "gdb")
    throw Error(TSR_ERR_CONFIG, "TESSERA_DEBUG_WITH='" + o.with + "': only 'gdb' is known");
  return o;
}

void export_debug_options(const DebugOptions &o) {
  std::string ranks = o.all ? "all" : "";
  for (uint32_t r : o.ranks) {
    if (!ranks.empty()) ranks += ',';
    ranks += std::to_string(r);
  }
  ::setenv("TESSERA_DEBUG_RANKS", ranks.c_str(), 1);
  ::setenv("TESSERA_DEBUG_WAIT", std::to_string(o.wait_s).c_str(), 1);
  if (o.with.empty())
    ::unsetenv("TESSERA_DEBUG_WITH");
  else
    ::setenv("TESSERA_DEBUG_WITH", o.with.c_str(), 1);
}

bool debugger_attached() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("TracerPid:", 0) == 0) return std::strtol(line.c_str() + 10, nullptr, 10) != 0;
  return false;
}

void hold_for_debugger(uint32_t rank, const DebugOptions &o) {
  // Yama's ptrace_scope 1 (Debian and Ubuntu's default) lets only a
  // process's ancestors attach to it; gdb -p and VS Code are none, so this
  // rank invites any tracer of the same user instead of asking for sudo.
  // (Without Yama the call fails harmlessly.)
  ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  const std::string r = "rank " + std::to_string(rank);
  if (debugger_attached()) {
    say(r + " runs under a debugger already; not waiting");
    return;
  }
  const pid_t pid = ::getpid();
  const std::string p = std::to_string(pid);
  say(r + " (pid " + p + ") is waiting for a debugger to attach" +
      (o.wait_s > 0 ? " (for up to " + std::to_string(o.wait_s) + " s)" : " (no time limit)"));
  say("  gdb:     gdb -p " + p + "    then set breakpoints and 'continue'");
  say("  VS Code: run \"tessera: attach to a rank\" (tessera debug vscode writes it), pick pid " +
      p);
  if (o.with == "gdb") {
    std::string note;
    bool opened = open_gdb_terminal(rank, pid, &note);
    say(opened ? "  " + note : "  --debug-with gdb: " + note + "; attach as above");
  }

  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  int64_t last_said = o.wait_s;
  for (;;) {
    if (debugger_attached()) {
      say(r + ": debugger attached; continuing");
      return;
    }
    const int64_t waited =
        std::chrono::duration_cast<std::chrono::seconds>(clock::now() - start).count();
    if (o.wait_s > 0) {
      const int64_t left = o.wait_s - waited;
      if (left <= 0) {
        say(r + ": no debugger attached within " + std::to_string(o.wait_s) +
            " s; continuing without one");
        return;
      }
      if (left != last_said && countdown_due(left)) {
        say(r + ": " + std::to_string(left) + " s left to attach a debugger (pid " + p + ")");
        last_said = left;
      }
    } else if (waited > 0 && waited % 60 == 0 && waited != last_said) {
      say(r + ": still waiting for a debugger (pid " + p + ")");
      last_said = waited;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace tessera
