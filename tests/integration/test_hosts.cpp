// The test hosts of the multi-node tests (test_hosts.hpp): network
// namespaces, the veth pair between them, an sshd in each, torn down
// whatever happens; and the `ss` output of their sockets, parsed.
#include "test_hosts.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace tessera::itest {

namespace {

const char *const kSshd = "/usr/sbin/sshd";

// The pids of the processes inside namespace `ns`.
std::vector<int> netns_pids(const std::string &ns) {
  std::vector<int> v;
  std::istringstream in(sh(std::string(kIp) + " netns pids " + ns).out);
  for (int p; in >> p;) v.push_back(p);
  return v;
}

std::string comm_of(int pid) {
  Sh r = sh("cat /proc/" + std::to_string(pid) + "/comm");
  return r.status == 0 ? r.out.substr(0, r.out.find('\n')) : "";
}

}  // namespace

Sh sh(const std::string &cmd) {
  Sh r;
  FILE *f = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!f) return r;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) r.out.append(buf, n);
  const int st = ::pclose(f);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  return r;
}

std::string cannot_make_hosts() {
  if (::geteuid() != 0) return "network namespaces need root";
  for (const char *tool : {kIp, kSshd})
    if (::access(tool, X_OK) != 0)
      return std::string(tool) + " is missing (tools/deps installs iproute2 openssh-server)";
  for (const char *tool : {"ssh", "ssh-keygen", "ss"})
    if (sh(std::string("command -v ") + tool).status != 0)
      return std::string(tool) + " is missing (tools/deps installs openssh-client iproute2)";
  const std::string probe = "tsr-probe-" + std::to_string(::getpid());
  Sh r = sh(std::string(kIp) + " netns add " + probe);
  if (r.status != 0) return "cannot create a network namespace: " + r.out;
  sh(std::string(kIp) + " netns del " + probe);
  return "";
}

TestHosts::TestHosts() {
  const std::string id = std::to_string(::getpid());
  ns = {"tsr-a-" + id, "tsr-b-" + id};
  dir = scratch() / "hosts";
  fs::create_directories(dir);
  remove_stale();
  try {
    setup();
  } catch (...) {
    teardown();
    throw;
  }
}

TestHosts::~TestHosts() {
  teardown();
}

// Tessera processes in host h, by pid.
std::vector<int> TestHosts::tessera_pids(int h) const {
  std::vector<int> v;
  for (int pid : netns_pids(ns[h]))
    if (comm_of(pid) == "tessera") v.push_back(pid);
  return v;
}

// `ss` in host h: TCP sockets, listening (-l) or not, with their process.
std::string TestHosts::ss(int h, bool listening) const {
  return sh(std::string(kIp) + " netns exec " + ns[h] + " ss -Htnp" + (listening ? "l" : "")).out;
}

void TestHosts::run(const std::string &cmd) {
  Sh r = sh(cmd);
  if (r.status != 0) throw std::runtime_error("'" + cmd + "' failed: " + r.out);
}

// Namespaces of earlier runs of this test that died before tearing down.
void TestHosts::remove_stale() {
  std::istringstream in(sh(std::string(kIp) + " netns list").out);
  for (std::string line; std::getline(in, line);) {
    const std::string name = line.substr(0, line.find(' '));
    if (name.rfind("tsr-a-", 0) != 0 && name.rfind("tsr-b-", 0) != 0) continue;
    const std::string pid = name.substr(6);
    if (fs::exists("/proc/" + pid)) continue;  // a test running now
    kill_all_in(name);
    sh(std::string(kIp) + " netns del " + name);
  }
}

void TestHosts::kill_all_in(const std::string &name) {
  for (int pid : netns_pids(name)) ::kill(pid, SIGKILL);
}

