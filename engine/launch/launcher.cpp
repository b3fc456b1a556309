#include "launch/launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "dist/store.hpp"
#include "util/error.hpp"

namespace tessera {

namespace {

std::atomic<int> g_signal{0};
void on_signal(int sig) {
  g_signal = sig;
}

struct Worker {
  int rank = 0, local_rank = 0;
  pid_t pid = -1;
  int out_fd = -1, err_fd = -1;
  std::string out_buf, err_buf;
  bool exited = false;
  int status = 0;
};

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char *name = sigabbrev_np(sig);
    return std::string("was killed by signal SIG") + (name ? name : "?") + " (" +
           std::to_string(sig) + ")" + (WCOREDUMP(status) ? ", core dumped" : "");
  }
  return "ended with status " + std::to_string(status);
}

bool failed(int status) {
  return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// Moves whole lines from a worker's pipe to ours, prefixed with its rank.
void pump(Worker &w, int &fd, std::string &buf, FILE *to, bool flush_all) {
  if (fd >= 0) {
    char tmp[65536];
    ssize_t n = ::read(fd, tmp, sizeof tmp);
    if (n > 0)
      buf.append(tmp, static_cast<size_t>(n));
    else if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
      ::close(fd);
      fd = -1;
      flush_all = true;
    }
  }
  size_t start = 0;
  for (size_t nl; (nl = buf.find('\n', start)) != std::string::npos; start = nl + 1)
    std::fprintf(to, "[rank %d] %.*s\n", w.rank, static_cast<int>(nl - start), buf.data() + start);
  buf.erase(0, start);
  if (flush_all && !buf.empty()) {
    std::fprintf(to, "[rank %d] %s\n", w.rank, buf.c_str());
    buf.clear();
  }
  std::fflush(to);
}

pid_t spawn(Worker &w, const std::vector<std::string> &args, const std::vector<std::string> &env) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
    throw Error(TSR_ERR_IO, std::string("cannot create pipes: ") + std::strerror(errno));
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) throw Error(TSR_ERR_IO, std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    // A worker must not outlive its launcher.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    for (const auto &e : env) ::putenv(const_cast<char *>(e.c_str()));
    std::vector<char *> argv;
    static const char exe[] = "/proc/self/exe";
    argv.push_back(const_cast<char *>("tessera"));
    for (const auto &a : args) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(exe, argv.data());
    std::fprintf(stderr, "cannot exec %s: %s\n", exe, std::strerror(errno));
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  w.out_fd = out[0];
  w.err_fd = err[0];
  return pid;
}

}  // namespace

