// The rendezvous store's authentication (docs/security.md, "Rendezvous"):
// ranks with the job's secret are served; a client without it, with a wrong
// one, or a raw TCP stranger is refused (and counted) while the store keeps
// serving; a rank with a secret refuses a store that cannot prove it knows
// the same one. A flood of connections that never finish the handshake
// cannot keep ranks out, and a rank turned away says the store is flooded.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/store.hpp"
#include "launch/job_secret.hpp"
#include "util/error.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_store {

using namespace std::chrono_literals;
using tessera::StoreClient;
using tessera::StoreServer;

namespace {

const std::string kSecret = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

// Sends a set request without any handshake; true if the store answered it.
bool raw_set(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0);
  timeval tv{15, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string f(1, '\x01');
  for (const std::string &s : {std::string("k"), std::string("stranger")}) {
    uint32_t n = static_cast<uint32_t>(s.size());
    f.append(reinterpret_cast<const char *>(&n), 4).append(s);
  }
  f.append(8, '\0');
  f += f + f;  // 3 requests: more than the handshake's answer
  (void)!::send(fd, f.data(), f.size(), MSG_NOSIGNAL);
  char buf[64];
  size_t got = 0;
  for (ssize_t r; (r = ::recv(fd, buf + got, sizeof buf - got, 0)) > 0;)
    got += static_cast<size_t>(r);
  ::close(fd);
  // The hello is 37 bytes; a served set would add status 0 and a length.
  return got >= 37 + 5 && buf[37] == 0;
}

}  // namespace

TEST_CASE("the store serves ranks with the job secret and refuses the rest", "[security]") {
  StoreServer server("127.0.0.1", 0, kSecret);
  const uint16_t port = server.port();
  StoreClient good("127.0.0.1", port, 5s, kSecret);
  good.set("a", "1");
  CHECK(good.get("a", 1s) == "1");

  SECTION("a client without the secret is refused with a message saying so") {
    CHECK_THROWS_WITH(StoreClient("127.0.0.1", port, 2s, ""),
                      Catch::Contains("requires the job secret"));
  }
  SECTION("a client with a wrong secret is refused") {
    CHECK_THROWS_WITH(StoreClient("127.0.0.1", port, 2s, std::string(64, '7')),
                      Catch::Contains("refused this rank's job secret"));
  }
  SECTION("a raw TCP stranger's requests are never served") {
    CHECK(!raw_set(port));
    std::string v;
    CHECK(!server.peek("k", &v));
  }
  // Whatever was refused, the store still serves the job.
  CHECK(server.refused() <= 1);
  StoreClient again("127.0.0.1", port, 5s, kSecret);
  CHECK(again.get("a", 1s) == "1");
  CHECK(again.add("n", 2) == 2);
}

TEST_CASE("a rank with a secret refuses a store without one", "[security]") {
  StoreServer open_store("127.0.0.1", 0, "");
  CHECK_THROWS_WITH(StoreClient("127.0.0.1", open_store.port(), 2s, kSecret),
                    Catch::Contains("does not authenticate"));
  // Both without a secret: an open store (loopback under another launcher).
  StoreClient c("127.0.0.1", open_store.port(), 2s, "");
  c.set("x", "y");
  CHECK(c.get("x", 1s) == "y");
}

TEST_CASE("a store whose secret differs cannot pass as the job's", "[security]") {
  // The server proves itself too: a client refuses one with another secret
  // (which in turn refuses the client, so either message will do).
  StoreServer other("127.0.0.1", 0, std::string(64, 'e'));
  CHECK_THROWS_AS(StoreClient("127.0.0.1", other.port(), 2s, kSecret), tessera::Error);
}

TEST_CASE("job secrets: made fresh, and read only from private files", "[security]") {
  const std::string a = tessera::new_job_secret(), b = tessera::new_job_secret();
  CHECK(a.size() == 64);
  CHECK(a != b);
  CHECK_THROWS_WITH(tessera::check_job_secret("short", "test"), Catch::Contains("shorter than 16"));
  char tmpl[] = "/tmp/tessera_secret_XXXXXX";
  int fd = ::mkstemp(tmpl);
  REQUIRE(fd >= 0);
  const std::string text = kSecret + "\n";
  REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  ::close(fd);
  ::chmod(tmpl, 0600);
  CHECK(tessera::read_job_secret_file(tmpl) == kSecret);
  ::chmod(tmpl, 0644);
  CHECK_THROWS_WITH(tessera::read_job_secret_file(tmpl),
                    Catch::Contains("readable by nobody else"));
  ::unlink(tmpl);
}

namespace {

// A raw TCP connection to the store on loopback, -1 when refused.
int open_raw(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True once the peer has closed `fd` (reads and discards what it sent).
bool closed_by_peer(int fd) {
  char buf[256];
  for (;;) {
    const ssize_t r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r > 0) continue;
    return r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
  }
}

}  // namespace