void TestHosts::setup() {
  const std::string ip = kIp, id = std::to_string(::getpid() % 100000);
  const std::string va = "tsra" + id, vb = "tsrb" + id;  // names in the root namespace
  run(ip + " netns add " + ns[0]);
  run(ip + " netns add " + ns[1]);
  run(ip + " link add " + va + " type veth peer name " + vb);
  run(ip + " link set " + va + " netns " + ns[0]);
  run(ip + " link set " + vb + " netns " + ns[1]);
  run(ip + " -n " + ns[0] + " link set " + va + " name tsr0");
  run(ip + " -n " + ns[1] + " link set " + vb + " name tsr0");
  for (int h = 0; h < 2; ++h) {
    run(ip + " -n " + ns[h] + " addr add " + addr[h] + "/24 dev tsr0");
    run(ip + " -n " + ns[h] + " link set tsr0 up");
    run(ip + " -n " + ns[h] + " link set lo up");
  }
  // Throwaway keys: the hosts' and the user's.
  for (const char *k : {"host_key", "user_key"}) {
    fs::remove(dir / k);
    fs::remove(dir / (std::string(k) + ".pub"));
    run("ssh-keygen -q -t ed25519 -N '' -C tessera-test -f " + (dir / k).string());
  }
  ssh_config = dir / "ssh_config";
  write_text(ssh_config,
             "Host 10.77.0.*\n"
             "  IdentityFile " +
                 (dir / "user_key").string() +
                 "\n"
                 "  IdentitiesOnly yes\n"
                 "  StrictHostKeyChecking no\n"
                 "  UserKnownHostsFile /dev/null\n"
                 "  LogLevel ERROR\n"
                 "  ConnectTimeout 5\n");
  // sshd's privilege separation directory.
  fs::create_directories("/run/sshd");
  for (int h = 0; h < 2; ++h) {
    const fs::path conf = dir / ("sshd_" + std::to_string(h) + ".conf");
    write_text(conf, "ListenAddress " + addr[h] +
                         "\n"
                         "Port " +
                         std::to_string(kSshPort) +
                         "\n"
                         "HostKey " +
                         (dir / "host_key").string() +
                         "\n"
                         "AuthorizedKeysFile " +
                         (dir / "user_key.pub").string() +
                         "\n"
                         "PermitRootLogin prohibit-password\n"
                         "StrictModes no\n"
                         "PasswordAuthentication no\n"
                         "KbdInteractiveAuthentication no\n"
                         "UsePAM no\n"
                         "PrintMotd no\n"
                         "PidFile " +
                         (dir / ("sshd_" + std::to_string(h) + ".pid")).string() + "\n");
    sshd_[h] = start_sshd(h, conf);
  }
  // Both sshds answer, from host a (where the head launcher runs).
  for (int h = 0; h < 2; ++h) {
    const double until = now_s() + 15;
    Sh r;
    for (;;) {
      r = sh(std::string(kIp) + " netns exec " + ns[0] + " ssh -F " + ssh_config.string() +
             " -o BatchMode=yes -p " + std::to_string(kSshPort) + " " + addr[h] + " true");
      if (r.status == 0) break;
      if (now_s() > until)
        throw std::runtime_error("sshd on " + addr[h] + " does not answer: " + r.out + "\n" +
                                 read_text(dir / ("sshd_" + std::to_string(h) + ".log")));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

int TestHosts::start_sshd(int h, const fs::path &conf) {
  const std::string log = (dir / ("sshd_" + std::to_string(h) + ".log")).string();
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the test
    if (::getppid() != parent) ::_exit(1);
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int in = ::open("/dev/null", O_RDONLY);
    if (fd < 0 || in < 0) ::_exit(125);
    ::dup2(in, 0);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execl(kIp, kIp, "netns", "exec", ns[h].c_str(), kSshd, "-D", "-e", "-f", conf.c_str(),
            static_cast<char *>(nullptr));
    ::_exit(127);
  }
  return pid;
}

void TestHosts::teardown() {
  for (int h = 0; h < 2; ++h) {
    if (sshd_[h] > 0) {
      ::kill(sshd_[h], SIGKILL);
      int st = 0;
      ::waitpid(sshd_[h], &st, 0);
      sshd_[h] = -1;
    }
    // Whatever is left in the namespace is this test's: ssh sessions, node
    // launchers, workers.
    kill_all_in(ns[h]);
    sh(std::string(kIp) + " netns del " + ns[h]);
  }
}

std::string address_of(const std::string &endpoint) {
  auto colon = endpoint.rfind(':');
  std::string a = endpoint.substr(0, colon);
  if (a.size() >= 2 && a.front() == '[') a = a.substr(1, a.size() - 2);
  auto pct = a.find('%');  // 10.77.0.1%tsr0 when bound to a device
  return a.substr(0, pct);
}

std::vector<SocketLine> tessera_sockets(const std::string &ss_out) {
  std::vector<SocketLine> v;
  for (const auto &line : lines(ss_out)) {
    if (!contains(line, "\"tessera\"")) continue;
    std::istringstream in(line);
    SocketLine s;
    std::string rq, sq;
    in >> s.state >> rq >> sq >> s.local >> s.peer;
    s.line = line;
    v.push_back(s);
  }
  return v;
}

}  // namespace tessera::itest
