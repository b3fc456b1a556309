#include "launch/ssh_launch.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>
#include <thread>

#include "launch/child_exec.hpp"
#include "launch/pipe_poll.hpp"
#include "util/error.hpp"
#include "util/text.hpp"

namespace tessera {

namespace {

std::atomic<int> g_ssh_signal{0};
void on_ssh_signal(int sig) {
  g_ssh_signal = sig;
}

struct Node {
  size_t index = 0;
  std::string host;
  int first_rank = 0, nranks = 0;
  pid_t pid = -1;
  int in_fd = -1, out_fd = -1, err_fd = -1;
  std::string out_buf, err_buf;
  std::string verdict;   // its launcher's "tessera run: failed: ..." line, without that
  std::string cause;     // its launcher's earlier "tessera run: X; stopping the other workers"
  std::string last_err;  // its last line on stderr
  bool exited = false;
  int status = 0;
};

// This binary, by its path: the nodes run the same one (a shared or
// identical installation, as the config and data paths must be).
// This program's path, which every node runs: the nodes cannot be started
// without it.
std::string own_path() {
  const std::string p = self_exe("");
  if (p.empty()) throw Error(TSR_ERR_IO, "cannot find this program's path in /proc/self/exe");
  return p;
}

std::string join(const std::vector<std::string> &words) {
  std::string s;
  for (const auto &w : words) {
    if (!s.empty()) s.push_back(' ');
    s.append(shell_quote(w));
  }
  return s;
}

std::string ranks_of(const Node &n) {
  return n.nranks == 1 ? "rank " + std::to_string(n.first_rank)
                       : "ranks " + std::to_string(n.first_rank) + "-" +
                             std::to_string(n.first_rank + n.nranks - 1);
}

void pump(Node &n, int &fd, std::string &buf, FILE *to, bool flush_all, bool is_err) {
  auto emit = [&](const std::string &line) {
    std::fprintf(to, "%s: %s\n", n.host.c_str(), line.c_str());
    if (!is_err) return;
    static const std::string failed = "tessera run: failed: ";
    if (line.rfind(failed, 0) == 0) n.verdict = line.substr(failed.size());
    // The node launcher names the cause as soon as it sees it, long before
    // its own exit: a loaded node can take seconds to stop its other ranks.
    static const std::string head = "tessera run: ", tail = "; stopping the other workers";
    if (n.cause.empty() && line.rfind(head, 0) == 0 && line.size() > head.size() + tail.size() &&
        line.compare(line.size() - tail.size(), tail.size(), tail) == 0)
      n.cause = line.substr(head.size(), line.size() - head.size() - tail.size());
    if (!line.empty()) n.last_err = line;
  };
  pump_lines(fd, buf, flush_all, [&](std::string_view v) { emit(std::string(v)); });
  std::fflush(to);
}

pid_t spawn_ssh(Node &n, const std::vector<std::string> &argv_s) {
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
    throw Error(TSR_ERR_IO, std::string("cannot create pipes: ") + std::strerror(errno));
  ChildExec child(argv_s, {}, "cannot run " + argv_s[0] + " (install openssh-client): ");
  // ssh must not outlive us: its end closes the session, and the node
  // launcher then stops its workers.
  const pid_t pid = fork_tied_child();
  if (pid == 0) {
    // Its own process group: a Ctrl-C at the terminal reaches us, and we
    // stop the nodes (they save a checkpoint first) rather than cut ssh.
    ::setpgid(0, 0);
    ::signal(SIGPIPE, SIG_DFL);
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    child.run(argv_s[0].c_str());
  }
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  n.in_fd = in[1];
  n.out_fd = out[0];
  n.err_fd = err[0];
  return pid;
}

// A node launcher's verdict names one of its own ranks as the cause
// ("rank 3 was killed by signal ..."), not a rank that stopped because of
// another.
const std::string &what_failed(const Node &n) {
  return n.verdict.empty() ? n.cause : n.verdict;
}

bool names_own_rank(const Node &n) {
  static const std::regex re(R"(^rank (\d+) )");
  const std::string &v = what_failed(n);
  std::smatch m;
  if (!std::regex_search(v, m, re)) return false;
  const int r = std::stoi(m[1]);
  return r >= n.first_rank && r < n.first_rank + n.nranks &&
         v.find("because another rank failed") == std::string::npos;
}

std::string describe_node_failure(const Node &n) {
  const std::string where =
      "on " + n.host + " (node " + std::to_string(n.index) + ", " + ranks_of(n) + "): ";
  if (!what_failed(n).empty()) return where + what_failed(n);
  std::string how;
  if (WIFSIGNALED(n.status)) {
    const char *name = sigabbrev_np(WTERMSIG(n.status));
    how = std::string("ssh was killed by signal SIG") + (name ? name : "?");
  } else if (WIFEXITED(n.status) && WEXITSTATUS(n.status) == 255) {
    how = "ssh to " + n.host + " failed (status 255)";
  } else {
    how = "the node launcher exited with status " +
          std::to_string(WIFEXITED(n.status) ? WEXITSTATUS(n.status) : n.status);
  }
  return where + how + (n.last_err.empty() ? "" : ": " + n.last_err);
}

}  // namespace

std::vector<std::string> ssh_command(const SshLaunchOptions &opt, size_t node,
                                     const std::vector<std::string> &node_args) {
  const HostSlots &h = opt.hosts.at(node);
  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string();
  // The remote side: into the same directory, then the node launcher with
  // the forwarded variables (env keeps them off the shell's expansion).
  std::vector<std::string> remote = {"cd", cwd};
  std::string cmd = join(remote) + " && exec env";
  std::vector<std::pair<std::string, std::string>> env = opt.env;
  // --include/--exclude picked some slots of this host: only those devices.
  bool all = true;
  for (size_t i = 0; i < h.slots.size(); ++i) all &= h.slots[i] == static_cast<int>(i);
  if (!all) {
    std::string list;
    for (int s : h.slots) {
      if (!list.empty()) list.push_back(',');
      list.append(std::to_string(s));
    }
    env.emplace_back("CUDA_VISIBLE_DEVICES", list);
  }
  for (const auto &[k, v] : env) {
    // The job secret goes over the session's input, never on a command line.
    if (k == "TESSERA_JOB_SECRET") continue;
    cmd.push_back(' ');
    cmd.append(shell_quote(k + "=" + v));
  }
  std::vector<std::string> launcher = {own_path(),     "run",
                                       "--nnodes",     std::to_string(opt.hosts.size()),
                                       "--node-rank",  std::to_string(node),
                                       "--master",     opt.master,
                                       "-n",           std::to_string(h.slots.size()),
                                       "--watch-stdin"};
  launcher.insert(launcher.end(), node_args.begin(), node_args.end());
  cmd.push_back(' ');
  cmd.append(join(launcher));

  // No terminal (a pty would change the output and the end-of-input that
  // tells the node launcher its session ended); never a password prompt.
  std::vector<std::string> argv = {"ssh", "-T", "-o", "BatchMode=yes"};
  if (opt.ssh_port > 0) {
    argv.push_back("-p");
    argv.push_back(std::to_string(opt.ssh_port));
  }
  argv.insert(argv.end(), opt.ssh_opts.begin(), opt.ssh_opts.end());
  argv.push_back(h.host);
  argv.push_back(cmd);
  return argv;
}

namespace {

// The job's nodes, one per host with the same number of slots each, and
// the ssh command line that starts each one's launcher.
std::vector<Node> plan_nodes(const SshLaunchOptions &opt, const std::vector<std::string> &node_args,
                             std::vector<std::vector<std::string>> *commands) {
  if (opt.hosts.empty()) throw Error(TSR_ERR_CONFIG, "--hostfile: no hosts to run on");
  const int slots = static_cast<int>(opt.hosts.front().slots.size());
  for (const auto &h : opt.hosts)
    if (static_cast<int>(h.slots.size()) != slots)
      throw Error(TSR_ERR_CONFIG, "every node needs the same number of slots: " +
                                      opt.hosts.front().host + " has " + std::to_string(slots) +
                                      ", " + h.host + " has " + std::to_string(h.slots.size()) +
                                      " (even them with --num_gpus, --include or --exclude)");
  std::vector<Node> nodes(opt.hosts.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    nodes[i].index = i;
    nodes[i].host = opt.hosts[i].host;
    nodes[i].first_rank = static_cast<int>(i) * slots;
    nodes[i].nranks = slots;
    commands->push_back(ssh_command(opt, i, node_args));
  }
  return nodes;
}

// Starts each node's launcher over ssh and hands it the job's secret as its
// first line of input (docs/security.md): ssh encrypts it, and no command
// line shows it.
void start_nodes(const SshLaunchOptions &opt, std::vector<Node> &nodes,
                 const std::vector<std::vector<std::string>> &commands) {
  std::fprintf(stderr, "tessera run: %zu nodes x %d ranks, rendezvous store at %s\n", nodes.size(),
               nodes.front().nranks, opt.master.c_str());
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::fprintf(stderr, "tessera run: node %zu: %s (%s) over ssh\n", i, nodes[i].host.c_str(),
                 ranks_of(nodes[i]).c_str());
    nodes[i].pid = spawn_ssh(nodes[i], commands[i]);
    const std::string line = "secret " + opt.job_secret + "\n";
    if (nodes[i].in_fd >= 0) (void)!::write(nodes[i].in_fd, line.data(), line.size());
  }
  std::fflush(stderr);
}

// The head launcher's watch over the node launchers.
struct NodeWatch {
  std::vector<Node> &nodes;
  double grace_s;
  // 0: running; 1: a node failed, the others get a moment to stop on their
  // own (the abort key reaches their workers); 2: "stop" sent to the rest;
  // 3: ssh killed. Ctrl-C or SIGTERM: 2 with the grace period (the node
  // launchers see their input end and stop their workers as on SIGTERM).
  int phase = 0;
  const Node *culprit = nullptr;
  std::chrono::steady_clock::time_point deadline{}, failed_at{};
};

// Ends every node launcher's input; with `stop`, a "stop" line first to
// those still running.
void close_node_input(std::vector<Node> &nodes, bool stop) {
  for (auto &n : nodes) {
    if (n.in_fd < 0) continue;
    if (stop && !n.exited) (void)!::write(n.in_fd, "stop\n", 5);
    ::close(n.in_fd);
    n.in_fd = -1;
  }
}

// Reaps the node launchers that have exited, with their last words (for
// the verdict); a first failure starts phase 1. Returns whether all have.
bool reap_nodes(NodeWatch &nw) {
  bool all_done = true;
  bool newly_failed = false;
  for (auto &n : nw.nodes) {
    if (n.exited) continue;
    int st = 0;
    if (::waitpid(n.pid, &st, WNOHANG) != n.pid) {
      all_done = false;
      continue;
    }
    n.exited = true;
    n.status = st;
    while (n.err_fd >= 0) pump(n, n.err_fd, n.err_buf, stderr, true, true);
    while (n.out_fd >= 0) pump(n, n.out_fd, n.out_buf, stdout, true, false);
    if (exit_failed(st) && nw.phase == 0 && !g_ssh_signal) newly_failed = true;
  }
  if (newly_failed) {
    // Let the other nodes' verdicts arrive: the node whose own rank failed
    // is the cause, not one whose ranks stopped because of it.
    nw.failed_at = std::chrono::steady_clock::now();
    nw.deadline = nw.failed_at + std::chrono::seconds(2);
    nw.phase = 1;
  }
  return all_done;
}

// In phase 1: names the node that caused the failure once it is clear, in
// order of preference a node whose own rank was killed by a signal, one
// whose own rank failed, one whose ssh or launcher failed, then the first
// to fail; then tells the others to stop.
void choose_failed_node(NodeWatch &nw, bool all_done) {
  const Node *first = nullptr, *own = nullptr, *signaled = nullptr, *other = nullptr;
  for (const auto &n : nw.nodes) {
    // A node still stopping its ranks counts once it has named a cause.
    if (n.exited ? !exit_failed(n.status) : n.cause.empty()) continue;
    if (!first) first = &n;
    if (names_own_rank(n)) {
      if (!own) own = &n;
      if (!signaled && what_failed(n).find("killed by signal") != std::string::npos) signaled = &n;
    }
    if (!other && n.exited && what_failed(n).empty()) other = &n;  // ssh or its launcher
  }
  const auto now = std::chrono::steady_clock::now();
  // Without a node that names one of its own ranks, wait longer for one
  // (the abort key is already stopping every rank meanwhile).
  const bool decide = all_done || signaled || (own && now > nw.deadline) ||
                      now > nw.failed_at + std::chrono::seconds(6);
  if (!decide) return;
  nw.culprit = signaled ? signaled : own ? own : other ? other : first;
  if (!all_done)
    std::fprintf(stderr, "tessera run: %s; stopping the other nodes\n",
                 describe_node_failure(*nw.culprit).c_str());
  close_node_input(nw.nodes, true);
  nw.phase = 2;
  nw.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(8);
}

// A signal to the head launcher stops every node; a node that has not
// stopped by the deadline has its ssh killed.
void escalate_nodes(NodeWatch &nw, bool all_done) {
  if (g_ssh_signal && nw.phase == 0) {
    std::fprintf(stderr,
                 "tessera run: %s received; stopping every node (their workers save a "
                 "checkpoint first)\n",
                 g_ssh_signal == SIGINT ? "SIGINT" : "SIGTERM");
    close_node_input(nw.nodes, false);
    nw.phase = 2;
    nw.deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<int>(nw.grace_s * 1000) + 10000);
  }
  if (!all_done && nw.phase == 2 && std::chrono::steady_clock::now() > nw.deadline) {
    for (auto &n : nw.nodes)
      if (!n.exited) {
        std::fprintf(stderr, "tessera run: node %zu (%s) did not stop; killing its ssh\n", n.index,
                     n.host.c_str());
        ::kill(n.pid, SIGKILL);
      }
    nw.phase = 3;
  }
}

