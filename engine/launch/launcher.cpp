#include "launch/launcher.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "comm/dist_context.hpp"
#include "comm/store.hpp"
#include "launch/child_exec.hpp"
#include "launch/core_dump.hpp"
#include "launch/job_secret.hpp"
#include "launch/pipe_poll.hpp"
#include "util/error.hpp"
#include "util/text.hpp"

namespace tessera {

namespace {

std::atomic<int> g_signal{0};
// Status of a worker that stopped because another rank failed (or it lost a
// peer): a consequence, never named as the cause.
constexpr int kStoppedByPeer = kStoppedByPeerStatus;
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
  if (WIFEXITED(status) && WEXITSTATUS(status) == kStoppedByPeer)
    return "stopped (status " + std::to_string(kStoppedByPeer) + ") because another rank failed";
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char *name = sigabbrev_np(sig);
    return std::string("was killed by signal SIG") + (name ? name : "?") + " (" +
           std::to_string(sig) + ")" + (WCOREDUMP(status) ? ", core dumped" : "");
  }
  return "ended with status " + std::to_string(status);
}

// Moves whole lines from a worker's pipe to ours, prefixed with its rank.
void pump(Worker &w, int &fd, std::string &buf, FILE *to, bool flush_all) {
  pump_lines(fd, buf, flush_all, [&](std::string_view line) {
    std::fprintf(to, "[rank %d] %.*s\n", w.rank, static_cast<int>(line.size()), line.data());
  });
  std::fflush(to);
}

// The binary the workers run: this one, by its path rather than as
// /proc/self/exe, which would name them "exe" (their comm: what ps,
// debuggers' process pickers and core_pattern's %e show).
std::string worker_exe() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  std::string path = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  // Replaced or removed since it started: only /proc/self/exe still names it.
  if (path.empty() || ::access(path.c_str(), X_OK) != 0) return "/proc/self/exe";
  return path;
}

pid_t spawn(Worker &w, const std::vector<std::string> &args, const std::vector<std::string> &env,
            bool null_stdin) {
  const std::string exe = worker_exe();
  std::vector<std::string> argv{"tessera"};
  argv.insert(argv.end(), args.begin(), args.end());
  ChildExec child(std::move(argv), env, "cannot exec " + exe + ": ");
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
    throw Error(TSR_ERR_IO, std::string("cannot create pipes: ") + std::strerror(errno));
  const pid_t pid = fork_tied_child();  // a worker must not outlive its launcher
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    if (null_stdin) {
      // Our standard input is the ssh session's: it is the launcher's to watch.
      int in = ::open("/dev/null", O_RDONLY);
      if (in >= 0) ::dup2(in, 0);
    }
    child.run(exe.c_str());
  }
  ::close(out[1]);
  ::close(err[1]);
  w.out_fd = out[0];
  w.err_fd = err[0];
  return pid;
}

// What a node launcher without the store (node rank > 0) needs to post an
// abort reason, and whether it watches its standard input (--watch-stdin).
struct NodeLink {
  std::string master_host;
  uint16_t master_port = 0;
  bool watch_stdin = false;
  bool stopped_by_head = false;  // out: a "stop" line arrived
};

// Posts `reason` under the abort key of the store at host:port unless some
// rank posted one first (as DistContext::post_abort does). Best effort.
void post_abort_remote(const NodeLink &link, const std::string &prefix, const std::string &reason) {
  try {
    StoreClient c(link.master_host, link.master_port, std::chrono::seconds(2));
    post_abort_cause(c, prefix, reason);
  } catch (const std::exception &) {
    // The store is gone (node 0 stopped already): its workers stop on their own.
  }
}

// The launcher's watch over its workers, from the first spawn to the last
// exit: which rank failed first, and how far the stopping has gone.
struct Supervision {
  std::vector<Worker> &workers;
  StoreServer *store;  // node 0's; null on the other nodes
  const std::string &prefix;
  NodeLink &link;
  std::chrono::milliseconds grace;
  std::string *reason;
  int first_failed = -1;
  // 0: running; 1: failure posted, waiting for ranks to leave on their own;
  // 2: SIGTERM sent; 3: SIGKILL sent.
  int phase = 0;
  std::chrono::steady_clock::time_point deadline{};
  int stdin_fd = -1;
};

