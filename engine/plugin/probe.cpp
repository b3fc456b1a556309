#include "plugin/probe.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <tessera/tessera.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

namespace tessera {

namespace {

constexpr const char *kProbesVar = "TESSERA_PLUGIN_PROBES";

// Who the file is now: "" when it cannot be stat'ed (never cached).
std::string file_identity(const std::string &path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" +
         std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec) + ":" + std::to_string(st.st_ctim.tv_sec) + "." +
         std::to_string(st.st_ctim.tv_nsec);
}

// The verdicts inherited or made so far: identity -> verdict ("" = loads).
// Lines "IDENTITY<TAB>VERDICT".
std::map<std::string, std::string> known_verdicts() {
  std::map<std::string, std::string> out;
  const char *env = std::getenv(kProbesVar);
  if (!env) return out;
  const std::string text = env;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    const size_t tab = line.find('\t');
    if (tab != std::string::npos) out[line.substr(0, tab)] = line.substr(tab + 1);
    at = end + 1;
  }
  return out;
}

void remember_verdicts(const std::map<std::string, std::string> &verdicts) {
  std::string text;
  for (const auto &[id, v] : verdicts) {
    std::string clean = v;  // one line each
    for (char &c : clean)
      if (c == '\n' || c == '\t') c = ' ';
    text += id + "\t" + clean + "\n";
  }
  ::setenv(kProbesVar, text.c_str(), 1);
}

struct LibraryProbe {
  std::string path;
  pid_t pid = -1;
  int fd = -1;  // the child's "ok" pipe, until answered or given up
  bool answered = false;
  int status = 0;
};

// Forks the child that loads `path`; pid -1 when it cannot (no probe).
LibraryProbe probe_start(const std::string &path) {
  LibraryProbe p;
  p.path = path;
  int ok[2];
  if (::pipe2(ok, O_CLOEXEC) != 0) return p;
  std::fflush(nullptr);
  p.pid = ::fork();
  if (p.pid < 0) {
    ::close(ok[0]);
    ::close(ok[1]);
    return p;
  }
  if (p.pid == 0) {
    // Quiet: the parent loads it again, and prints whatever it prints then.
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) {
      ::dup2(null, 1);
      ::dup2(null, 2);
    }
    void *h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h) {
      using EntryFn = const tsr_plugin_library *(*)();
      if (auto entry = reinterpret_cast<EntryFn>(::dlsym(h, TSR_ENTRY_SYMBOL))) (void)entry();
    }
    // Got through (or dlopen refused it, which the parent reports).
    (void)!::write(ok[1], "ok", 2);
    ::_exit(0);
  }
  ::close(ok[1]);
  p.fd = ok[0];
  return p;
}

// Waits for every probe's answer until the one deadline; the children that
// have not answered by then are killed. Every child is reaped.
void probe_wait(std::vector<LibraryProbe> &probes) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kProbeDeadlineMs);
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<LibraryProbe *> of;
    for (auto &p : probes)
      if (p.fd >= 0) {
        fds.push_back(pollfd{p.fd, POLLIN, 0});
        of.push_back(&p);
      }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (fds.empty() || left <= 0) break;
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(left));
    if (n < 0 && errno != EINTR) break;
    for (size_t i = 0; n > 0 && i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      char buf[2] = {};
      of[i]->answered = ::read(of[i]->fd, buf, 2) == 2 && buf[0] == 'o';
      ::close(of[i]->fd);
      of[i]->fd = -1;
    }
  }
  for (auto &p : probes) {
    if (p.pid < 0) continue;
    if (p.fd >= 0) {  // no answer by the deadline: hung
      ::close(p.fd);
      p.fd = -1;
      ::kill(p.pid, SIGKILL);
    }
    while (::waitpid(p.pid, &p.status, 0) < 0 && errno == EINTR) {
    }
  }
}

std::string probe_verdict(const LibraryProbe &p) {
  if (p.pid < 0 || p.answered) return "";
  const int st = p.status;
  std::string how;
  if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
    how = "hung while loading (" + std::to_string(kProbeDeadlineMs / 1000) +
          " s in its static initialisers or " TSR_ENTRY_SYMBOL "())";
  else if (WIFSIGNALED(st))
    how = std::string("crashed while loading (signal ") + std::to_string(WTERMSIG(st)) + ", " +
          (sigabbrev_np(WTERMSIG(st)) ? std::string("SIG") + sigabbrev_np(WTERMSIG(st)) : "?") +
          ", in its static initialisers or " TSR_ENTRY_SYMBOL "())";
  else
    how = "exited with status " + std::to_string(WIFEXITED(st) ? WEXITSTATUS(st) : -1) +
          " while loading (its static initialisers end the process)";
  return p.path + ": " + how +
         "; refusing it (tested in a child process; remove it from the plugin path or fix it)";
}

}  // namespace

std::vector<std::string> probe_libraries(const std::vector<std::string> &paths) {
  std::map<std::string, std::string> known = known_verdicts();
  std::vector<std::string> verdicts(paths.size()), ids(paths.size());
  std::vector<LibraryProbe> probes;
  std::vector<size_t> probed;  // index into paths of each probe
  for (size_t i = 0; i < paths.size(); ++i) {
    ids[i] = file_identity(paths[i]);
    const auto it = ids[i].empty() ? known.end() : known.find(ids[i]);
    if (it != known.end()) {
      // Probed earlier in this launch (by the launcher, or this process).
      verdicts[i] = it->second;
      continue;
    }
    probes.push_back(probe_start(paths[i]));
    probed.push_back(i);
  }
  if (probes.empty()) return verdicts;
  probe_wait(probes);
  for (size_t k = 0; k < probes.size(); ++k) {
    const size_t i = probed[k];
    verdicts[i] = probe_verdict(probes[k]);
    if (!ids[i].empty() && probes[k].pid >= 0) known[ids[i]] = verdicts[i];
  }
  remember_verdicts(known);
  return verdicts;
}

}  // namespace tessera
