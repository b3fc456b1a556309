// Multi-node jobs across separate network hosts (issue 11): two test hosts,
// each a network namespace with its own address on a veth pair between them
// (10.77.0.1 and 10.77.0.2) and its own sshd, and tessera run between them:
//
//   hostfile   `tessera run --hostfile` started in host a ssh-es to both
//              hosts and trains as the single-host 4-rank run does; the
//              store and Gloo connections use the hosts' addresses only
//   per node   `tessera run --nnodes 2 --node-rank R` started in each host
//              trains the same
//   faults     a rank killed on host b ends the job on both hosts within
//              10 s, and the verdict names the host and the rank
//   selection  hostfile errors, --include/--exclude/--num_*, the forwarded
//              environment (--dry-run; needs no namespaces)
//
// Why the traffic stays on the test addresses: each namespace has only its
// loopback and its end of the veth, whose /24 is its only route (checked).
// A job that works across the two namespaces therefore carried its cross-host
// traffic over the veth. Same-host traffic could still use loopback; the
// hostfile test sets comm.interface to the veth's name and checks with `ss`,
// while the job runs, that every TCP socket of a tessera process in either
// namespace (listening or connected, the store's and Gloo's) is on
// 10.77.0.x, and that connections between the two hosts exist.
//
// The test hosts (namespaces, veth, sshd) and the reading of their processes
// and sockets are test_hosts.{hpp,cpp}. The tests need root, iproute2 (ip,
// ss), sshd and ssh (tools/deps installs them); elsewhere they print
// "SKIPPED: why" and ctest reports them skipped.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <set>
#include <thread>

#include "equivalence.hpp"
#include "harness.hpp"
#include "test_hosts.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace itest_test_multinode {

using namespace tessera::itest;
using nlohmann::json;

namespace {

// Skips the test case (ctest matches "SKIPPED:", see CMakeLists.txt).
#define SKIP_TEST(why)                           \
  do {                                           \
    std::printf("SKIPPED: %s\n", (why).c_str()); \
    std::fflush(stdout);                         \
    return;                                      \
  } while (0)

constexpr int kSteps = 200;

// `run` trained exactly as `ref` did: the loss of every logged step and every
// final parameter within 1e-5 relative (and 1e-7 absolute near zero).
void check_same_training(const fs::path &ref, const fs::path &run) {
  INFO(run.string() << " against " << ref.string());
  REQUIRE(fs::exists(run / "summary.json"));
  CHECK(read_json(run / "summary.json").at("world_size") == 4);
  const auto a = train_losses(read_jsonl(ref / "metrics.jsonl"));
  const auto b = train_losses(read_jsonl(run / "metrics.jsonl"));
  REQUIRE(!a.empty());
  REQUIRE(b.size() == a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("logged loss " << i << ": " << b[i] << ", reference " << a[i]);
    CHECK(std::fabs(a[i] - b[i]) <= 1e-5 * std::fabs(a[i]));
  }
  const auto pa = final_params(ref, kSteps), pb = final_params(run, kSteps);
  REQUIRE(!pa.empty());
  REQUIRE(!pb.empty());
  REQUIRE(pb.size() == pa.size());
  for (const auto &[name, t] : pa) {
    INFO(name);
    REQUIRE(pb.count(name) == 1);
    REQUIRE(pb.at(name).data.size() == t.data.size());
    double worst = 0;
    for (size_t i = 0; i < t.data.size(); ++i)
      worst = std::max(worst, std::fabs(static_cast<double>(pb.at(name).data[i]) - t.data[i]) /
                                  (1e-5 * std::fabs(t.data[i]) + 1e-7));
    CHECK(worst <= 1.0);
  }
}

std::string verdict_of(const std::string &err) {
  std::string found;
  for (const auto &line : lines(err))
    if (line.rfind("tessera run: failed: ", 0) == 0) found = line;
  return found;
}

}  // namespace