TEST_CASE("a flood of idle and trickling connections does not keep ranks out", "[security]") {
  // More idle connections than the store will hold in their handshake from
  // one address (64), and some that send a byte every 100 ms: with the old
  // store (64 slots, a limit per recv) ranks were turned away at the door.
  StoreServer server("127.0.0.1", 0, kSecret);
  const uint16_t port = server.port();
  std::vector<int> idle, trickle;
  for (int i = 0; i < 150; ++i) idle.push_back(open_raw(port));
  for (int i = 0; i < 8; ++i) trickle.push_back(open_raw(port));
  std::atomic<bool> stop{false};
  std::thread trickler([&] {
    while (!stop) {
      for (int fd : trickle) (void)!::send(fd, "x", 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(100ms);
    }
  });
  // Every rank gets in, promptly, with the flood still there.
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<StoreClient>> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.push_back(std::make_unique<StoreClient>("127.0.0.1", port, 10s, kSecret));
  ranks[0]->set("a", "1");
  CHECK(ranks[2]->get("a", 1s) == "1");
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  // The oldest strangers made room; the store said it was flooded.
  CHECK(server.dropped() >= 150 - 64);
  size_t closed = 0;
  for (int fd : idle) closed += closed_by_peer(fd) ? 1 : 0;
  CHECK(closed >= 150 - 64);
  stop = true;
  trickler.join();
  for (int fd : idle) ::close(fd);
  for (int fd : trickle) ::close(fd);
}

TEST_CASE("a handshake has one deadline, however slowly the peer sends", "[security]") {
  // One byte every 150 ms: each recv returns long before any per-recv
  // limit, so only a deadline on the whole handshake ends it.
  tessera::StoreLimits limits;
  limits.handshake = 1s;
  StoreServer server("127.0.0.1", 0, kSecret, limits);
  const int fd = open_raw(server.port());
  REQUIRE(fd >= 0);
  const auto t0 = std::chrono::steady_clock::now();
  bool closed = false;
  for (int i = 0; i < 40 && !closed; ++i) {  // up to 6 s
    (void)!::send(fd, "x", 1, MSG_NOSIGNAL);
    std::this_thread::sleep_for(150ms);
    closed = closed_by_peer(fd);
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  ::close(fd);
  CHECK(closed);
  CHECK(took < 3s);
  CHECK(server.refused() == 1);
}

TEST_CASE("a rank turned away tries again, then says the store is flooded", "[security]") {
  // A store that drops every connection unanswered, as a flooded one drops
  // its oldest: the rank keeps trying until its timeout, then says why.
  int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0);
  REQUIRE(::listen(lfd, 16) == 0);
  socklen_t len = sizeof a;
  ::getsockname(lfd, reinterpret_cast<sockaddr *>(&a), &len);
  std::atomic<int> tries{0};
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    while (!stop) {
      pollfd p{lfd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int fd = ::accept(lfd, nullptr, nullptr);
      if (fd < 0) continue;
      ++tries;
      std::string hello = "TSR\x01\x01" + std::string(32, 'n');
      (void)!::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
      char answer[64];
      size_t got = 0;
      for (ssize_t r;
           got < sizeof answer && (r = ::recv(fd, answer + got, sizeof answer - got, 0)) > 0;)
        got += static_cast<size_t>(r);
      const char dropped = 2;
      (void)!::send(fd, &dropped, 1, MSG_NOSIGNAL);
      ::close(fd);
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(StoreClient("127.0.0.1", ntohs(a.sin_port), 1500ms, kSecret),
                    Catch::Contains("turned this rank away") && Catch::Contains("flooded"));
  CHECK(std::chrono::steady_clock::now() - t0 >= 1s);
  CHECK(tries >= 3);
  stop = true;
  busy.join();
  ::close(lfd);
}

// What a rank prints as it stops for another's failure (issue 53): a
// rank's own cause "rank R: why" reads "rank R failed: why"; the
// launcher's word for a death is printed as it is.
TEST_CASE("a rank stopping for another's failure says so in a sentence", "[store][messages]") {
  CHECK(tessera::peer_stop_message("rank 1: [zero] step: injected failure", 0) ==
        "tessera: rank 1 failed: [zero] step: injected failure; stopping rank 0");
  CHECK(tessera::peer_stop_message("rank 1 was killed by signal SIGKILL (9)", 0) ==
        "tessera: rank 1 was killed by signal SIGKILL (9); stopping rank 0");
  CHECK(tessera::peer_stop_message("rank 12 exited with status 3: odd", 2) ==
        "tessera: rank 12 exited with status 3: odd; stopping rank 2");
}

}  // namespace unit_test_store