// Whether `pid` is stopped (SIGSTOP, a debugger's stop): its state in
// /proc/PID/stat, the letter after the command's closing parenthesis.
bool process_stopped(pid_t pid) {
  char buf[512];
  const int fd = ::open(("/proc/" + std::to_string(pid) + "/stat").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  const std::string stat(buf, static_cast<size_t>(n));
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() &&
         (stat[paren + 2] == 'T' || stat[paren + 2] == 't');
}

// A stopped worker cannot act on SIGTERM until it is continued: it gets
// SIGKILL at once instead of holding the job for the 5 s that SIGTERM is
// given (a frozen rank was named after its heartbeat timeout and then kept
// the launcher 7 s more: issue 53).
void stop_all(Supervision &sv, int sig) {
  for (auto &w : sv.workers)
    if (!w.exited) ::kill(w.pid, sig == SIGTERM && process_stopped(w.pid) ? SIGKILL : sig);
}

// Moves to `phase` with `sig` sent to every worker, the next step due
// after `wait`.
void stop_all_now(Supervision &sv, int sig, int phase, std::chrono::milliseconds wait) {
  stop_all(sv, sig);
  sv.phase = phase;
  sv.deadline = std::chrono::steady_clock::now() + wait;
}

// The head launcher's word on stdin (ssh carries it): "stop", or the end of
// the session.
void read_head_word(Supervision &sv) {
  char buf[256];
  ssize_t n = ::read(sv.stdin_fd, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  const bool stop =
      n > 0 && std::string(buf, static_cast<size_t>(n)).find("stop") != std::string::npos;
  if (n > 0 && !stop) return;
  sv.stdin_fd = -1;
  if (sv.phase != 0) return;
  if (stop) {
    sv.link.stopped_by_head = true;
    std::fprintf(stderr,
                 "tessera run: the head launcher stopped the job (another node failed); "
                 "stopping every worker\n");
    stop_all_now(sv, SIGTERM, 2, std::chrono::seconds(5));
  } else {
    std::fprintf(stderr,
                 "tessera run: the ssh session to the head launcher ended; stopping every "
                 "worker (they save a checkpoint first)\n");
    g_signal = SIGTERM;
    stop_all_now(sv, SIGTERM, 2, sv.grace);
  }
}

std::string rank_of(const Worker *w) {
  return "rank " + std::to_string(w->rank);
}

// The rank that caused a failure first seen in `seen`. After a moment for
// the others' exits to land (a rank killed by a signal is the cause even
// when a peer that lost its connection to it exits first), in order of
// preference: a rank killed by a signal; a rank that failed on its own (any
// status but kStoppedByPeer); then `seen`.
const Worker *find_culprit(std::vector<Worker> &workers, const Worker &seen) {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (auto &o : workers) {
    if (o.exited) continue;
    int ost = 0;
    if (::waitpid(o.pid, &ost, WNOHANG) == o.pid) {
      o.exited = true;
      o.status = ost;
    }
  }
  const Worker *signaled = nullptr, *own = nullptr;
  for (auto &o : workers) {
    if (!o.exited || !exit_failed(o.status)) continue;
    if (WIFSIGNALED(o.status) && !signaled) signaled = &o;
    if (WIFEXITED(o.status) && WEXITSTATUS(o.status) != kStoppedByPeer && !own) own = &o;
  }
  return signaled ? signaled : own ? own : &seen;
}

// Why the job failed, with `culprit` the cause; the other ranks are told.
// A rank that failed with a reason posted it ("rank R: why"): it is used
// when it is the cause's own, or when no rank failed on its own. A rank
// that died without a word gets its death posted for it, so the others stop
// at once instead of waiting in a collective.
std::string failure_reason(Supervision &sv, const Worker *culprit) {
  std::string reason = rank_of(culprit) + " " + describe_exit(culprit->status);
  std::string why;
  if (sv.store && sv.store->peek(abort_key(sv.prefix), &why)) {
    auto colon = why.find(':');
    std::string poster = why.substr(0, colon), text = why.substr(colon + 1);
    if (text.rfind(" [comm] ", 0) == 0) text = " " + text.substr(8);
    bool peer_stopped =
        WIFEXITED(culprit->status) && WEXITSTATUS(culprit->status) == kStoppedByPeer;
    if (poster == rank_of(culprit) || peer_stopped)
      reason = poster + " failed:" + text + " (" + reason + ")";
  } else if (sv.store) {
    sv.store->put(abort_key(sv.prefix), reason);
  } else if (!sv.link.master_host.empty()) {
    // The same from a node without the store, through node 0's.
    post_abort_remote(sv.link, sv.prefix, reason);
  }
  return reason;
}

// Reaps the workers that have exited; the first failure names its cause
// and starts stopping the others. Returns whether every worker has exited.
bool reap_workers(Supervision &sv) {
  bool all_done = true;
  for (auto &w : sv.workers) {
    if (w.exited) continue;
    int st = 0;
    pid_t r = ::waitpid(w.pid, &st, WNOHANG);
    if (r != w.pid) {
      all_done = false;
      continue;
    }
    w.exited = true;
    w.status = st;
    if (!exit_failed(st) || sv.first_failed >= 0 || sv.phase != 0) continue;
    const Worker *culprit = find_culprit(sv.workers, w);
    sv.first_failed = culprit->rank;
    *sv.reason = failure_reason(sv, culprit);
    std::fprintf(stderr, "tessera run: %s; stopping the other workers\n", sv.reason->c_str());
    // The abort key stops them within a fraction of a second; SIGTERM and
    // then SIGKILL follow for a rank stuck outside the engine.
    sv.phase = 1;
    sv.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  }
  return all_done;
}

// A signal to the launcher stops every worker (they save a checkpoint
// first); past a deadline, the next signal (SIGTERM, then SIGKILL) follows.
void escalate(Supervision &sv, bool all_done) {
  if (g_signal && sv.phase == 0) {
    std::fprintf(stderr,
                 "tessera run: %s received; stopping every worker (they save a checkpoint "
                 "first)\n",
                 g_signal == SIGINT ? "SIGINT" : "SIGTERM");
    stop_all_now(sv, SIGTERM, 2, sv.grace);
  }
  if (!all_done && sv.phase > 0 && sv.phase < 3 && std::chrono::steady_clock::now() > sv.deadline) {
    stop_all(sv, sv.phase == 1 ? SIGTERM : SIGKILL);
    sv.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    ++sv.phase;
  }
}

// The workers' last output, then where each crashed worker's core dump
// went, or why there is none (docs/debugging.md): here, once every worker
// is reaped, wherever that was.
void finish_output(std::vector<Worker> &workers, const std::string &cwd) {
  for (auto &w : workers) {
    while (w.out_fd >= 0) pump(w, w.out_fd, w.out_buf, stdout, true);
    while (w.err_fd >= 0) pump(w, w.err_fd, w.err_buf, stderr, true);
  }
  for (auto &w : workers)
    if (std::string core = core_dump_note(w.pid, w.status, cwd); !core.empty())
      std::fprintf(stderr, "tessera run: rank %d: %s\n", w.rank, core.c_str());
}

// Forwards output and watches the workers until all have exited. On the
// first failure the others are stopped: the abort key tells them at once,
// SIGTERM follows, SIGKILL after the grace period. Returns true when every
// worker exited 0 without a signal to the launcher.
bool supervise(std::vector<Worker> &workers, StoreServer *store, const std::string &prefix,
               double grace_s, std::string *reason, NodeLink &link, int *failed_rank) {
  // Workers run in the launcher's directory: a core_pattern without a
  // directory puts their core dumps there.
  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string();
  Supervision sv{
      workers, store, prefix, link, std::chrono::milliseconds(static_cast<int>(grace_s * 1000)),
      reason};
  sv.stdin_fd = link.watch_stdin ? 0 : -1;
  for (;;) {
    poll_child_pipes(
        workers, sv.stdin_fd, [&] { read_head_word(sv); },
        [&](Worker &w, bool is_err) {
          if (is_err)
            pump(w, w.err_fd, w.err_buf, stderr, false);
          else
            pump(w, w.out_fd, w.out_buf, stdout, false);
        });
    const bool all_done = reap_workers(sv);
    escalate(sv, all_done);
    if (all_done) break;
  }
  finish_output(workers, cwd);
  *failed_rank = sv.first_failed;
  return sv.first_failed < 0 && !g_signal && !link.stopped_by_head;
}

// Where the workers rendezvous: --master HOST:PORT, else this host (the
// port from MASTER_PORT, or 0 for node 0's store to pick).
void master_address(const LaunchOptions &opt, std::string *host, uint16_t *port) {
  *host = "127.0.0.1";
  *port = 0;
  if (!opt.master.empty()) {
    auto colon = opt.master.rfind(':');
    if (colon == std::string::npos || colon == 0)
      throw Error(TSR_ERR_CONFIG, "--master '" + opt.master + "': expected HOST:PORT");
    *host = opt.master.substr(0, colon);
    long p = std::strtol(opt.master.c_str() + colon + 1, nullptr, 10);
    if (p <= 0 || p > 65535) throw Error(TSR_ERR_CONFIG, "--master '" + opt.master + "': bad port");
    *port = static_cast<uint16_t>(p);
  } else if (opt.nnodes > 1) {
    throw Error(TSR_ERR_CONFIG,
                "--nnodes > 1 needs --master HOST:PORT (where node 0's launcher serves)");
  } else if (const char *mp = std::getenv("MASTER_PORT")) {
    *port = static_cast<uint16_t>(std::strtol(mp, nullptr, 10));
  }
}

// This node's workers of one attempt, started with their ranks and the
// rendezvous in the environment (a restart resumes from the latest
// checkpoint).
std::vector<Worker> spawn_workers(const LaunchOptions &opt, int attempt, const std::string &host,
                                  uint16_t port, const std::vector<std::string> &worker_args) {
  const int world = opt.nproc * opt.nnodes;
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
        "TESSERA_ATTEMPT=" + std::to_string(attempt),
    };
    if (attempt > 0) env.push_back("TESSERA_RESUME=auto");
    w.pid = spawn(w, worker_args, env, opt.watch_stdin);
  }
  return workers;
}