// The head launcher's exit status once every node launcher has exited.
int ssh_job_status(const NodeWatch &nw) {
  if (nw.culprit) {
    std::fprintf(stderr, "tessera run: failed: %s\n", describe_node_failure(*nw.culprit).c_str());
    return 1;
  }
  bool clean = true;
  for (const auto &n : nw.nodes) clean &= !exit_failed(n.status);
  if (g_ssh_signal) {
    if (clean) {
      std::fprintf(stderr, "tessera run: stopped by %s after every node saved and exited\n",
                   g_ssh_signal == SIGINT ? "SIGINT" : "SIGTERM");
      return 0;
    }
    return 128 + g_ssh_signal;
  }
  return clean ? 0 : 1;
}

}  // namespace

int launch_over_ssh(const SshLaunchOptions &opt, const std::vector<std::string> &node_args) {
  std::vector<std::vector<std::string>> commands;
  std::vector<Node> nodes = plan_nodes(opt, node_args, &commands);
  if (opt.dry_run) {
    for (size_t i = 0; i < nodes.size(); ++i)
      std::printf("# node %zu: %s, %s\n%s\n", i, nodes[i].host.c_str(), ranks_of(nodes[i]).c_str(),
                  join(commands[i]).c_str());
    return 0;
  }
  install_stop_signals(on_ssh_signal);
  start_nodes(opt, nodes, commands);
  NodeWatch nw{nodes, opt.grace_s};
  for (;;) {
    poll_child_pipes(
        nodes, -1, [] {},
        [&](Node &n, bool is_err) {
          if (is_err)
            pump(n, n.err_fd, n.err_buf, stderr, false, true);
          else
            pump(n, n.out_fd, n.out_buf, stdout, false, false);
        });
    const bool all_done = reap_nodes(nw);
    if (nw.phase == 1 && !nw.culprit) choose_failed_node(nw, all_done);
    escalate_nodes(nw, all_done);
    if (all_done) break;
  }
  close_node_input(nodes, false);
  std::fflush(stdout);
  return ssh_job_status(nw);
}

}  // namespace tessera
