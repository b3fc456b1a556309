// What the rendezvous store's server (store_server.cpp) and client
// (store.cpp) share: the wire format, the handshake's constants and proofs,
// and socket I/O bounded by a deadline. Internal to engine/dist.
#pragma once

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <string>

#include "util/crypto.hpp"
#include "util/error.hpp"

namespace tessera::store_wire {

using Clock = std::chrono::steady_clock;

// Request: op u8, key_len u32, key, value_len u32, value, arg i64 (timeout
// in ms, or the amount to add). Reply: status u8, value_len u32, value.
// Lengths are bounded so a stray client cannot make the server allocate
// without limit.
enum : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kWait = 4, kCheck = 5 };
enum : uint8_t { kOk = 0, kTimeout = 1, kMissing = 2, kBad = 3 };
constexpr uint32_t kMaxKey = 4096;
constexpr uint32_t kMaxValue = 64u << 20;

// The handshake, before any request (docs/security.md, "Rendezvous"):
//   server -> client  "TSR" 0x01, mode u8 (0 open, 1 secret), server nonce (32)
//   client -> server  client nonce (32), HMAC-SHA256(secret, "tessera-store client" sn cn)
//   server -> client  status u8, HMAC-SHA256(secret, "tessera-store server" sn cn)
// Only mode 1 has the last two steps. Each side's MAC carries its own label,
// so neither can be replayed as the other's. Status: 0 accepted (the MAC
// follows), 1 wrong answer, 2 dropped unanswered to make room for newer
// connections (the store is flooded: the client tries again).
constexpr char kHelloMagic[4] = {'T', 'S', 'R', 1};
constexpr size_t kNonce = 32, kMac = 32;
constexpr size_t kHello = sizeof kHelloMagic + 1 + kNonce;
constexpr size_t kAnswer = kNonce + kMac;
constexpr uint8_t kModeOpen = 0, kModeSecret = 1;
constexpr uint8_t kAccepted = 0, kWrongAnswer = 1, kDropped = 2;

inline std::string proof(const std::string &secret, const char *label, const std::string &sn,
                         const std::string &cn) {
  const Sha256Digest d = hmac_sha256(secret, std::string(label) + sn + cn);
  return std::string(reinterpret_cast<const char *>(d.data()), d.size());
}

inline bool write_all(int fd, const void *data, size_t n) {
  const char *p = static_cast<const char *>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Blocking reads: for authenticated connections, whose peers are the job.
inline bool read_all(int fd, void *data, size_t n) {
  char *p = static_cast<char *>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// Reads exactly n bytes before `deadline`, however the peer spaces them
// out: the limit is on the whole read, not on each recv (a peer sending one
// byte every few seconds cannot stretch it). False on EOF, error or time up.
inline bool read_all_by(int fd, void *data, size_t n, Clock::time_point deadline) {
  char *p = static_cast<char *>(data);
  while (n > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    const int rc = ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (rc < 0 && errno != EINTR) return false;
    if (rc <= 0) continue;
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

inline bool read_str(int fd, std::string *s, uint32_t max) {
  uint32_t n;
  if (!read_all(fd, &n, 4) || n > max) return false;
  s->resize(n);
  return n == 0 || read_all(fd, s->data(), n);
}

inline bool write_str(int fd, const std::string &s) {
  uint32_t n = static_cast<uint32_t>(s.size());
  return write_all(fd, &n, 4) && (n == 0 || write_all(fd, s.data(), n));
}

// The peer's address, without the port when `with_port` is false (the key
// of the per-address cap), or "?" when it cannot be had.
inline std::string peer_name(int fd, bool with_port = true) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr *>(&ss), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET6) {
    const auto *a = reinterpret_cast<const sockaddr_in6 *>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    if (!with_port) return host;
    // Appended piecewise: GCC 12's -Wrestrict misreads "[" + std::string.
    std::string out = "[";
    out.append(host).append("]:").append(std::to_string(ntohs(a->sin6_port)));
    return out;
  }
  const auto *a = reinterpret_cast<const sockaddr_in *>(&ss);
  inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
  if (!with_port) return host;
  std::string out = host;
  out.append(":").append(std::to_string(ntohs(a->sin_port)));
  return out;
}

// Resolves host:port to IPv4/IPv6 socket addresses (freeaddrinfo them).
inline addrinfo *resolve(const std::string &host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo *res = nullptr;
  std::string p = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), p.c_str(), &hints, &res);
  if (rc != 0)
    throw Error(TSR_ERR_COMM,
                "rendezvous store: cannot resolve '" + host + "': " + gai_strerror(rc));
  return res;
}

}  // namespace tessera::store_wire