// The launcher's exit status after an attempt that failed or was stopped,
// or -1 to restart the workers (--max-restarts).
int failed_attempt_status(const LaunchOptions &opt, int attempt, const std::vector<Worker> &workers,
                          const std::string &reason, const NodeLink &link) {
  if (link.stopped_by_head) {
    std::fprintf(stderr, "tessera run: failed: stopped by the head launcher%s%s\n",
                 reason.empty() ? "" : "; here: ", reason.c_str());
    return 1;
  }
  if (g_signal) {
    // Preemption: workers saved a checkpoint and exited 0 if they could.
    bool clean = true;
    for (auto &w : workers) clean &= !exit_failed(w.status);
    if (clean) {
      std::fprintf(stderr, "tessera run: stopped by %s after every worker saved and exited\n",
                   g_signal == SIGINT ? "SIGINT" : "SIGTERM");
      return 0;
    }
    return 128 + g_signal;
  }
  if (attempt < opt.max_restarts) {
    std::fprintf(stderr,
                 "tessera run: %s; restarting every worker from the latest checkpoint (restart "
                 "%d of %d)\n",
                 reason.c_str(), attempt + 1, opt.max_restarts);
    return -1;
  }
  std::fprintf(stderr, "tessera run: failed: %s\n", reason.c_str());
  return 1;
}

}  // namespace

