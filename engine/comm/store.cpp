// The rendezvous store's client; the server is store_server.cpp, what both
// speak is store_wire.hpp.
#include "comm/store.hpp"

#include <fcntl.h>
#include <netinet/tcp.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "comm/store_wire.hpp"
#include "util/crypto.hpp"
#include "util/error.hpp"

namespace tessera {

using namespace store_wire;

namespace {

// One connection attempt to one address, bounded by `deadline` (a store
// whose listen queue is full must not hold a rank in connect() for the
// kernel's two minutes of SYN retries). The socket comes back blocking.
int connect_by(const addrinfo *a, Clock::time_point deadline, std::string *err) {
  int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
  if (fd < 0) {
    *err = std::strerror(errno);
    return -1;
  }
  int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd pfd{fd, POLLOUT, 0};
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      rc = left > 0 ? ::poll(&pfd, 1, static_cast<int>(left)) : 0;
      if (rc < 0 && errno == EINTR) continue;
      break;
    }
    int so = 0;
    socklen_t len = sizeof so;
    if (rc > 0 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &len) == 0 && so == 0) {
      rc = 0;
    } else {
      errno = rc == 0 ? ETIMEDOUT : (so ? so : errno);
      rc = -1;
    }
  }
  if (rc != 0) {
    *err = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  const int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

std::string seconds_text(Clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s",
                std::chrono::duration_cast<std::chrono::duration<double>>(d).count());
  return buf;
}

}  // namespace

std::string job_secret_from_env() {
  const char *s = std::getenv("TESSERA_JOB_SECRET");
  return s ? s : "";
}

StoreClient::StoreClient(const std::string &host, uint16_t port, std::chrono::milliseconds timeout,
                         const std::string &secret)
    : endpoint_(host + ":" + std::to_string(port)) {
  const auto start = Clock::now(), deadline = start + timeout;
  // One attempt may take this long to connect and authenticate; a store
  // that is up answers in milliseconds, so a slower one is tried again.
  constexpr auto kAttempt = std::chrono::seconds(10);
  std::string err = "timed out", turned_away_why;
  int turned_away = 0;
  auto backoff = std::chrono::milliseconds(50);
  std::minstd_rand jitter(std::random_device{}());
  for (;;) {
    // The last attempt, at the deadline, still gets a moment to connect.
    const auto now0 = Clock::now();
    const auto attempt_end =
        std::max(std::min(deadline, now0 + kAttempt), now0 + std::chrono::milliseconds(200));
    addrinfo *res = resolve(host, port, false);
    for (addrinfo *a = res; a && fd_ < 0; a = a->ai_next) fd_ = connect_by(a, attempt_end, &err);
    freeaddrinfo(res);
    std::string retry_why;
    if (fd_ >= 0) {
      int one = 1;
      setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      try {
        retry_why = handshake(secret, attempt_end);
      } catch (...) {
        ::close(fd_);
        fd_ = -1;
        throw;
      }
      if (retry_why.empty()) return;  // authenticated both ways
      ::close(fd_);
      fd_ = -1;
      ++turned_away;
      turned_away_why = retry_why;
    }
    const auto now = Clock::now();
    // A store that connects but turns the rank away is busy (flooded), one
    // that does not connect is not up yet: both are tried until the timeout.
    const bool busy = !retry_why.empty();
    const auto pause = busy ? backoff : std::chrono::milliseconds(100);
    if (now >= deadline) {
      if (turned_away > 0)
        throw Error(
            TSR_ERR_COMM,
            "the rendezvous store at " + endpoint_ + " turned this rank away " +
                std::to_string(turned_away) + " time(s) in " + seconds_text(now - start) +
                " (last: " + turned_away_why +
                "): the store is flooded with connections that never finish its "
                "handshake, or what listens there is not a tessera store. A process "
                "that is not a rank of this job keeps connecting to port " +
                std::to_string(port) +
                " (the store's log names its address; ss -tnp '( dport = :" + std::to_string(port) +
                " )' lists the connections): stop it, or give "
                "the ranks longer (comm.timeout_s)");
      throw Error(TSR_ERR_COMM,
                  "cannot reach the rendezvous store at " + endpoint_ + ": " + err +
                      " (is MASTER_ADDR/MASTER_PORT right, and rank 0 or the launcher up?)");
    }
    // Jittered, so that ranks turned away together do not come back
    // together; never past the deadline, where one last attempt is made.
    auto wait = pause;
    if (busy) {
      std::uniform_int_distribution<int> extra(0, static_cast<int>(backoff.count() / 2));
      wait += std::chrono::milliseconds(extra(jitter));
      backoff = std::min<std::chrono::milliseconds>(backoff * 2, std::chrono::seconds(2));
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(wait, deadline - now));
  }
}

