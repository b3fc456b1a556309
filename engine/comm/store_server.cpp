// The rendezvous store's server. One thread runs every handshake at once
// (non-blocking sockets under poll), so no connection waits behind
// another's, and each handshake has one deadline from accept to answer.
// A connection that has proved it knows the job secret gets its own
// thread for requests. What an unauthenticated peer can hold is bounded
// (StoreLimits) and never refuses a newcomer: the oldest unanswered
// connection gives way instead, so a flood of idle or trickling sockets
// cannot keep the job's ranks out (docs/security.md, "Rendezvous").
#include <fcntl.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm/store.hpp"
#include "comm/store_wire.hpp"
#include "util/crypto.hpp"
#include "util/error.hpp"

namespace tessera {

using namespace store_wire;

struct StoreServer::Pending {
  int fd = -1;
  std::string addr, peer, sn, got;  // address (no port), address:port, nonce, answer so far
  Clock::time_point since, deadline;
  bool done = false;
};

namespace {

void set_blocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
}

std::string seconds_text(std::chrono::milliseconds t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(t.count()) / 1000.0);
  return buf;
}

size_t pending_cap(size_t configured) {
  if (configured > 0) return configured;
  // Each pending connection is a descriptor: stay well inside the limit,
  // the process (launcher, rank 0) needs its own.
  rlimit rl{};
  size_t soft = 1024;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    soft = static_cast<size_t>(rl.rlim_cur);
  return std::clamp<size_t>(soft / 4, 64, 1024);
}

}  // namespace

StoreServer::StoreServer(const std::string &host, uint16_t port, const std::string &secret,
                         StoreLimits limits)
    : secret_(secret), limits_(limits) {
  limits_.pending = pending_cap(limits.pending);
  limits_.per_address = std::max<size_t>(1, std::min(limits_.per_address, limits_.pending));
  addrinfo *res = resolve(host, port, true);
  std::string err;
  for (addrinfo *a = res; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
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
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(listen_fd_);
    throw Error(TSR_ERR_COMM, std::string("rendezvous store: pipe: ") + std::strerror(errno));
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(listen_fd_, reinterpret_cast<sockaddr *>(&ss), &len);
  port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_port
                                         : reinterpret_cast<sockaddr_in *>(&ss)->sin_port);
  loop_ = std::thread([this] { handshake_loop(); });
}

StoreServer::~StoreServer() {
  stopping_ = true;
  const char x = 1;
  (void)!::write(wake_[1], &x, 1);
  if (loop_.joinable()) loop_.join();
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (int fd : clients_) ::shutdown(fd, SHUT_RDWR);
  }
  cv_.notify_all();
  for (auto &t : threads_) t.join();
  ::close(listen_fd_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void StoreServer::note_refused(const std::string &peer, const std::string &why) {
  const size_t n = ++refused_;
  // Every refusal up to 20, then one in 1000: a flood must not flood the log.
  if (n <= 20 || n % 1000 == 0)
    std::fprintf(stderr, "tessera: rendezvous store: refused the connection from %s: %s%s\n",
                 peer.c_str(), why.c_str(),
                 n == 20 ? " (further refusals: every 1000th is logged)" : "");
}

void StoreServer::handshake_loop() {
  std::vector<Pending> pending;
  Clock::time_point accept_again{};  // out of descriptors: accept pauses until then
  std::vector<pollfd> fds;
  while (!stopping_) {
    const auto now = Clock::now();
    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    const bool accepting = now >= accept_again;
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
    auto next = now + std::chrono::seconds(1);
    for (const auto &p : pending) {
      fds.push_back({p.fd, POLLIN, 0});
      next = std::min(next, p.deadline);
    }
    if (!accepting) next = std::min(next, accept_again);
    const auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(wait_ms, 0) + 1)) < 0 &&
        errno != EINTR)
      break;
    if (stopping_) break;
    // Answers first, then deadlines, then newcomers.
    for (size_t i = 0; i < pending.size(); ++i)
      if (fds[i + 2].revents != 0) pending[i].done = on_answer(pending[i]);
    const auto after = Clock::now();
    for (auto &p : pending) {
      if (p.done || after < p.deadline) continue;
      ::close(p.fd);
      p.done = true;
      note_refused(p.peer, "no answer to the challenge within " + seconds_text(limits_.handshake) +
                               " (it sent " + std::to_string(p.got.size()) + " of " +
                               std::to_string(kAnswer) +
                               " bytes: not a tessera rank, or one without the job secret)");
    }
    std::erase_if(pending, [](const Pending &p) { return p.done; });
    if (!(fds[1].revents & POLLIN)) continue;
    // Everything waiting, so that the kernel's queue never fills up behind
    // a burst; the bound keeps answers from waiting behind a long burst.
    for (int k = 0; k < 256; ++k) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        admit(fd, pending);
        continue;
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: the oldest stranger makes room, else wait.
        auto oldest =
            std::find_if(pending.begin(), pending.end(), [](const Pending &p) { return !p.done; });
        if (oldest != pending.end()) {
          drop(*oldest, pending);
        } else {
          accept_again = Clock::now() + std::chrono::milliseconds(100);
        }
      }
      break;
    }
    std::erase_if(pending, [](const Pending &p) { return p.done; });
  }
  for (auto &p : pending)
    if (!p.done) ::close(p.fd);
}

