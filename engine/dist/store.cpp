#include "dist/store.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "util/error.hpp"
#include "util/hmac_sha256.hpp"

namespace tessera {

namespace {

// Wire format. Request: op u8, key_len u32, key, value_len u32, value,
// arg i64 (timeout in ms, or the amount to add). Reply: status u8,
// value_len u32, value. Lengths are bounded so a stray client cannot make
// the server allocate without limit.
enum : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kWait = 4, kCheck = 5 };
enum : uint8_t { kOk = 0, kTimeout = 1, kMissing = 2, kBad = 3 };
constexpr uint32_t kMaxKey = 4096;
constexpr uint32_t kMaxValue = 64u << 20;

// The handshake, before any request (docs/security.md, "Rendezvous"):
//   server -> client  "TSR" 0x01, mode u8 (0 open, 1 secret), server nonce (32)
//   client -> server  client nonce (32), HMAC-SHA256(secret, "tessera-store client" sn cn)
//   server -> client  status u8 (0 ok), HMAC-SHA256(secret, "tessera-store server" sn cn)
// Only mode 1 has the last two steps. Each side's MAC carries its own label,
// so neither can be replayed as the other's.
constexpr char kHelloMagic[4] = {'T', 'S', 'R', 1};
constexpr size_t kNonce = 32, kMac = 32;
constexpr uint8_t kModeOpen = 0, kModeSecret = 1;
// A peer gets this long to finish its handshake; at most this many may be
// in theirs at once (more are refused at once).
constexpr int kHandshakeTimeoutS = 10;
constexpr size_t kMaxPending = 64;

std::string proof(const std::string &secret, const char *label, const std::string &sn,
                  const std::string &cn) {
  const Sha256Digest d = hmac_sha256(secret, std::string(label) + sn + cn);
  return std::string(reinterpret_cast<const char *>(d.data()), d.size());
}

void set_recv_timeout(int fd, std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(t.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((t.count() % 1000) * 1000);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr *>(&ss), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = {};
  uint16_t port = 0;
  if (ss.ss_family == AF_INET6) {
    const auto *a = reinterpret_cast<const sockaddr_in6 *>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
    std::string out = "[";
    out.append(host).append("]:").append(std::to_string(port));
    return out;
  }
  const auto *a = reinterpret_cast<const sockaddr_in *>(&ss);
  inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
  port = ntohs(a->sin_port);
  std::string out = host;
  out.append(":").append(std::to_string(port));
  return out;
}

bool write_all(int fd, const void *data, size_t n) {
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

bool read_all(int fd, void *data, size_t n) {
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

bool read_str(int fd, std::string *s, uint32_t max) {
  uint32_t n;
  if (!read_all(fd, &n, 4) || n > max) return false;
  s->resize(n);
  return n == 0 || read_all(fd, s->data(), n);
}

bool write_str(int fd, const std::string &s) {
  uint32_t n = static_cast<uint32_t>(s.size());
  return write_all(fd, &n, 4) && (n == 0 || write_all(fd, s.data(), n));
}

// Resolves host:port to an IPv4/IPv6 socket address.
addrinfo *resolve(const std::string &host, uint16_t port, bool passive) {
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

}  // namespace

std::string job_secret_from_env() {
  const char *s = std::getenv("TESSERA_JOB_SECRET");
  return s ? s : "";
}

StoreServer::StoreServer(const std::string &host, uint16_t port, const std::string &secret)
    : secret_(secret) {
  addrinfo *res = resolve(host, port, true);
  std::string err;
  for (addrinfo *a = res; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 256) == 0) {
      listen_fd_ = fd;
      break;
    }
    err = std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(res);
  if (listen_fd_ < 0)
    throw Error(TSR_ERR_COMM, "rendezvous store: cannot listen on " + host + ":" +
                                  std::to_string(port) + ": " + err +
                                  " (is another job using the port? set --master or MASTER_PORT)");
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(listen_fd_, reinterpret_cast<sockaddr *>(&ss), &len);
  port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_port
                                         : reinterpret_cast<sockaddr_in *>(&ss)->sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
}

void StoreServer::note_refused(const std::string &peer, const std::string &why) {
  const size_t n = ++refused_;
  // Every refusal up to 20, then one in 1000: a flood must not flood the log.
  if (n <= 20 || n % 1000 == 0)
    std::fprintf(stderr, "tessera: rendezvous store: refused the connection from %s: %s%s\n",
                 peer.c_str(), why.c_str(),
                 n == 20 ? " (further refusals: every 1000th is logged)" : "");
}

bool StoreServer::handshake(int fd, const std::string &peer) {
  std::string sn = random_bytes(kNonce);
  std::string hello(kHelloMagic, sizeof kHelloMagic);
  hello.push_back(static_cast<char>(secret_.empty() ? kModeOpen : kModeSecret));
  hello += sn;
  if (!write_all(fd, hello.data(), hello.size())) {
    note_refused(peer, "it left before the handshake");
    return false;
  }
  if (secret_.empty()) return true;
  std::string answer(kNonce + kMac, '\0');
  if (!read_all(fd, answer.data(), answer.size())) {
    note_refused(peer, "no answer to the challenge (it closed, or sent none within " +
                           std::to_string(kHandshakeTimeoutS) +
                           " s: not a tessera rank, or one without the job secret)");
    return false;
  }
  const std::string cn = answer.substr(0, kNonce);
  if (!equal_constant_time(answer.substr(kNonce), proof(secret_, "tessera-store client", sn, cn))) {
    const uint8_t no = 1;
    (void)write_all(fd, &no, 1);
    note_refused(peer, "wrong answer to the challenge (not this job's TESSERA_JOB_SECRET)");
    return false;
  }
  std::string reply(1, '\0');
  reply += proof(secret_, "tessera-store server", sn, cn);
  return write_all(fd, reply.data(), reply.size());
}

StoreServer::~StoreServer() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    for (int fd : clients_) ::shutdown(fd, SHUT_RDWR);
  }
  cv_.notify_all();
  ::shutdown(listen_fd_, SHUT_RDWR);
  ::close(listen_fd_);
  if (acceptor_.joinable()) acceptor_.join();
  for (auto &t : threads_) t.join();
}

bool StoreServer::peek(const std::string &key, std::string *value) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  if (value) *value = it->second;
  return true;
}