std::string StoreClient::handshake(const std::string &secret, Clock::time_point deadline) {
  char hello[kHello];
  if (!read_all_by(fd_, hello, sizeof hello, deadline))
    return "it closed the connection or did not greet in time";
  if (std::memcmp(hello, kHelloMagic, sizeof kHelloMagic) != 0)
    throw Error(TSR_ERR_COMM, endpoint_ +
                                  " is not a tessera rendezvous store (is MASTER_ADDR/MASTER_PORT "
                                  "another service's?)");
  const auto mode = static_cast<uint8_t>(hello[sizeof kHelloMagic]);
  const std::string sn(hello + sizeof kHelloMagic + 1, kNonce);
  if (mode == kModeOpen) {
    if (!secret.empty())
      throw Error(TSR_ERR_COMM,
                  "the rendezvous store at " + endpoint_ +
                      " does not authenticate, but this rank has TESSERA_JOB_SECRET: refusing to "
                      "trust it (every rank of a job needs the same secret, or none)");
    return "";
  }
  if (mode != kModeSecret)
    throw Error(TSR_ERR_COMM, "the rendezvous store at " + endpoint_ +
                                  " speaks an unknown handshake mode " + std::to_string(mode));
  if (secret.empty())
    throw Error(TSR_ERR_COMM, "the rendezvous store at " + endpoint_ +
                                  " requires the job secret, and this rank has no "
                                  "TESSERA_JOB_SECRET (docs/security.md)");
  const std::string cn = random_bytes(kNonce);
  const std::string answer = cn + proof(secret, "tessera-store client", sn, cn);
  // The store may have dropped this connection already (a flood): a failed
  // write or read from here on is worth another try.
  if (!write_all(fd_, answer.data(), answer.size()))
    return "it closed the connection during the handshake";
  char reply[1 + kMac];
  if (!read_all_by(fd_, reply, 1, deadline)) return "it closed the connection during the handshake";
  if (static_cast<uint8_t>(reply[0]) == kDropped)
    return "it dropped the connection unanswered to make room for newer ones";
  if (static_cast<uint8_t>(reply[0]) != kAccepted)
    throw Error(TSR_ERR_COMM, "the rendezvous store at " + endpoint_ +
                                  " refused this rank's job secret (TESSERA_JOB_SECRET differs "
                                  "from the launcher's?)");
  if (!read_all_by(fd_, reply + 1, kMac, deadline) ||
      !equal_constant_time(std::string(reply + 1, kMac),
                           proof(secret, "tessera-store server", sn, cn)))
    throw Error(TSR_ERR_COMM, "the rendezvous store at " + endpoint_ +
                                  " failed to prove it knows the job secret: not this job's "
                                  "store; refusing it");
  return "";
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

StoreClient::Reply StoreClient::request(uint8_t op, const std::string &key,
                                        const std::string &value, int64_t arg) {
  std::lock_guard<std::mutex> lk(mu_);
  Reply r{kBad, {}};
  if (!write_all(fd_, &op, 1) || !write_str(fd_, key) || !write_str(fd_, value) ||
      !write_all(fd_, &arg, 8) || !read_all(fd_, &r.status, 1) ||
      !read_str(fd_, &r.value, kMaxValue))
    throw Error(TSR_ERR_COMM, "lost the rendezvous store at " + endpoint_ +
                                  " (the launcher or rank 0 has gone away)");
  return r;
}

void StoreClient::set(const std::string &key, const std::string &value) {
  request(kSet, key, value, 0);
}

std::string StoreClient::get(const std::string &key, std::chrono::milliseconds timeout) {
  Reply r = request(kGet, key, "", timeout.count());
  if (r.status != kOk)
    throw Error(TSR_ERR_COMM, "rendezvous store: key '" + key + "' did not appear within " +
                                  std::to_string(timeout.count() / 1000.0) + " s");
  return r.value;
}

bool StoreClient::wait(const std::vector<std::string> &keys, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const auto &k : keys) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (request(kWait, k, "", std::max<int64_t>(left.count(), 0)).status != kOk) return false;
  }
  return true;
}

int64_t StoreClient::add(const std::string &key, int64_t delta) {
  return std::strtoll(request(kAdd, key, "", delta).value.c_str(), nullptr, 10);
}

bool StoreClient::check(const std::string &key, std::string *value) {
  Reply r = request(kCheck, key, "", 0);
  if (r.status != kOk) return false;
  if (value) *value = r.value;
  return true;
}

}  // namespace tessera
