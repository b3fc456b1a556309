// The rendezvous store of a running job refuses strangers (docs/security.md,
// "Rendezvous"): a raw TCP client that tries to set and get keys without the
// job secret, and one that answers the challenge with a wrong secret, are
// refused and logged, and the job finishes with the same losses as an
// undisturbed run. The secret never appears in the job's output. A flood of
// connections that never finish the handshake (idle, or trickling a byte a
// second) held against the store neither stops a job from starting nor a
// --max-restarts restart from rejoining (issue 23).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "util/crypto.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace itest_test_security {

using namespace tessera::itest;

namespace {

int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{15, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Reads exactly n bytes; false on EOF, error or timeout.
bool read_n(int fd, void *buf, size_t n) {
  auto *p = static_cast<char *>(buf);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

void put_str(std::string &frame, const std::string &s) {
  uint32_t n = static_cast<uint32_t>(s.size());
  frame.append(reinterpret_cast<const char *>(&n), 4).append(s);
}

// A store request as a rank sends it: op, key, value, arg.
std::string request(uint8_t op, const std::string &key, const std::string &value) {
  std::string f(1, static_cast<char>(op));
  put_str(f, key);
  put_str(f, value);
  int64_t arg = 0;
  f.append(reinterpret_cast<const char *>(&arg), 8);
  return f;
}

// What a stranger got out of one connection.
enum class Outcome { kNoStore, kRefused, kServed };

// Ignores the challenge and sends requests straight away: a set of the
// abort key (which would stop the job) and a get.
Outcome raw_client(int port) {
  int fd = connect_to(port);
  if (fd < 0) return Outcome::kNoStore;
  char hello[37];
  if (!read_n(fd, hello, sizeof hello)) {
    ::close(fd);
    return Outcome::kRefused;
  }
  std::string frames = request(1, "tessera/a0/abort", "rank 0: a stranger stops the job") +
                       request(3, "tessera/a0/abort/count", "") +
                       request(2, "tessera/a0/abort", "");
  (void)!::send(fd, frames.data(), frames.size(), MSG_NOSIGNAL);
  // A served set answers status 0 and an empty value (5 bytes).
  char reply[5];
  const bool served = read_n(fd, reply, sizeof reply) && reply[0] == 0;
  ::close(fd);
  return served ? Outcome::kServed : Outcome::kRefused;
}

// Answers the challenge as a rank would, with a wrong secret.
Outcome wrong_secret_client(int port) {
  int fd = connect_to(port);
  if (fd < 0) return Outcome::kNoStore;
  char hello[37];
  if (!read_n(fd, hello, sizeof hello)) {
    ::close(fd);
    return Outcome::kRefused;
  }
  const std::string sn(hello + 5, 32), cn(32, 'c');
  const auto mac =
      tessera::hmac_sha256("0123456789abcdef0123456789abcdef", "tessera-store client" + sn + cn);
  std::string answer = cn + std::string(reinterpret_cast<const char *>(mac.data()), mac.size());
  answer += request(1, "tessera/a0/abort", "rank 0: a stranger stops the job");
  (void)!::send(fd, answer.data(), answer.size(), MSG_NOSIGNAL);
  char status = 1;
  const bool ok = read_n(fd, &status, 1) && status == 0;
  ::close(fd);
  return ok ? Outcome::kServed : Outcome::kRefused;
}

// Holds `idle` connections that send nothing and `trickle` that send a
// byte a second to the store at `port`, from before it listens until
// stopped: whatever the store closes is opened again at once. The old
// store gave 64 slots and a 10 s limit per recv, so this kept every rank
// out.
class Flood {
 public:
  Flood(int port, int idle, int trickle) : port_(port) {
    for (int i = 0; i < idle + trickle; ++i) conns_.push_back({-1, i >= idle, {}});
    thread_ = std::thread([this] { loop(); });
  }
  ~Flood() {
    stop_ = true;
    thread_.join();
    for (auto &c : conns_)
      if (c.fd >= 0) ::close(c.fd);
  }
  int most_held() const { return most_held_; }
  int dropped() const { return dropped_; }

 private:
  struct Conn {
    int fd;
    bool trickle;
    std::chrono::steady_clock::time_point sent;
  };
  void loop() {
    while (!stop_) {
      const auto now = std::chrono::steady_clock::now();
      int held = 0;
      for (auto &c : conns_) {
        if (c.fd < 0) {
          c.fd = connect_to(port_);
          if (c.fd < 0) continue;  // not listening yet
          ::fcntl(c.fd, F_SETFL, ::fcntl(c.fd, F_GETFL) | O_NONBLOCK);
          c.sent = now;
        }
        char buf[256];
        const ssize_t r = ::recv(c.fd, buf, sizeof buf, 0);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
          ::close(c.fd);
          c.fd = -1;
          ++dropped_;
          continue;
        }
        if (c.trickle && now - c.sent >= std::chrono::seconds(1)) {
          (void)!::send(c.fd, "x", 1, MSG_NOSIGNAL);
          c.sent = now;
        }
        ++held;
      }
      most_held_ = std::max(most_held_.load(), held);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  int port_;
  std::vector<Conn> conns_;
  std::atomic<bool> stop_{false};
  std::atomic<int> most_held_{0}, dropped_{0};
  std::thread thread_;
};

}  // namespace

TEST_CASE("a flooded store: a 3-rank job starts, and restarts after a failure", "[security]") {
  Setup s = setup("\n[checkpoint]\nevery = 4\n");
  const int port = free_port();
  RunOptions o;
  o.timeout_s = 150;
  o.env = {{"MASTER_PORT", std::to_string(port)}, {"TESSERA_TEST_CRASH", "rank=1,step=6"}};
  Flood flood(port, 72, 16);
  RunResult r = run_cli({"run", "-n", "3", "--max-restarts", "1", s.config.string(), "--set",
                         "run.steps=12", "--set", "checkpoint.resume=\"auto\""},
                        o);
  INFO(describe(r));
  // Both attempts got every rank in: the first ran to the crash at step 6,
  // the restart from step 4 to the end.
  REQUIRE(r.status == 0);
  CHECK(contains(r.err, "restarting every worker from the latest checkpoint (restart 1 of 1)"));
  CHECK(contains(r.out, "at step 4"));
  // The flood was there all along, and the store said so.
  CHECK(flood.most_held() >= 64);
  CHECK(flood.dropped() > 0);
  CHECK(contains(r.err, "rendezvous store (port " + std::to_string(port) + ") is flooded"));
}

TEST_CASE("strangers are refused by a running job's rendezvous store", "[security]") {
  Setup s = setup();
  const fs::path ref = scratch() / "undisturbed", attacked = scratch() / "attacked";
  const std::string steps = "run.steps=12";
  RunOptions o;
  o.timeout_s = 110;
  RunResult r0 = run_cli({"run", "-n", "2", s.config.string(), "--set", steps, "--set",
                          "run.dir=\"" + ref.string() + "\""},
                         o);
  INFO(describe(r0));
  REQUIRE(r0.status == 0);

  // The launcher serves its store on MASTER_PORT when it is set.
  const int port = free_port();
  RunOptions ao = o;
  ao.env = {{"MASTER_PORT", std::to_string(port)}};
  Process job = start_cli({"run", "-n", "2", s.config.string(), "--set", steps, "--set",
                           "run.dir=\"" + attacked.string() + "\""},
                          ao);
  std::atomic<bool> stop{false};
  std::atomic<int> refused{0}, served{0};
  std::string secret;
  std::thread stranger([&] {
    for (int i = 0; !stop; ++i) {
      const Outcome out = i % 2 == 0 ? raw_client(port) : wrong_secret_client(port);
      if (out == Outcome::kRefused) ++refused;
      if (out == Outcome::kServed) ++served;
      std::this_thread::sleep_for(std::chrono::milliseconds(out == Outcome::kNoStore ? 20 : 100));
    }
  });
  // The workers' secret, from their environment, while they run.
  while (!job.poll() && secret.empty()) {
    for (int pid : child_pids(job.pid))
      if (secret.empty()) secret = process_env(pid, "TESSERA_JOB_SECRET");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  RunResult r = job.wait();
  stop = true;
  stranger.join();
  INFO(describe(r));
  REQUIRE(r.status == 0);
  CHECK(served == 0);
  CHECK(refused >= 2);
  CHECK(contains(r.err, "refused the connection from 127.0.0.1"));
  CHECK(contains(r.err, "wrong answer to the challenge"));
  // The job never saw the stranger's abort key: same losses, step by step.
  const auto a = train_losses(read_jsonl(ref / "metrics.jsonl"));
  const auto b = train_losses(read_jsonl(attacked / "metrics.jsonl"));
  REQUIRE(!a.empty());
  CHECK(a == b);
  // The secret: 64 hex digits, never printed.
  REQUIRE(secret.size() == 64);
  CHECK(!contains(r.all(), secret));
}

}  // namespace itest_test_security
