#include "comm/dist_context.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "util/error.hpp"

#ifdef TESSERA_HAVE_CUDA
#include "backend/cuda/device.hpp"
#include "comm/cuda_comm.hpp"
#include "comm/nccl_comm.hpp"
#endif

namespace tessera {

std::string local_address_toward(const std::string &host, uint16_t port) {
  // The address of the interface that routes to the master: connecting a
  // UDP socket sends nothing but makes the kernel pick the route. Gloo binds
  // there, rather than to whatever the hostname resolves to (127.0.1.1 on
  // Debian, unreachable from other hosts).
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    return "127.0.0.1";
  std::string out = "127.0.0.1";
  int fd = ::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    char buf[INET6_ADDRSTRLEN] = {};
    if (::getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len) == 0) {
      const void *a =
          ss.ss_family == AF_INET6
              ? static_cast<const void *>(&reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_addr)
              : static_cast<const void *>(&reinterpret_cast<sockaddr_in *>(&ss)->sin_addr);
      if (inet_ntop(ss.ss_family, a, buf, sizeof buf)) out = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  freeaddrinfo(res);
  return out;
}

namespace {

std::string numeric_host(const sockaddr *sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  const void *a =
      sa->sa_family == AF_INET6
          ? static_cast<const void *>(&reinterpret_cast<const sockaddr_in6 *>(sa)->sin6_addr)
          : static_cast<const void *>(&reinterpret_cast<const sockaddr_in *>(sa)->sin_addr);
  return inet_ntop(sa->sa_family, a, buf, sizeof buf) ? buf : "";
}

bool is_loopback(const sockaddr *sa) {
  if (sa->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in *>(sa)->sin_addr.s_addr) >> 24) == 127;
  if (sa->sa_family == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6 *>(sa)->sin6_addr);
  return false;
}

// True when a socket can bind to the address: it belongs to this host.
bool is_local(const sockaddr *sa, socklen_t len) {
  int fd = ::socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_storage ss{};
  std::memcpy(&ss, sa, len);
  // Port 0: any free one; only the address matters.
  if (ss.ss_family == AF_INET) reinterpret_cast<sockaddr_in *>(&ss)->sin_port = 0;
  if (ss.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_port = 0;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr *>(&ss), len) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

std::string interface_address(const std::string &iface) {
  ifaddrs *list = nullptr;
  if (::getifaddrs(&list) != 0)
    throw Error(TSR_ERR_COMM,
                std::string("cannot list network interfaces: ") + std::strerror(errno));
  std::string v4, v6, names;
  for (ifaddrs *i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6))
      continue;
    const std::string name = i->ifa_name ? i->ifa_name : "";
    if (name != iface) {
      if ((" " + names + ",").find(" " + name + ",") == std::string::npos)
        names += (names.empty() ? "" : ", ") + name;
      continue;
    }
    if (i->ifa_addr->sa_family == AF_INET && v4.empty()) v4 = numeric_host(i->ifa_addr);
    if (i->ifa_addr->sa_family == AF_INET6 && v6.empty() &&
        !IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6 *>(i->ifa_addr)->sin6_addr))
      v6 = numeric_host(i->ifa_addr);
  }
  ::freeifaddrs(list);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  throw Error(TSR_ERR_CONFIG, "network interface '" + iface +
                                  "' (comm.interface or GLOO_SOCKET_IFNAME) has no address on "
                                  "this host; interfaces with one: " +
                                  (names.empty() ? "none" : names));
}

std::string store_listen_address(const std::string &master, const std::string &iface,
                                 std::string *note) {
  if (!iface.empty()) return interface_address(iface);
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(master.c_str(), nullptr, &hints, &res) != 0 || !res) {
    if (note) *note = "'" + master + "' does not resolve here; serving on every interface";
    return "";
  }
  const bool literal_loopback = master == "localhost" || master == "::1" ||
                                (is_loopback(res->ai_addr) && numeric_host(res->ai_addr) == master);
  std::string out;
  bool all_loopback = true;
  for (addrinfo *a = res; a; a = a->ai_next) {
    all_loopback &= is_loopback(a->ai_addr);
    if (out.empty() && !is_loopback(a->ai_addr) && is_local(a->ai_addr, a->ai_addrlen))
      out = numeric_host(a->ai_addr);
  }
  if (literal_loopback) out = numeric_host(res->ai_addr);
  freeaddrinfo(res);
  if (out.empty() && note)
    *note = all_loopback
                ? "'" + master +
                      "' resolves to a loopback address on this host; serving on every "
                      "interface (set comm.interface to pick one)"
                : "'" + master + "' is not an address of this host; serving on every interface";
  return out;
}

