#include "debug/terminal.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

extern char **environ;

namespace tessera {

namespace {

// Starts argv with its standard streams on /dev/null: a rank's own stdout
// and stderr are pipes to the launcher, which drains them until every
// holder closes them, so a terminal that outlives the rank must not hold
// them. `new_session` takes it out of the terminal's foreground process
// group, so a Ctrl-C meant for the job does not close the debugger too.
pid_t spawn_quiet(const std::vector<std::string> &args, bool new_session) {
  std::vector<char *> argv;
  for (const auto &a : args) argv.push_back(const_cast<char *>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  for (int fd = 0; fd < 3; ++fd)
    posix_spawn_file_actions_addopen(&fa, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0);
  if (new_session) posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
  pid_t pid = -1;
  if (posix_spawnp(&pid, argv[0], &fa, &attr, argv.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  return pid;
}

std::vector<std::string> gdb_command(const std::string &gdb, uint32_t rank, pid_t pid) {
  // Paging off from before the attach: its "Reading symbols" lines for
  // every loaded library would otherwise stop at a --Type <RET>-- prompt
  // before the message below (the more libraries, the sooner), and gdb
  // counts them against the page even if paging came back on after.
  return {gdb,
          "-q",
          "-iex",
          "set pagination off",
          "-p",
          std::to_string(pid),
          "-ex",
          "echo \\ntessera: rank " + std::to_string(rank) +
              " is stopped in its start-up wait: set breakpoints, then 'continue'.\\n"};
}

std::string cwd() {
  std::error_code ec;
  return std::filesystem::current_path(ec).string();
}

}  // namespace

std::string find_on_path(const std::string &program) {
  const char *path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  for (size_t start = 0; start <= p.size();) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string dir = p.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

bool open_gdb_terminal(uint32_t rank, pid_t pid, std::string *note) {
  const std::string gdb = find_on_path("gdb");
  if (gdb.empty()) {
    *note = "gdb is not on PATH";
    return false;
  }
  const std::string title = "tessera rank " + std::to_string(rank);
  const char *tmux_env = std::getenv("TMUX");
  const std::string tmux = find_on_path("tmux");
  if (tmux_env && *tmux_env && !tmux.empty()) {
    // The tmux client only asks the server for the window and exits; its
    // status says whether the window opened.
    std::vector<std::string> args = {tmux, "new-window", "-n", title, "-c", cwd()};
    for (auto &a : gdb_command(gdb, rank, pid)) args.push_back(a);
    pid_t c = spawn_quiet(args, false);
    int st = 0;
    if (c > 0 && ::waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
      *note = "gdb is attaching in tmux window '" + title + "'";
      return true;
    }
    *note = "tmux new-window failed";
    return false;
  }
  const char *display = std::getenv("DISPLAY");
  const char *wayland = std::getenv("WAYLAND_DISPLAY");
  if ((display && *display) || (wayland && *wayland)) {
    // Debian's x-terminal-emulator (the user's choice) accepts xterm's -T
    // and -e. The terminal is not waited for: it lives as long as the
    // debugging session, and is reaped when this rank exits.
    for (const char *term : {"x-terminal-emulator", "xterm"}) {
      const std::string path = find_on_path(term);
      if (path.empty()) continue;
      std::vector<std::string> args = {path, "-T", title, "-e"};
      for (auto &a : gdb_command(gdb, rank, pid)) args.push_back(a);
      if (spawn_quiet(args, true) > 0) {
        *note = "gdb is attaching in a new " + std::string(term) + " window ('" + title + "')";
        return true;
      }
    }
    *note = "no X terminal (x-terminal-emulator, xterm) on PATH";
    return false;
  }
  *note = "no tmux session ($TMUX is unset) and no X display ($DISPLAY is unset)";
  return false;
}

}  // namespace tessera