TEST_CASE("a job across two network hosts, by hostfile over ssh and per node, trains as on one",
          "[multinode]") {
  if (std::string why = cannot_make_hosts(); !why.empty()) SKIP_TEST(why);
  Setup s = setup("\n[zero]\nplugin = \"stage2\"\n");
  const fs::path ref = scratch() / "ref", viassh = scratch() / "hostfile",
                 pernode = scratch() / "pernode";
  auto dir_set = [](const fs::path &d) { return "run.dir=\"" + d.string() + "\""; };
  const std::string steps = "run.steps=" + std::to_string(kSteps);

  // The reference: 4 ranks on this host.
  double t0 = now_s();
  RunOptions ro;
  ro.timeout_s = 120;
  RunResult r =
      run_cli({"run", "-n", "4", s.config.string(), "--set", steps, "--set", dir_set(ref)}, ro);
  INFO(describe(r));
  REQUIRE(r.status == 0);
  std::printf("  single host, 4 ranks: %.1f s\n", now_s() - t0);

  t0 = now_s();
  TestHosts hosts;
  std::printf("  two hosts with sshd: %.1f s\n", now_s() - t0);
  // Each host's only route is the veth's /24: no default route, no other link.
  for (int h = 0; h < 2; ++h) {
    const std::string routes = sh(std::string(kIp) + " -n " + hosts.ns[h] + " -4 route").out;
    INFO("routes in " << hosts.ns[h] << ":\n" << routes);
    CHECK(lines(routes).size() == 1);
    CHECK(contains(routes, "10.77.0.0/24 dev tsr0"));
  }

  SECTION("hostfile over ssh") {
    const fs::path hostfile = scratch() / "hostfile.txt";
    write_text(hostfile, "# two test hosts\n10.77.0.1 slots=2\n10.77.0.2 slots=2  # host b\n");
    // Forwarded to the nodes: a variable named by --env, one from
    // ./.tessera_env.
    write_text(scratch() / ".tessera_env", "# test\nTSR_MN_FILE=from-file\n");
    RunOptions o;
    o.timeout_s = 120;
    o.env = {{"TESSERA_SSH_OPTS", hosts.ssh_opts()}, {"TSR_MN_ENV", "from-env"}};
    std::vector<std::string> argv = hosts.exec_in(0);
    argv.insert(argv.end(),
                {TESSERA_BINARY, "run", "--hostfile", hostfile.string(), "--ssh-port",
                 std::to_string(TestHosts::kSshPort), "--env", "TSR_MN_ENV", s.config.string(),
                 "--set", steps, "--set", dir_set(viassh), "--set", "comm.interface=\"tsr0\""});
    t0 = now_s();
    Process head = start_command(argv, o);
    // While it runs: every socket of a tessera process on either host.
    std::vector<SocketLine> seen;
    std::set<std::string> env_file, env_opt;
    while (!head.poll()) {
      for (int h = 0; h < 2; ++h) {
        for (auto &sl : tessera_sockets(hosts.ss(h, true))) seen.push_back(sl);
        for (auto &sl : tessera_sockets(hosts.ss(h, false))) seen.push_back(sl);
      }
      for (int pid : hosts.tessera_pids(1)) {
        env_file.insert(process_env(pid, "TSR_MN_FILE"));
        env_opt.insert(process_env(pid, "TSR_MN_ENV"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    RunResult hr = head.wait();
    std::printf("  hostfile over ssh, 2 hosts x 2 ranks: %.1f s\n", now_s() - t0);
    INFO(describe(hr));
    REQUIRE(hr.status == 0);
    // Output comes prefixed with the host, rank 0's progress from host a.
    CHECK(contains(hr.out, "10.77.0.1: [rank 0] step " + std::to_string(kSteps)));
    check_same_training(ref, viassh);

    // The environment reached host b's node launcher and workers.
    CHECK(env_file.count("from-file") == 1);
    CHECK(env_opt.count("from-env") == 1);

    // Every packet on the test hosts' own addresses.
    INFO("sockets of tessera processes seen during the run:\n"
         << [&] {
              std::string t;
              for (const auto &sl : seen) t += sl.line + "\n";
              return t;
            }());
    REQUIRE(!seen.empty());
    bool store_on_iface = false, cross_host = false;
    for (const auto &sl : seen) {
      INFO(sl.line);
      CHECK(address_of(sl.local).rfind("10.77.0.", 0) == 0);
      if (sl.state == "LISTEN") {
        store_on_iface |= sl.local == "10.77.0.1:29500";
      } else {
        CHECK(address_of(sl.peer).rfind("10.77.0.", 0) == 0);
        cross_host |= address_of(sl.local) != address_of(sl.peer);
      }
    }
    CHECK(store_on_iface);  // node 0's store, on tsr0's address
    CHECK(cross_host);      // connections between the two hosts
  }

  SECTION("per node, one launcher started in each host") {
    std::vector<Process> nodes;
    // Started by hand, the node launchers share the job secret through a
    // file only this user reads (docs/security.md).
    const fs::path secret = scratch() / "job_secret";
    write_text(secret, "0123456789abcdef0123456789abcdef\n");
    fs::permissions(secret, fs::perms::owner_read | fs::perms::owner_write);
    t0 = now_s();
    for (int h = 0; h < 2; ++h) {
      RunOptions o;
      o.timeout_s = 120;
      std::vector<std::string> argv = hosts.exec_in(h);
      argv.insert(argv.end(),
                  {TESSERA_BINARY, "run", "--nnodes", "2", "--node-rank", std::to_string(h),
                   "--master", "10.77.0.1:29500", "-n", "2", "--job-secret-file", secret.string(),
                   s.config.string(), "--set", steps, "--set", dir_set(pernode)});
      nodes.push_back(start_command(argv, o));
    }
    RunResult r0 = nodes[0].wait(), r1 = nodes[1].wait();
    std::printf("  per node, 2 hosts x 2 ranks: %.1f s\n", now_s() - t0);
    INFO("node 0: " << describe(r0) << "\nnode 1: " << describe(r1));
    REQUIRE(r0.status == 0);
    REQUIRE(r1.status == 0);
    check_same_training(ref, pernode);
  }
}

TEST_CASE("a rank killed on the second host ends the job on both hosts within 10 s",
          "[multinode]") {
  if (std::string why = cannot_make_hosts(); !why.empty()) SKIP_TEST(why);
  Setup s = setup();
  TestHosts hosts;
  const fs::path hostfile = scratch() / "hostfile.txt";
  write_text(hostfile, "10.77.0.1 slots=2\n10.77.0.2 slots=2\n");
  RunOptions o;
  o.timeout_s = 120;
  // The fault injection reaches host b through the TESSERA_ prefix rule.
  o.env = {{"TESSERA_SSH_OPTS", hosts.ssh_opts()}, {"TESSERA_TEST_CRASH", "rank=3,step=30"}};
  std::vector<std::string> argv = hosts.exec_in(0);
  argv.insert(argv.end(),
              {TESSERA_BINARY, "run", "--hostfile", hostfile.string(), "--ssh-port",
               std::to_string(TestHosts::kSshPort), s.config.string(), "--set", "run.steps=1000000",
               "--set", "run.log_every=10", "--set", "comm.timeout_s=60"});
  Process head = start_command(argv, o);
  const bool crashed = wait_for_text(head, "TESSERA_TEST_CRASH: killing rank 3", 90, true);
  const double crash_at = now_s();
  INFO("head launcher output:\n" << head.out() << head.err());
  REQUIRE(crashed);
  // The head, and every tessera process on both hosts, gone within 10 s.
  bool all_gone = false;
  while (now_s() - crash_at < 15) {
    const bool head_done = head.poll();
    all_gone = head_done && hosts.tessera_pids(0).empty() && hosts.tessera_pids(1).empty();
    if (all_gone) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double took = now_s() - crash_at;
  std::printf("  rank 3 killed on host b: job gone from both hosts in %.2f s\n", took);
  RunResult r = head.wait();
  INFO(describe(r));
  REQUIRE(all_gone);
  CHECK(took <= 10.0);
  CHECK(r.status == 1);
  const std::string verdict = verdict_of(r.err);
  INFO("verdict: " << verdict);
  CHECK(contains(verdict, "on 10.77.0.2 (node 1, ranks 2-3): rank 3 was killed by signal SIGKILL"));
}

TEST_CASE("hostfile errors, --include/--exclude/--num_*, and the forwarded environment",
          "[multinode]") {
  // --dry-run prints each node's ssh command: no ssh, no namespaces.
  const fs::path hf = scratch() / "hosts";
  auto dry = [&](const std::string &hostfile, std::vector<std::string> extra) {
    write_text(hf, hostfile);
    std::vector<std::string> args = {"run", "--hostfile", hf.string(), "--dry-run"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("config.toml");
    RunOptions o;
    o.env = {{"TESSERA_SSH_OPTS", "-F '/tmp/my ssh config'"},
             {"NCCL_DEBUG", "INFO"},
             {"TSR_MN_X", "it's"}};
    return run_cli(args, o);
  };
  const std::string three = "# cluster\nw0 slots=4\n\nw1 slots=4 # spare\nw2 slots=4\n";
  {
    RunResult r = dry("w0 slots=2\nw1 slot=2\n", {});
    INFO(describe(r));
    CHECK(r.status != 0);
    CHECK(contains(r.err, hf.string() + ":2: expected 'HOST slots=N', got 'w1 slot=2'"));
  }
  {
    RunResult r = dry("w0 slots=2\n# again\nw0 slots=4\n", {});
    INFO(describe(r));
    CHECK(r.status != 0);
    CHECK(contains(r.err, hf.string() + ":3: host 'w0' is listed twice (first at line 1)"));
  }
  {
    RunResult r = dry("w0 slots=0\n", {});
    INFO(describe(r));
    CHECK(contains(r.err, hf.string() + ":1: 'slots=0'"));
  }
  {
    RunResult r = dry(three, {"--include", "w0:0,2@w2:1,3", "--ssh-port", "2200", "--env",
                              "TSR_MN_X", "--env", "TSR_MN_Y=y"});
    INFO(describe(r));
    REQUIRE(r.status == 0);
    CHECK(contains(r.out, "# node 0: w0, ranks 0-1"));
    CHECK(contains(r.out, "# node 1: w2, ranks 2-3"));
    CHECK(!contains(r.out, "w1"));
    CHECK(contains(r.out, "CUDA_VISIBLE_DEVICES=0,2"));
    CHECK(contains(r.out, "CUDA_VISIBLE_DEVICES=1,3"));
    CHECK(contains(r.out, "ssh -T -o BatchMode=yes -p 2200 -F '/tmp/my ssh config' w0 "));
    CHECK(contains(r.out, "--nnodes 2 --node-rank 1 --master w0:29500 -n 2 --watch-stdin"));
    CHECK(contains(r.out, "NCCL_DEBUG=INFO"));
    CHECK(contains(r.out, "TSR_MN_Y=y"));
    CHECK(!contains(r.out, "TESSERA_SSH_OPTS"));
    CHECK(!contains(r.out, "--hostfile"));
  }
  {
    RunResult r = dry(three, {"--exclude", "w1", "--master", "10.0.0.9:1234"});
    INFO(describe(r));
    REQUIRE(r.status == 0);
    CHECK(contains(r.out, "# node 1: w2, ranks 4-7"));
    CHECK(contains(r.out, "--master 10.0.0.9:1234 -n 4"));
    CHECK(!contains(r.out, "CUDA_VISIBLE_DEVICES"));
  }
  {
    RunResult r = dry(three, {"--exclude", "w1:0"});
    INFO(describe(r));
    CHECK(r.status != 0);
    CHECK(contains(r.err, "every node needs the same number of slots"));
  }
  {
    RunResult r = dry(three, {"--num_nodes", "2", "--num_gpus", "1", "--master-port", "29600"});
    INFO(describe(r));
    REQUIRE(r.status == 0);
    CHECK(contains(r.out, "# node 1: w1, rank 1"));
    CHECK(contains(r.out, "--master w0:29600 -n 1"));
    CHECK(!contains(r.out, "w2"));
  }
  {
    RunResult r = dry(three, {"--include", "w3"});
    CHECK(contains(r.err, "--include: host 'w3' is not in the hostfile"));
    r = dry(three, {"--include", "w0:7"});
    CHECK(contains(r.err, "--include: host 'w0' has no slot 7"));
    r = dry(three, {"--include", "w0", "--num_gpus", "1"});
    CHECK(contains(r.err, "cannot be used with --include or --exclude"));
  }
  {
    // .tessera_env in the working directory; a bad line names file and line.
    write_text(scratch() / ".tessera_env", "A=1\nexport B='two words'\n");
    RunResult r = dry(three, {"--num_nodes", "1"});
    INFO(describe(r));
    REQUIRE(r.status == 0);
    CHECK(contains(r.out, "A=1"));
    CHECK(contains(r.out, "B=two words"));
    write_text(scratch() / ".tessera_env", "A=1\nnot a line\n");
    r = dry(three, {"--num_nodes", "1"});
    CHECK(contains(r.err, ".tessera_env:2: expected KEY=VALUE"));
    fs::remove(scratch() / ".tessera_env");
  }
}

TEST_CASE("the head launcher killed: the nodes' launchers and workers stop with their ssh sessions",
          "[multinode]") {
  if (std::string why = cannot_make_hosts(); !why.empty()) SKIP_TEST(why);
  Setup s = setup();
  TestHosts hosts;
  const fs::path hostfile = scratch() / "hostfile.txt";
  write_text(hostfile, "10.77.0.1 slots=2\n10.77.0.2 slots=2\n");
  RunOptions o;
  o.timeout_s = 120;
  o.env = {{"TESSERA_SSH_OPTS", hosts.ssh_opts()}};
  std::vector<std::string> argv = hosts.exec_in(0);
  argv.insert(argv.end(), {TESSERA_BINARY, "run", "--hostfile", hostfile.string(), "--ssh-port",
                           std::to_string(TestHosts::kSshPort), s.config.string(), "--set",
                           "run.steps=1000000", "--set", "run.log_every=10", "--grace", "5"});
  Process head = start_command(argv, o);
  const bool training = wait_for_text(head, "[rank 0] step", 90);
  INFO("head launcher output:\n" << head.out() << head.err());
  REQUIRE(training);
  REQUIRE(hosts.tessera_pids(1).size() == 3);  // node launcher and two workers
  // SIGKILL: no chance to stop anything itself. Its ssh sessions die with it
  // (PR_SET_PDEATHSIG); each node launcher sees its input end and stops its
  // workers as on SIGTERM (they save a checkpoint, SIGKILL after --grace 5).
  REQUIRE(::kill(head.pid, SIGKILL) == 0);
  const double killed_at = now_s();
  head.wait();
  bool all_gone = false;
  while (!all_gone && now_s() - killed_at < 20) {
    all_gone = hosts.tessera_pids(0).empty() && hosts.tessera_pids(1).empty();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double took = now_s() - killed_at;
  std::printf("  head launcher killed: nodes gone in %.2f s\n", took);
  CHECK(all_gone);
  CHECK(took <= 10.0);
}

}  // namespace itest_test_multinode