void StoreServer::put(const std::string &key, const std::string &value) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
}

void StoreServer::accept_loop() {
  for (;;) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      return;  // closed: shutting down
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::vector<std::thread> done;
    std::string busy_peer;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stopping_) {
        ::close(fd);
        return;
      }
      // Threads of connections that ended: joined here, so that a stream of
      // short connections does not pile them up.
      for (auto it = threads_.begin(); it != threads_.end();) {
        if (std::find(finished_.begin(), finished_.end(), it->get_id()) != finished_.end()) {
          done.push_back(std::move(*it));
          it = threads_.erase(it);
        } else {
          ++it;
        }
      }
      finished_.clear();
      if (pending_ >= kMaxPending) {
        busy_peer = peer_name(fd);
        ::close(fd);
        fd = -1;
      } else {
        ++pending_;
        clients_.push_back(fd);
        threads_.emplace_back([this, fd] { serve(fd); });
      }
    }
    for (auto &t : done) t.join();
    if (fd < 0)
      note_refused(busy_peer,
                   std::to_string(kMaxPending) + " connections already in their handshake");
  }
}

void StoreServer::serve(int fd) {
  const std::string peer = peer_name(fd);
  set_recv_timeout(fd, std::chrono::seconds(kHandshakeTimeoutS));
  bool ok = false;
  try {
    ok = handshake(fd, peer);
  } catch (const std::exception &e) {
    note_refused(peer, e.what());
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    --pending_;
  }
  if (ok) set_recv_timeout(fd, std::chrono::milliseconds(0));
  for (; ok;) {
    uint8_t op;
    std::string key, value;
    int64_t arg = 0;
    if (!read_all(fd, &op, 1) || !read_str(fd, &key, kMaxKey) || !read_str(fd, &value, kMaxValue) ||
        !read_all(fd, &arg, 8))
      break;
    uint8_t status = kOk;
    std::string out;
    {
      std::unique_lock<std::mutex> lk(mu_);
      auto deadline =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<int64_t>(arg, 0));
      switch (op) {
        case kSet:
          data_[key] = value;
          cv_.notify_all();
          break;
        case kGet:
        case kWait: {
          bool ok =
              cv_.wait_until(lk, deadline, [&] { return stopping_ || data_.count(key) != 0; });
          if (!ok || !data_.count(key))
            status = kTimeout;
          else if (op == kGet)
            out = data_[key];
          break;
        }
        case kAdd: {
          int64_t cur = 0;
          auto it = data_.find(key);
          if (it != data_.end()) cur = std::strtoll(it->second.c_str(), nullptr, 10);
          cur += arg;
          data_[key] = std::to_string(cur);
          out = data_[key];
          cv_.notify_all();
          break;
        }
        case kCheck: {
          auto it = data_.find(key);
          if (it == data_.end())
            status = kMissing;
          else
            out = it->second;
          break;
        }
        default:
          status = kBad;
      }
    }
    if (!write_all(fd, &status, 1) || !write_str(fd, out)) break;
    if (status == kBad) break;
  }
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = clients_.begin(); it != clients_.end(); ++it)
    if (*it == fd) {
      clients_.erase(it);
      break;
    }
  ::close(fd);
  finished_.push_back(std::this_thread::get_id());
}

