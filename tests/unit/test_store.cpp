// The rendezvous store's authentication (docs/security.md, "Rendezvous"):
// ranks with the job's secret are served; a client without it, with a wrong
// one, or a raw TCP stranger is refused (and counted) while the store keeps
// serving; a rank with a secret refuses a store that cannot prove it knows
// the same one.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include "dist/store.hpp"
#include "launch/job_secret.hpp"
#include "util/error.hpp"

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
