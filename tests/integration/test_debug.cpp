// Debugging a run (docs/debugging.md): gdb in batch mode breaks in a
// plugin's forward in a one-process run and in a rank held by --debug-rank;
// a held rank outlasts comm.timeout_s without failing the job; --debug-with
// gdb opens gdb in a tmux window; the launcher names a crashed rank's core
// dump; `tessera debug vscode` writes launch.json.
//
// The breakpoint is `break mlp_forward`, a function name: gdb resolves it
// from the plugin's ELF symbol table, so it binds in CI's Release build
// (no -g) as well as in a RelWithDebInfo one, where it also gets file and
// line. Line breakpoints need -g: tools/quickstart --debug.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <thread>

#include "harness.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace itest_test_debug {

using namespace tessera::itest;

namespace {

std::string on_path(const std::string &program) {
  const char *path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  for (size_t start = 0; start <= p.size();) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string candidate = p.substr(start, end - start) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

std::string gdb_path() {
  std::string gdb = on_path("gdb");
  if (gdb.empty()) FAIL("gdb is not on PATH: these tests need it (tools/deps installs it)");
  return gdb;
}

// Variables that would change what the child does: a launcher's, a debug
// job's, tmux's session, and debuginfod (gdb would try the network).
const char *const kUnset[] = {"RANK",
                              "WORLD_SIZE",
                              "LOCAL_RANK",
                              "LOCAL_WORLD_SIZE",
                              "MASTER_ADDR",
                              "MASTER_PORT",
                              "OMPI_COMM_WORLD_RANK",
                              "OMPI_COMM_WORLD_SIZE",
                              "SLURM_PROCID",
                              "SLURM_NTASKS",
                              "TESSERA_PLUGIN_PATH",
                              "TESSERA_DEBUG_RANKS",
                              "TESSERA_DEBUG_WAIT",
                              "TESSERA_DEBUG_WITH",
                              "TMUX",
                              "DEBUGINFOD_URLS"};

// A program running beside the test, its output in files. Its own process
// group: going away (a failed REQUIRE) kills it and every worker with it.
struct Child {
  pid_t pid = -1;
  fs::path out_path, err_path;
  int status = -1;  // exit code; 128 + signal

  Child(const std::vector<std::string> &argv, const std::map<std::string, std::string> &env = {},
        bool core_dumps = false) {
    static int counter = 0;
    const fs::path dir = scratch() / "proc";
    fs::create_directories(dir);
    const std::string tag = "child" + std::to_string(++counter);
    out_path = dir / (tag + ".out");
    err_path = dir / (tag + ".err");
    write_text(out_path, "");  // readable before the child opens them
    write_text(err_path, "");
    std::vector<char *> args;
    for (const auto &a : argv) args.push_back(const_cast<char *>(a.c_str()));
    args.push_back(nullptr);
    const std::string cwd = scratch().string();
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::setpgid(0, 0);
      FILE *o = std::freopen(out_path.c_str(), "w", stdout);
      FILE *e = std::freopen(err_path.c_str(), "w", stderr);
      FILE *i = std::freopen("/dev/null", "r", stdin);
      if (!o || !e || !i || ::chdir(cwd.c_str()) != 0) ::_exit(125);
      for (const char *v : kUnset) ::unsetenv(v);
      for (const auto &[k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      if (core_dumps) {
        struct rlimit rl {};
        ::getrlimit(RLIMIT_CORE, &rl);
        rl.rlim_cur = rl.rlim_max;
        ::setrlimit(RLIMIT_CORE, &rl);
      }
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::setpgid(pid, pid);
  }
  Child(const Child &) = delete;
  Child &operator=(const Child &) = delete;
  ~Child() {
    if (status < 0 && pid > 0) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }

  std::string out() const { return read_text(out_path); }
  std::string err() const { return read_text(err_path); }
  std::string all() const { return out() + err(); }
  bool running() {
    if (status >= 0) return false;
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) != pid) return true;
    status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return false;
  }
  // Waits for the exit; kills the process group after `timeout_s`.
  int wait(double timeout_s) {
    const double end = now_s() + timeout_s;
    while (running()) {
      if (now_s() > end) {
        ::kill(-pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        status = 137;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return status;
  }
  std::string describe() const {
    return "exit status " + std::to_string(status) + "\n--- stdout ---\n" + out() +
           "--- stderr ---\n" + err();
  }
};

// Polls `ready` every 50 ms; false after `timeout_s`.
bool eventually(double timeout_s, const std::function<bool()> &ready) {
  const double end = now_s() + timeout_s;
  while (now_s() < end) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return ready();
}

// The PID rank `rank` of a --debug-rank job prints while it waits.
int held_pid(Child &job, int rank) {
  const std::regex re("rank " + std::to_string(rank) + R"( \(pid ([0-9]+)\) is waiting)");
  std::smatch m;
  std::string err;
  bool found = eventually(30, [&] {
    err = job.err();
    return std::regex_search(err, m, re) || !job.running();
  });
  INFO(job.describe());
  REQUIRE(found);
  REQUIRE(std::regex_search(err, m, re));
  return std::stoi(m[1].str());
}

std::vector<std::string> tessera_run(const Setup &s, std::vector<std::string> extra) {
  std::vector<std::string> v = {TESSERA_BINARY, "run", s.config.string()};
  v.insert(v.end(), extra.begin(), extra.end());
  return v;
}

}  // namespace

TEST_CASE("one process: gdb breaks in the mlp plugin's forward and the run completes", "[debug]") {
  const std::string gdb = gdb_path();
  Setup s = setup();
  // Started by gdb itself: the breakpoint is pending until the run loads
  // the plugin, and it can only hit if training runs in this process.
  Child g({gdb,
           "-batch",
           "-nx",
           "-ex",
           "set breakpoint pending on",
           "-ex",
           "break mlp_forward",
           "-ex",
           "run",
           "-ex",
           "bt 3",
           "-ex",
           "delete",
           "-ex",
           "continue",
           "--args",
           TESSERA_BINARY,
           "run",
           s.config.string(),
           "--set",
           "run.steps=5"});
  g.wait(90);
  const std::string out = g.all();
  INFO(g.describe());
  // The breakpoint hits only if training runs in this process (a worker
  // forked for it would be detached from gdb). Forks there are: the plugin
  // registry loads each library in a child first (docs/security.md), and
  // those children exec nothing.
  CHECK(out.find("hit Breakpoint 1") != std::string::npos);
  CHECK(out.find("mlp_forward") != std::string::npos);
  CHECK(out.find("is executing new program") == std::string::npos);
  CHECK(out.find("exited normally") != std::string::npos);
  CHECK(fs::exists(s.run_dir / "summary.json"));
}

TEST_CASE("rank 1 held by --debug-rank: gdb attaches by its PID, breaks in forward, the job ends 0",
          "[debug]") {
  const std::string gdb = gdb_path();
  Setup s = setup();
  Child job(tessera_run(s, {"-n", "2", "--debug-rank", "1", "--debug-wait", "60"}));
  const int pid = held_pid(job, 1);
  // The hint may arrive a moment after the "is waiting" line.
  CHECK(eventually(
      10, [&] { return job.err().find("gdb -p " + std::to_string(pid)) != std::string::npos; }));
  Child g({gdb, "-batch", "-nx", "-p", std::to_string(pid), "-ex", "break mlp_forward", "-ex",
           "continue", "-ex", "bt 1"});
  g.wait(60);
  {
    INFO(g.describe());
    CHECK(g.all().find("hit Breakpoint 1") != std::string::npos);
    CHECK(g.all().find("mlp_forward") != std::string::npos);
    CHECK(g.all().find("detached") != std::string::npos);
  }
  job.wait(60);
  INFO(job.describe());
  REQUIRE(job.status == 0);
  CHECK(job.err().find("rank 1: debugger attached; continuing") != std::string::npos);
  CHECK(fs::exists(s.run_dir / "summary.json"));
}

TEST_CASE("control: a rank stopped longer than comm.timeout_s fails a plain job", "[debug]") {
  // Without --debug-rank the same hold as below must fail the job, or the
  // next test would prove nothing.
  Setup s = setup("\n[comm]\ntimeout_s = 2\n");
  Child job(tessera_run(s, {"-n", "2", "--set", "run.steps=100000"}));
  REQUIRE(eventually(30, [&] { return job.out().find(" 10/100000 |") != std::string::npos; }));
  std::ifstream children("/proc/" + std::to_string(job.pid) + "/task/" + std::to_string(job.pid) +
                         "/children");
  int first = 0, second = 0;
  children >> first >> second;
  REQUIRE(second > 0);
  ::kill(second, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::seconds(5));
  ::kill(second, SIGCONT);
  job.wait(30);
  INFO(job.describe());
  CHECK(job.status == 1);
  CHECK(job.all().find("timed out after 2 s (comm.timeout_s)") != std::string::npos);
}

TEST_CASE(
    "debug-rank: a rank held 3 s at start-up and 5 s at a breakpoint, over "
    "comm.timeout_s = 2, does not time out the job",
    "[debug]") {
  const std::string gdb = gdb_path();
  Setup s = setup("\n[comm]\ntimeout_s = 2\n");
  Child job(tessera_run(s, {"-n", "2", "--debug-rank", "1", "--debug-wait", "60"}));
  const int pid = held_pid(job, 1);
  // Rank 0 waits for rank 1 at the rendezvous meanwhile.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  // The 11th forward: rank 0 is mid-training, waiting in a collective.
  Child g({gdb, "-batch", "-nx", "-p", std::to_string(pid), "-ex", "break mlp_forward", "-ex",
           "ignore 1 10", "-ex", "continue", "-ex", "shell sleep 5"});
  g.wait(60);
  {
    INFO(g.describe());
    CHECK(g.all().find("hit Breakpoint 1") != std::string::npos);
  }
  job.wait(60);
  INFO(job.describe());
  CHECK(job.status == 0);
  CHECK(job.all().find("timed out") == std::string::npos);
  CHECK(fs::exists(s.run_dir / "summary.json"));
}

TEST_CASE("debug-with gdb opens gdb on the held rank in a tmux window", "[debug]") {
  const std::string gdb = gdb_path(), tmux = on_path("tmux");
  if (tmux.empty()) {
    WARN("tmux is not installed: --debug-with gdb in tmux not tested");
    return;
  }
  Setup s = setup();
  // A private tmux server (a short socket path: sun_path holds 108 bytes).
  const std::string sock = "/tmp/tessera-debug-test-" + std::to_string(::getpid()) + ".sock";
  struct Server {
    std::string tmux, sock;
    ~Server() {
      Child k({tmux, "-S", sock, "kill-server"});
      k.wait(10);
      fs::remove(sock);
    }
  } server{tmux, sock};
  Child start({tmux, "-S", sock, "-f", "/dev/null", "new-session", "-d", "-s", "tsr", "-x", "200",
               "-y", "50"});
  REQUIRE(start.wait(10) == 0);
  Child info({tmux, "-S", sock, "display-message", "-p", "#{pid}"});
  REQUIRE(info.wait(10) == 0);
  const std::string server_pid = info.out().substr(0, info.out().find('\n'));
  auto pane = [&] {
    Child c({tmux, "-S", sock, "capture-pane", "-p", "-t", "tsr:tessera rank 1"});
    c.wait(10);
    return c.out();
  };

  Child job(
      tessera_run(s, {"-n", "2", "--debug-rank", "1", "--debug-with", "gdb", "--debug-wait", "60"}),
      {{"TMUX", sock + "," + server_pid + ",0"}});
  held_pid(job, 1);
  REQUIRE(eventually(
      30, [&] { return job.err().find("gdb is attaching in tmux window") != std::string::npos; }));
  // gdb attached and prompting: the rank is stopped in its wait.
  REQUIRE(eventually(30, [&] {
    std::string p = pane();
    return p.find("start-up wait") != std::string::npos && p.find("(gdb)") != std::string::npos;
  }));
  Child keys({tmux, "-S", sock, "send-keys", "-t", "tsr:tessera rank 1", "continue", "Enter"});
  keys.wait(10);
  job.wait(60);
  INFO(job.describe());
  INFO(pane());
  CHECK(job.status == 0);
  CHECK(job.err().find("rank 1: debugger attached; continuing") != std::string::npos);
  CHECK(eventually(10, [&] { return pane().find("exited normally") != std::string::npos; }));
}

TEST_CASE("the launcher names where a crashed rank's core dump went", "[debug]") {
  Setup s = setup();
  Child job(tessera_run(s, {"-n", "2", "--debug-rank", "1", "--debug-wait", "0"}), {}, true);
  const int pid = held_pid(job, 1);
  ::kill(pid, SIGSEGV);
  job.wait(60);
  const std::string err = job.err();
  INFO(job.describe());
  CHECK(job.status == 1);
  CHECK(err.find("rank 1 was killed by signal SIGSEGV") != std::string::npos);
  std::smatch m;
  REQUIRE(std::regex_search(err, m, std::regex("tessera run: rank 1: (core dumped|no core dump)")));
  // With a plain kernel.core_pattern ("core", "core.%p", ...) the file is
  // in the worker's directory, named in full.
  std::smatch f;
  if (std::regex_search(err, f, std::regex("core dumped to (/[^;]+); open it with: gdb "))) {
    CHECK(fs::exists(f[1].str()));
    fs::remove(f[1].str());
  }
}

TEST_CASE("tessera debug vscode writes .vscode/launch.json, and keeps an existing one", "[debug]") {
  const fs::path dir = scratch() / "project";
  const fs::path file = dir / ".vscode" / "launch.json";
  RunResult r = run_cli({"debug", "vscode", dir.string()});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  const std::string text = read_text(file);
  auto j = nlohmann::json::parse(text, nullptr, true, true);  // VS Code allows comments
  std::set<std::string> requests;
  for (const auto &c : j.at("configurations")) {
    CHECK(c.at("type") == "cppdbg");
    CHECK(fs::equivalent(c.at("program").get<std::string>(), TESSERA_BINARY));
    requests.insert(c.at("request").get<std::string>());
  }
  CHECK(requests == std::set<std::string>{"launch", "attach"});
  // The same file as docs/vscode/launch.json, but for the binary's path.
  std::string shipped = read_text(fs::path(TESSERA_SOURCE_DIR) / "docs/vscode/launch.json");
  const std::string placeholder = "${workspaceFolder}/build-debug/bin/tessera";
  for (size_t at; (at = shipped.find(placeholder)) != std::string::npos;)
    shipped.replace(at, placeholder.size(), fs::canonical(TESSERA_BINARY).string());
  CHECK(text == shipped);

  write_text(file, "{}\n");
  RunResult again = run_cli({"debug", "vscode", dir.string()});
  CHECK(again.status == 1);
  CHECK(again.err.find("--force") != std::string::npos);
  CHECK(read_text(file) == "{}\n");
  RunResult forced = run_cli({"debug", "vscode", dir.string(), "--force"});
  CHECK(forced.status == 0);
  CHECK(read_text(file) == text);
}

TEST_CASE("debug options are checked before anything starts", "[debug]") {
  Setup s = setup();
  RunResult r = run_cli({"run", s.config.string(), "-n", "2", "--debug-rank", "2"});
  CHECK(r.status != 0);
  CHECK(r.err.find("--debug-rank 2: the job has 2 ranks (0..1)") != std::string::npos);
  r = run_cli({"run", s.config.string(), "-n", "2", "--debug-rank", "one"});
  CHECK(r.status == 2);
  r = run_cli({"run", s.config.string(), "-n", "2", "--debug-wait", "5"});
  CHECK(r.status == 2);
  CHECK(r.err.find("need --debug-rank") != std::string::npos);
  r = run_cli({"run", s.config.string(), "-n", "2", "--debug-rank", "1", "--debug-with", "lldb"});
  CHECK(r.status == 2);
}

}  // namespace itest_test_debug