int launch(const LaunchOptions &opt, const std::vector<std::string> &worker_args) {
  if (opt.nproc < 1) throw Error(TSR_ERR_CONFIG, "-n must be at least 1");
  if (opt.nnodes < 1 || opt.node_rank < 0 || opt.node_rank >= opt.nnodes)
    throw Error(TSR_ERR_CONFIG, "--node-rank " + std::to_string(opt.node_rank) +
                                    " is not in [0, --nnodes " + std::to_string(opt.nnodes) + ")");
  const int world = opt.nproc * opt.nnodes;
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  if (!opt.master.empty()) {
    auto colon = opt.master.rfind(':');
    if (colon == std::string::npos || colon == 0)
      throw Error(TSR_ERR_CONFIG, "--master '" + opt.master + "': expected HOST:PORT");
    host = opt.master.substr(0, colon);
    long p = std::strtol(opt.master.c_str() + colon + 1, nullptr, 10);
    if (p <= 0 || p > 65535) throw Error(TSR_ERR_CONFIG, "--master '" + opt.master + "': bad port");
    port = static_cast<uint16_t>(p);
  } else if (opt.nnodes > 1) {
    throw Error(TSR_ERR_CONFIG,
                "--nnodes > 1 needs --master HOST:PORT (where node 0's launcher serves)");
  } else if (const char *mp = std::getenv("MASTER_PORT")) {
    port = static_cast<uint16_t>(std::strtol(mp, nullptr, 10));
  }
  // Node 0 serves the rendezvous store for the whole job.
  std::unique_ptr<StoreServer> store;
  if (opt.node_rank == 0) {
    store = std::make_unique<StoreServer>(opt.nnodes > 1 ? "" : host, port);
    port = store->port();
  }

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::vector<Worker> workers(static_cast<size_t>(opt.nproc));
  for (int i = 0; i < opt.nproc; ++i) {
    Worker &w = workers[static_cast<size_t>(i)];
    w.local_rank = i;
    w.rank = opt.node_rank * opt.nproc + i;
    std::vector<std::string> env = {
        "RANK=" + std::to_string(w.rank),
        "LOCAL_RANK=" + std::to_string(i),
        "WORLD_SIZE=" + std::to_string(world),
        "LOCAL_WORLD_SIZE=" + std::to_string(opt.nproc),
        "MASTER_ADDR=" + host,
        "MASTER_PORT=" + std::to_string(port),
        "TESSERA_LAUNCHED=1",
        "TESSERA_NODE_RANK=" + std::to_string(opt.node_rank),
    };
    w.pid = spawn(w, worker_args, env);
  }

  // Supervise: forward output, watch for exits and signals.
  int first_failed = -1;
  std::string reason;
  std::chrono::steady_clock::time_point kill_at{};
  bool terminating = false;
  auto stop_all = [&](int sig) {
    for (auto &w : workers)
      if (!w.exited) ::kill(w.pid, sig);
  };
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Worker *, bool>> owners;
    for (auto &w : workers) {
      if (w.out_fd >= 0) {
        fds.push_back({w.out_fd, POLLIN, 0});
        owners.push_back({&w, true});
      }
      if (w.err_fd >= 0) {
        fds.push_back({w.err_fd, POLLIN, 0});
        owners.push_back({&w, false});
      }
    }
    if (!fds.empty())
      ::poll(fds.data(), fds.size(), 100);
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Worker &w = *owners[i].first;
      if (owners[i].second)
        pump(w, w.out_fd, w.out_buf, stdout, false);
      else
        pump(w, w.err_fd, w.err_buf, stderr, false);
    }
    bool all_done = true;
    for (auto &w : workers) {
      if (w.exited) continue;
      int st = 0;
      pid_t r = ::waitpid(w.pid, &st, WNOHANG);
      if (r == w.pid) {
        w.exited = true;
        w.status = st;
        if (failed(st) && first_failed < 0 && !terminating) {
          first_failed = w.rank;
          reason = "rank " + std::to_string(w.rank) + " " + describe_exit(st);
          std::string why;
          if (store && store->peek(kAbortKey, &why)) reason += " (" + why + ")";
          std::fprintf(stderr, "tessera run: %s; stopping the other workers\n", reason.c_str());
          terminating = true;
          stop_all(SIGTERM);
          kill_at = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(static_cast<int>(opt.grace_s * 1000));
        }
      } else {
        all_done = false;
      }
    }
    if (g_signal && !terminating) {
      std::fprintf(stderr, "tessera run: %s received; stopping every worker\n",
                   g_signal == SIGINT ? "SIGINT" : "SIGTERM");
      terminating = true;
      stop_all(SIGTERM);
      kill_at = std::chrono::steady_clock::now() +
                std::chrono::milliseconds(static_cast<int>(opt.grace_s * 1000));
    }
    if (terminating && !all_done && std::chrono::steady_clock::now() > kill_at) {
      stop_all(SIGKILL);
      kill_at = std::chrono::steady_clock::now() + std::chrono::hours(1);
    }
    if (all_done) break;
  }
  for (auto &w : workers) {
    while (w.out_fd >= 0) pump(w, w.out_fd, w.out_buf, stdout, true);
    while (w.err_fd >= 0) pump(w, w.err_fd, w.err_buf, stderr, true);
  }
  if (first_failed >= 0) {
    std::fprintf(stderr, "tessera run: failed: %s\n", reason.c_str());
    return 1;
  }
  if (g_signal) return 128 + g_signal;
  return 0;
}

}  // namespace tessera