DistOptions dist_options_from_env(uint32_t rank, uint32_t world, int timeout_s,
                                  const std::string &iface) {
  DistOptions o;
  o.rank = rank;
  o.world_size = world;
  if (const char *a = std::getenv("MASTER_ADDR")) o.master_addr = a;
  if (const char *p = std::getenv("MASTER_PORT")) {
    long v = std::strtol(p, nullptr, 10);
    if (v <= 0 || v > 65535)
      throw Error(TSR_ERR_CONFIG, std::string("MASTER_PORT='") + p + "' is not a port");
    o.master_port = static_cast<uint16_t>(v);
  }
  const char *launched = std::getenv("TESSERA_LAUNCHED");
  o.serve_store = rank == 0 && !(launched && std::string(launched) == "1");
  if (o.serve_store || !(launched && std::string(launched) == "1")) {
    // Under another launcher, MASTER_PORT may be taken by that launcher's
    // own store (torchrun's agent listens there): ours uses the next port,
    // or TESSERA_STORE_PORT when set.
    if (const char *sp = std::getenv("TESSERA_STORE_PORT")) {
      long v = std::strtol(sp, nullptr, 10);
      if (v <= 0 || v > 65535)
        throw Error(TSR_ERR_CONFIG, std::string("TESSERA_STORE_PORT='") + sp + "' is not a port");
      o.master_port = static_cast<uint16_t>(v);
    } else {
      o.master_port = static_cast<uint16_t>(o.master_port + 1);
    }
  }
  o.timeout_s = timeout_s;
  // Keys of each attempt stay apart when the launcher restarts the job.
  if (const char *a = std::getenv("TESSERA_ATTEMPT")) o.prefix = std::string("tessera/a") + a;
  o.interface = iface;
  return o;
}

void check_open_store(const std::string &listen_at) {
  // Under another launcher (torchrun, mpirun, Slurm) nobody made a job
  // secret: rank 0's store may go without one only on loopback, where only
  // this host can reach it (docs/security.md).
  const std::string secret = job_secret_from_env();
  if (!secret.empty()) {
    if (secret.size() < 16)
      throw Error(TSR_ERR_CONFIG,
                  "TESSERA_JOB_SECRET is shorter than 16 characters; use e.g. "
                  "'head -c 32 /dev/urandom | od -An -tx1 | tr -d \" \\n\"'");
    return;
  }
  const bool loopback =
      listen_at.rfind("127.", 0) == 0 || listen_at == "::1" || listen_at == "localhost";
  if (loopback) return;
  const char *insecure = std::getenv("TESSERA_INSECURE_STORE");
  if (insecure && std::string(insecure) == "1") {
    std::fprintf(stderr,
                 "tessera: rendezvous store: serving on %s without a job secret "
                 "(TESSERA_INSECURE_STORE=1): anyone who reaches the port can join or stop the "
                 "job\n",
                 listen_at.empty() ? "every interface" : listen_at.c_str());
    return;
  }
  throw Error(TSR_ERR_CONFIG,
              "rank 0 would serve the rendezvous store on " +
                  (listen_at.empty() ? std::string("every interface") : listen_at) +
                  " without a job secret: set TESSERA_JOB_SECRET to the same random value on every "
                  "rank (e.g. export TESSERA_JOB_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | "
                  "tr -d ' \\n') before torchrun/mpirun/srun), or TESSERA_INSECURE_STORE=1 on a "
                  "trusted network (docs/security.md)");
}

namespace {

std::string heartbeat_key(const std::string &prefix, uint32_t rank) {
  return prefix + "/heartbeat/" + std::to_string(rank);
}

// What a rank posts as its heartbeat once it has left the job: a peer that
// finished is not a peer that froze.
constexpr const char *kLeft = "left";

}  // namespace

DistContext::DistContext(const DistOptions &opt) : opt_(opt) {
  auto timeout = std::chrono::seconds(opt.timeout_s);
#ifdef TESSERA_HAVE_CUDA
  // NCCL picks its own interface: the one chosen for Gloo unless the user
  // named another.
  if (!opt.interface.empty()) ::setenv("NCCL_SOCKET_IFNAME", opt.interface.c_str(), 0);
#endif
  if (opt.serve_store) {
    // Rank 0 under another launcher: serve where the ranks will connect.
    std::string note;
    const std::string at = store_listen_address(opt.master_addr, opt.interface, &note);
    if (!note.empty()) std::fprintf(stderr, "tessera: rendezvous store: %s\n", note.c_str());
    check_open_store(at);
    server_ = std::make_unique<StoreServer>(at, opt.master_port);
  }
  client_ = std::make_unique<StoreClient>(opt.master_addr, opt.master_port, timeout);
  watch_client_ = std::make_unique<StoreClient>(opt.master_addr, opt.master_port, timeout);
  watcher_ = std::thread([this] { watch(); });
  try {
    gloo_ = std::make_unique<GlooComm>(*client_, opt.rank, opt.world_size, timeout, opt.interface,
                                       local_address_toward(opt.master_addr, opt.master_port),
                                       opt.prefix, opt.shm);
    if (opt.cuda) {
#ifdef TESSERA_HAVE_CUDA
      nccl_ = std::make_unique<NcclComm>(*client_, opt.rank, opt.world_size, timeout, opt.prefix);
      cuda_comm_ = std::make_unique<CudaComm>(gloo_.get(), nccl_.get());
#else
      throw Error(TSR_ERR_UNSUPPORTED, "a CUDA run needs a tessera built with CUDA and NCCL");
#endif
    }
  } catch (...) {
    stopping_ = true;
    watcher_.join();
    throw;
  }
}

