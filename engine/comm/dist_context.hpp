// A worker's place in a multi-process job: the rendezvous store (served here
// when rank 0 runs under another launcher), the abort watch, the Gloo
// communicator and, in CUDA runs, the NCCL one.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "comm/gloo_comm.hpp"
#include "comm/store.hpp"

namespace tessera {

class NcclComm;
class CudaComm;

// kStoppedByPeerStatus (comm/store.hpp, with the abort protocol): the exit
// status of a rank that stops because another failed.

struct DistOptions {
  uint32_t rank = 0, world_size = 1;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;
  bool serve_store = false;  // rank 0 without our launcher
  int timeout_s = 300;
  // A rank whose heartbeat (posted by its watch thread) stops for this
  // long is named as the failed one; 0: off (debugging: a rank stopped in a
  // debugger has no heartbeat).
  int heartbeat_timeout_s = 30;
  std::string interface;
  std::string prefix = "tessera/a0";  // store keys of this attempt
  bool cuda = false;                  // also connect NCCL (the GPU is selected already)
  bool shm = true;                    // CPU collectives through shared memory on one host
};

// Reads MASTER_ADDR/MASTER_PORT and whether our launcher serves the store.
DistOptions dist_options_from_env(uint32_t rank, uint32_t world, int timeout_s,
                                  const std::string &iface);

// The local address on the route to host:port.
std::string local_address_toward(const std::string &host, uint16_t port);

// The IPv4 (else IPv6) address of network interface `iface` on this host;
// throws Error naming the interface (and those there are) when it has none.
std::string interface_address(const std::string &iface);

// Where a rendezvous store for clients connecting to `master` listens:
//   - `iface` (comm.interface, GLOO_SOCKET_IFNAME) set: that interface's address;
//   - `master` a literal loopback (127.x, localhost, ::1): that address (one host);
//   - `master` an address of this host: that address;
//   - otherwise ("" = every interface): a name that resolves to loopback
//     here (Debian's 127.0.1.1 for the host name) or to no local address
//     (NAT, a virtual IP); `note`, when given, then says why.
std::string store_listen_address(const std::string &master, const std::string &iface,
                                 std::string *note = nullptr);

// Rank 0 under another launcher serves its store without a job secret
// (TESSERA_JOB_SECRET unset) only on loopback, or with
// TESSERA_INSECURE_STORE=1; throws a ConfigError-coded Error saying how to
// set one otherwise (docs/security.md).
void check_open_store(const std::string &listen_at);

class DistContext {
 public:
  explicit DistContext(const DistOptions &opt);
  ~DistContext();
  DistContext(const DistContext &) = delete;
  DistContext &operator=(const DistContext &) = delete;

  // How the CPU collectives move data ("shared memory ...", "Gloo TCP ...").
  std::string transport() const;
  // The collectives (the host's RunFacts::comm): the GlooComm on CPU runs,
  // the CudaComm (GPU tensors to NCCL, host tensors to Gloo) when
  // DistOptions::cuda is set.
  Comm *comm();
  GlooComm *gloo() { return gloo_.get(); }
  // Tells every rank this one failed; they stop with "rank r failed: reason".
  void post_abort(const std::string &reason);

 private:
  void watch();
  // Posts this rank's heartbeat, and checks the next rank's: true (and the
  // abort posted for it) when that one has stopped.
  bool heartbeat(std::chrono::steady_clock::time_point now);

  DistOptions opt_;
  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<StoreClient> client_, watch_client_;
  std::unique_ptr<GlooComm> gloo_;
#ifdef TESSERA_HAVE_CUDA
  std::unique_ptr<NcclComm> nccl_;
  std::unique_ptr<CudaComm> cuda_comm_;
#endif
  std::atomic<bool> stopping_{false};
  std::thread watcher_;
  // The watch thread's heartbeat state.
  int64_t beats_ = 0;
  std::chrono::steady_clock::time_point last_post_{}, peer_changed_{};
  std::string peer_beat_;
};

}  // namespace tessera
