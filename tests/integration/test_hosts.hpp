// The test hosts of the multi-node tests (test_multinode.cpp): two network
// namespaces joined by a veth pair, each with its own address on it and its
// own sshd (TestHosts), and what the tests read from them: the tessera
// processes in a host, their TCP sockets as `ss` lists them.
//
// Making the hosts needs root, iproute2 (ip, ss), sshd and ssh (tools/deps
// installs them); cannot_make_hosts() says why they cannot be made elsewhere.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "harness.hpp"

namespace tessera::itest {

struct Sh {
  int status = -1;
  std::string out;  // stdout and stderr
};

// Runs a shell command line, capturing its output.
Sh sh(const std::string &cmd);

inline const char *const kIp = "/usr/sbin/ip";

// Why two namespace hosts cannot be made here, or "" when they can.
std::string cannot_make_hosts();

// Two hosts: namespaces tsr-a-PID and tsr-b-PID joined by a veth pair whose
// ends are both named tsr0 (one name for comm.interface on every node), at
// 10.77.0.1/24 and 10.77.0.2/24, each running an sshd on port 2222 of its
// own address that takes a throwaway key. The client side is an ssh config
// file (TESSERA_SSH_OPTS="-F FILE"), as a user would write one. Everything
// is torn down in the destructor, whatever happened.
class TestHosts {
 public:
  static constexpr int kSshPort = 2222;
  std::array<std::string, 2> ns, addr = {"10.77.0.1", "10.77.0.2"};
  fs::path dir, ssh_config;

  TestHosts();
  ~TestHosts();
  TestHosts(const TestHosts &) = delete;
  TestHosts &operator=(const TestHosts &) = delete;

  // argv prefix that runs a program inside host h.
  std::vector<std::string> exec_in(int h) const { return {kIp, "netns", "exec", ns[h]}; }

  // What TESSERA_SSH_OPTS holds for the test's ssh config.
  std::string ssh_opts() const { return "-F " + ssh_config.string(); }

  // Tessera processes in host h, by pid.
  std::vector<int> tessera_pids(int h) const;

  // `ss` in host h: TCP sockets, listening (-l) or not, with their process.
  std::string ss(int h, bool listening) const;

 private:
  std::array<int, 2> sshd_ = {-1, -1};

  void run(const std::string &cmd);
  void remove_stale();
  static void kill_all_in(const std::string &name);
  void setup();
  int start_sshd(int h, const fs::path &conf);
  void teardown();
};

// A socket's address as ss prints it ("10.77.0.1:29500", "[::1]:5", "*:22"),
// without the port.
std::string address_of(const std::string &endpoint);

struct SocketLine {
  std::string state, local, peer, line;
};

// ss -Htnp lines of tessera processes.
std::vector<SocketLine> tessera_sockets(const std::string &ss_out);

}  // namespace tessera::itest
