#include "dist/store.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/error.hpp"

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

StoreServer::StoreServer(const std::string &host, uint16_t port) {
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
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    clients_.push_back(fd);
    threads_.emplace_back([this, fd] { serve(fd); });
  }
}

void StoreServer::serve(int fd) {
  for (;;) {
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
}

StoreClient::StoreClient(const std::string &host, uint16_t port, std::chrono::milliseconds timeout)
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