void StoreServer::admit(int fd, std::vector<Pending> &pending) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  Pending p;
  p.fd = fd;
  p.addr = peer_name(fd, false);
  p.peer = peer_name(fd);
  // Make room first: past its address's cap the newcomer's own oldest
  // gives way; past the total, the oldest of the address holding the most.
  auto live = [](const Pending &q) { return !q.done; };
  size_t mine = 0, total = 0;
  std::map<std::string, size_t> per;
  for (const auto &q : pending)
    if (live(q)) {
      ++total;
      ++per[q.addr];
      if (q.addr == p.addr) ++mine;
    }
  std::string victim;
  if (mine >= limits_.per_address) {
    victim = p.addr;
  } else if (total >= limits_.pending) {
    victim = std::max_element(per.begin(), per.end(), [](const auto &a, const auto &b) {
               return a.second < b.second;
             })->first;
  }
  if (!victim.empty()) {
    // `pending` is in arrival order: the first live one is the oldest.
    for (auto &q : pending)
      if (live(q) && q.addr == victim) {
        drop(q, pending);
        break;
      }
  }
  try {
    p.sn = random_bytes(kNonce);
  } catch (const std::exception &e) {
    ::close(fd);
    note_refused(p.peer, e.what());
    return;
  }
  std::string hello(kHelloMagic, sizeof kHelloMagic);
  hello.push_back(static_cast<char>(secret_.empty() ? kModeOpen : kModeSecret));
  hello += p.sn;
  // A fresh socket's send buffer takes the 37 bytes at once.
  if (::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
      static_cast<ssize_t>(hello.size())) {
    ::close(fd);
    note_refused(p.peer, "it left before the handshake");
    return;
  }
  if (secret_.empty()) {
    promote(fd);
    return;
  }
  p.since = Clock::now();
  p.deadline = p.since + limits_.handshake;
  pending.push_back(std::move(p));
}

bool StoreServer::on_answer(Pending &p) {
  char buf[kAnswer];
  const ssize_t r = ::recv(p.fd, buf, kAnswer - p.got.size(), MSG_DONTWAIT);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
  if (r <= 0) {
    ::close(p.fd);
    note_refused(p.peer, p.got.empty() ? "it closed the connection without answering the challenge"
                                       : "it closed the connection in the middle of its answer");
    return true;
  }
  p.got.append(buf, static_cast<size_t>(r));
  if (p.got.size() < kAnswer) return false;
  const std::string cn = p.got.substr(0, kNonce);
  if (!equal_constant_time(p.got.substr(kNonce),
                           proof(secret_, "tessera-store client", p.sn, cn))) {
    const uint8_t no = kWrongAnswer;
    (void)!::send(p.fd, &no, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    ::close(p.fd);
    note_refused(p.peer, "wrong answer to the challenge (not this job's TESSERA_JOB_SECRET)");
    return true;
  }
  std::string reply(1, static_cast<char>(kAccepted));
  reply += proof(secret_, "tessera-store server", p.sn, cn);
  if (::send(p.fd, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
      static_cast<ssize_t>(reply.size())) {
    ::close(p.fd);
    return true;
  }
  promote(p.fd);
  return true;
}

void StoreServer::drop(Pending &p, const std::vector<Pending> &pending) {
  // Status 2 tells a rank caught in the flood to try again.
  const uint8_t dropped = kDropped;
  (void)!::send(p.fd, &dropped, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  ::close(p.fd);
  p.done = true;
  const size_t n = ++dropped_;
  const auto now = Clock::now();
  // The first drop, then a summary at most every 10 s.
  if (n > 1 && now - flood_logged_ < std::chrono::seconds(10)) return;
  flood_logged_ = now;
  size_t from_addr = 0, total = 0;
  for (const auto &q : pending)
    if (!q.done) {
      ++total;
      if (q.addr == p.addr) ++from_addr;
    }
  std::fprintf(stderr,
               "tessera: rendezvous store (port %u) is flooded: %zu connection(s) dropped "
               "unanswered so far to make room; %zu are in their handshake now, %zu of them from "
               "%s (at most %zu per address, %zu in all). Something that is not a rank of this "
               "job keeps connections to the port open without finishing the handshake; the "
               "job's ranks still get through (they try again), but find it: ss -tnp "
               "'( sport = :%u )' on this host, or look at the host %s\n",
               static_cast<unsigned>(port_), n, total, from_addr, p.addr.c_str(),
               limits_.per_address, limits_.pending, static_cast<unsigned>(port_), p.addr.c_str());
}

void StoreServer::promote(int fd) {
  set_blocking(fd);
  std::vector<std::thread> done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    // Threads of connections that ended are joined here, so that a stream
    // of short connections does not pile them up.
    for (auto it = threads_.begin(); it != threads_.end();) {
      if (std::find(finished_.begin(), finished_.end(), it->get_id()) != finished_.end()) {
        done.push_back(std::move(*it));
        it = threads_.erase(it);
      } else {
        ++it;
      }
    }
    finished_.clear();
    clients_.push_back(fd);
    threads_.emplace_back([this, fd] { serve(fd); });
  }
  for (auto &t : done) t.join();
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
      auto deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(arg, 0));
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

}  // namespace tessera