StoreClient::StoreClient(const std::string &host, uint16_t port, std::chrono::milliseconds timeout,
                         const std::string &secret)
    : endpoint_(host + ":" + std::to_string(port)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string err = "timed out";
  while (fd_ < 0) {
    addrinfo *res = resolve(host, port, false);
    for (addrinfo *a = res; a && fd_ < 0; a = a->ai_next) {
      int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        fd_ = fd;
      } else {
        err = std::strerror(errno);
        ::close(fd);
      }
    }
    freeaddrinfo(res);
    if (fd_ >= 0) break;
    if (std::chrono::steady_clock::now() > deadline)
      throw Error(TSR_ERR_COMM,
                  "cannot reach the rendezvous store at " + endpoint_ + ": " + err +
                      " (is MASTER_ADDR/MASTER_PORT right, and rank 0 or the launcher up?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  try {
    handshake(secret, timeout);
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

void StoreClient::handshake(const std::string &secret, std::chrono::milliseconds timeout) {
  set_recv_timeout(fd_, std::max<std::chrono::milliseconds>(timeout, std::chrono::seconds(5)));
  char hello[sizeof kHelloMagic + 1 + kNonce];
  if (!read_all(fd_, hello, sizeof hello))
    throw Error(TSR_ERR_COMM, "the rendezvous store at " + endpoint_ +
                                  " closed the connection or did not greet within the timeout "
                                  "(another job's store, or not a tessera store?)");
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
  } else if (mode == kModeSecret) {
    if (secret.empty())
      throw Error(TSR_ERR_COMM, "the rendezvous store at " + endpoint_ +
                                    " requires the job secret, and this rank has no "
                                    "TESSERA_JOB_SECRET (docs/security.md)");
    const std::string cn = random_bytes(kNonce);
    const std::string answer = cn + proof(secret, "tessera-store client", sn, cn);
    if (!write_all(fd_, answer.data(), answer.size()))
      throw Error(TSR_ERR_COMM, "lost the rendezvous store at " + endpoint_ + " in the handshake");
    char reply[1 + kMac];
    if (!read_all(fd_, reply, 1) || reply[0] != 0)
      throw Error(TSR_ERR_COMM, "the rendezvous store at " + endpoint_ +
                                    " refused this rank's job secret (TESSERA_JOB_SECRET differs "
                                    "from the launcher's?)");
    if (!read_all(fd_, reply + 1, kMac) ||
        !equal_constant_time(std::string(reply + 1, kMac),
                             proof(secret, "tessera-store server", sn, cn)))
      throw Error(TSR_ERR_COMM, "the rendezvous store at " + endpoint_ +
                                    " failed to prove it knows the job secret: not this job's "
                                    "store; refusing it");
  } else {
    throw Error(TSR_ERR_COMM, "the rendezvous store at " + endpoint_ +
                                  " speaks an unknown handshake mode " + std::to_string(mode));
  }
  set_recv_timeout(fd_, std::chrono::milliseconds(0));
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