int launch(const LaunchOptions &opt, const std::vector<std::string> &worker_args) {
  if (opt.nproc < 1) throw Error(TSR_ERR_CONFIG, "-n must be at least 1");
  if (opt.nnodes < 1 || opt.node_rank < 0 || opt.node_rank >= opt.nnodes)
    throw Error(TSR_ERR_CONFIG, "--node-rank " + std::to_string(opt.node_rank) +
                                    " is not in [0, --nnodes " + std::to_string(opt.nnodes) + ")");
  std::string host;
  uint16_t port = 0;
  master_address(opt, &host, &port);
  // Node 0 serves the rendezvous store for the whole job: on comm.interface's
  // address, else on the master address (loopback for one node), else on
  // every interface (store_listen_address says when and why).
  // The job's secret (docs/security.md): every store connection proves it
  // knows it. The workers inherit it with the environment; it is never printed.
  const std::string secret = launcher_job_secret(opt.job_secret_file, opt.watch_stdin, opt.nnodes);
  ::setenv("TESSERA_JOB_SECRET", secret.c_str(), 1);
  std::unique_ptr<StoreServer> store;
  if (opt.node_rank == 0) {
    std::string note;
    const std::string at = store_listen_address(host, opt.interface, &note);
    if (!note.empty()) std::fprintf(stderr, "tessera run: rendezvous store: %s\n", note.c_str());
    store = std::make_unique<StoreServer>(at, port);
    port = store->port();
  }
  NodeLink link;
  link.watch_stdin = opt.watch_stdin;
  if (opt.node_rank != 0) {
    link.master_host = host;
    link.master_port = port;
  }

  install_stop_signals(on_signal);

  // One attempt per pass; a failure restarts every worker from the latest
  // checkpoint while restarts remain (--max-restarts).
  for (int attempt = 0;; ++attempt) {
    const std::string prefix = "tessera/a" + std::to_string(attempt);
    std::vector<Worker> workers = spawn_workers(opt, attempt, host, port, worker_args);
    std::string reason;
    int failed_rank = -1;
    bool ok = supervise(workers, store.get(), prefix, opt.grace_s, &reason, link, &failed_rank);
    if (!ok && opt.outcome) *opt.outcome = LaunchOutcome{reason, failed_rank};
    if (ok) return 0;
    if (int status = failed_attempt_status(opt, attempt, workers, reason, link); status >= 0)
      return status;
  }
}

}  // namespace tessera