std::string DistContext::transport() const {
  std::string t = gloo_ ? gloo_->transport() : "";
#ifdef TESSERA_HAVE_CUDA
  if (nccl_) t = "NCCL for GPU tensors; host tensors: " + t;
#endif
  return t;
}

Comm *DistContext::comm() {
#ifdef TESSERA_HAVE_CUDA
  if (cuda_comm_) return cuda_comm_.get();
#endif
  return gloo_.get();
}

DistContext::~DistContext() {
  stopping_ = true;
  if (watcher_.joinable()) watcher_.join();
  try {
    // Leaving: the rank watching this one must not take the silence that
    // follows for a freeze.
    if (opt_.heartbeat_timeout_s > 0) client_->set(heartbeat_key(opt_.prefix, opt_.rank), kLeft);
  } catch (const std::exception &) {
    // The store may be gone already at shutdown.
  }
#ifdef TESSERA_HAVE_CUDA
  // NCCL first: it may wait for its collectives in flight.
  cuda_comm_.reset();
  nccl_.reset();
#endif
  gloo_.reset();
  try {
    // Rank 0 serving the store stays until every rank has left it.
    client_->add(opt_.prefix + "/done", 1);
    if (server_) {
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      std::string v;
      while (std::chrono::steady_clock::now() < deadline) {
        if (server_->peek(opt_.prefix + "/done", &v) &&
            std::strtoll(v.c_str(), nullptr, 10) >= opt_.world_size)
          break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  } catch (const std::exception &) {
    // The store may be gone already at shutdown; nothing is left to do.
  }
}

void DistContext::post_abort(const std::string &reason) {
  try {
    post_abort_cause(*client_, opt_.prefix, "rank " + std::to_string(opt_.rank) + ": " + reason);
  } catch (const std::exception &) {
    // Best effort: the launcher still sees this rank exit non-zero.
  }
}

bool DistContext::heartbeat(std::chrono::steady_clock::time_point now) {
  if (opt_.heartbeat_timeout_s <= 0 || opt_.world_size < 2) return false;
  if (now - last_post_ < std::chrono::milliseconds(500)) return false;
  last_post_ = now;
  // A count, twice a second, from this thread: it runs whatever the rank's
  // main thread is doing (a long collective, a long step), and stops only
  // when the whole process does (SIGSTOP, a host that hangs).
  watch_client_->set(heartbeat_key(opt_.prefix, opt_.rank), std::to_string(++beats_));
  // Each rank watches the next one: every rank is watched, and the store
  // sees two requests per rank per beat whatever the world size.
  const uint32_t peer = (opt_.rank + 1) % opt_.world_size;
  std::string beat;
  if (!watch_client_->check(heartbeat_key(opt_.prefix, peer), &beat)) return false;  // not up yet
  if (beat == kLeft) return false;
  if (beat != peer_beat_) {
    peer_beat_ = beat;
    peer_changed_ = now;
    return false;
  }
  const auto quiet = std::chrono::duration_cast<std::chrono::seconds>(now - peer_changed_);
  if (quiet.count() < opt_.heartbeat_timeout_s) return false;
  // Posted in the frozen rank's name: it is the cause, whoever noticed.
  const std::string why = "rank " + std::to_string(peer) +
                          ": stopped responding: no heartbeat for " +
                          std::to_string(quiet.count()) +
                          " s (comm.heartbeat_timeout_s); the process is stopped (SIGSTOP, a "
                          "debugger), swapping hard, or its host hangs (noticed by rank " +
                          std::to_string(opt_.rank) + ")";
  post_abort_cause(*watch_client_, opt_.prefix, why);
  return true;
}

void DistContext::watch() {
  // Another rank's failure ends this one promptly instead of leaving it in
  // a collective until the timeout; so does losing the store, and so does a
  // peer that stops responding (its heartbeat).
  const std::string mine = "rank " + std::to_string(opt_.rank) + ":";
  while (!stopping_) {
    try {
      (void)heartbeat(std::chrono::steady_clock::now());
      if (!watch_client_->wait({abort_key(opt_.prefix)}, std::chrono::milliseconds(200))) continue;
      std::string why;
      if (!watch_client_->check(abort_key(opt_.prefix), &why) || why.rfind(mine, 0) == 0) {
        // Our own failure: the main thread is already on its way out.
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        continue;
      }
      std::fprintf(stderr, "%s\n", peer_stop_message(why, opt_.rank).c_str());
      std::fflush(stderr);
      ::_exit(kStoppedByPeerStatus);
    } catch (const std::exception &e) {
      if (stopping_) return;
      std::fprintf(stderr, "tessera: rank %u lost the rendezvous store (%s); stopping\n", opt_.rank,
                   e.what());
      std::fflush(stderr);
      ::_exit(kStoppedByPeerStatus);
    }
  }
}

}  // namespace tessera
