// The rendezvous store: a small TCP key-value service (set, get, wait with
// timeout, add) that every rank of a job connects to. It carries Gloo's
// rendezvous, NCCL's unique id, start-up barriers and the abort key.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tessera {

// The job's shared secret (TESSERA_JOB_SECRET), "" when unset. Every store
// connection proves it knows it before any key is read or written, and the
// store proves it back (docs/security.md, "Rendezvous").
std::string job_secret_from_env();

// Exit status of a rank that stops because another rank failed (the abort
// key) or because it lost a peer or the store: the launcher never names it
// as the cause.
constexpr int kStoppedByPeerStatus = 75;

// The key a failing rank writes its reason to ("rank R: reason"), under the
// job attempt's key prefix.
inline std::string abort_key(const std::string &prefix) {
  return prefix + "/abort";
}

// How much an unauthenticated peer may hold, and for how long. Handshakes
// run in one event loop, side by side: a rank's handshake never waits
// behind a stranger's. When the table is full, the oldest unanswered
// connection (of the address with the most, or of the newcomer's own
// address past its cap) is dropped to make room: a connection is never
// refused at the door, so a flood cannot keep the job's ranks out, it can
// only make some of them try again (StoreClient does, until its timeout).
struct StoreLimits {
  // The whole handshake, from accept to the answer: one deadline, however
  // the peer spaces its bytes.
  std::chrono::milliseconds handshake{10000};
  // Connections in their handshake from one address.
  size_t per_address = 64;
  // In all; 0: a quarter of the open-file limit, between 64 and 1024.
  size_t pending = 0;
};

class StoreServer {
 public:
  // Listens on host:port (port 0 picks a free one; see port()). With a
  // secret, a connection that cannot prove it knows it is logged with its
  // address and dropped; without one the store is open (the callers decide
  // when that is allowed: docs/security.md).
  StoreServer(const std::string &host, uint16_t port,
              const std::string &secret = job_secret_from_env(), StoreLimits limits = {});
  ~StoreServer();
  StoreServer(const StoreServer &) = delete;
  StoreServer &operator=(const StoreServer &) = delete;
  uint16_t port() const { return port_; }
  // Reads or writes a key directly (the launcher reads the abort reason,
  // and posts one for a rank that died without a word).
  bool peek(const std::string &key, std::string *value);
  void put(const std::string &key, const std::string &value);
  // Connections refused so far: a wrong or missing answer, or none in time.
  size_t refused() const { return refused_; }
  // Connections dropped unanswered to make room for newer ones (a flood).
  size_t dropped() const { return dropped_; }

 private:
  struct Pending;
  void handshake_loop();
  void admit(int fd, std::vector<Pending> &pending);
  // Reads what arrived of a pending connection's answer; true when it is
  // finished with (promoted to a served connection, or closed).
  bool on_answer(Pending &p);
  void drop(Pending &p, const std::vector<Pending> &pending);
  void promote(int fd);
  void serve(int fd);
  void note_refused(const std::string &peer, const std::string &why);

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: the destructor wakes the handshake loop
  uint16_t port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
  std::vector<int> clients_;  // authenticated connections
  std::vector<std::thread> threads_;
  std::thread loop_;
  std::atomic<bool> stopping_{false};
  std::string secret_;
  StoreLimits limits_;
  std::atomic<size_t> refused_{0}, dropped_{0};
  std::chrono::steady_clock::time_point flood_logged_{};
  std::vector<std::thread::id> finished_;  // serve threads to join
};

class StoreClient {
 public:
  // Connects, retrying until `timeout` (the server may start after us), then
  // authenticates both ways with `secret` (throws Error when either side
  // fails to prove it knows it, or when only one side has one). A store
  // that drops the connection before the handshake ends (flooded by
  // strangers) is tried again with backoff until `timeout`; the error then
  // says it was flooded.
  StoreClient(const std::string &host, uint16_t port, std::chrono::milliseconds timeout,
              const std::string &secret = job_secret_from_env());
  ~StoreClient();
  StoreClient(const StoreClient &) = delete;
  StoreClient &operator=(const StoreClient &) = delete;

  void set(const std::string &key, const std::string &value);
  // Waits up to `timeout` for the key; throws Error naming the key on timeout.
  std::string get(const std::string &key, std::chrono::milliseconds timeout);
  // Waits for every key; false on timeout.
  bool wait(const std::vector<std::string> &keys, std::chrono::milliseconds timeout);
  // Adds `delta` to the integer at key (0 if absent) and returns the result.
  int64_t add(const std::string &key, int64_t delta);
  // Non-blocking read: true and the value if the key exists.
  bool check(const std::string &key, std::string *value);

  const std::string &endpoint() const { return endpoint_; }

 private:
  struct Reply {
    uint8_t status;
    std::string value;
  };
  Reply request(uint8_t op, const std::string &key, const std::string &value, int64_t arg);
  // "" once authenticated; why not, when trying again may succeed (the store
  // dropped or never greeted this connection); throws when it cannot.
  std::string handshake(const std::string &secret, std::chrono::steady_clock::time_point deadline);

  int fd_ = -1;
  std::mutex mu_;
  std::string endpoint_;
};

// Posts `why` as the job's abort cause unless another rank posted first: the
// first to count up the cause's counter writes it, so later failures (peers
// losing their connection to the first) never overwrite the cause.
inline void post_abort_cause(StoreClient &c, const std::string &prefix, const std::string &why) {
  if (c.add(abort_key(prefix) + "/count", 1) == 1) c.set(abort_key(prefix), why);
}

// What rank `rank` prints as it stops for the abort cause `why`. A rank's
// own cause reads "rank R: text" ("rank 1 failed: text; stopping rank 0");
// the launcher posts a death in its own words ("rank 1 was killed by signal
// SIGKILL (9)"), which is printed as it is.
inline std::string peer_stop_message(const std::string &why, uint32_t rank) {
  const size_t colon = why.find(':');
  size_t digits = 5;  // past "rank "
  while (digits < why.size() && why[digits] >= '0' && why[digits] <= '9') ++digits;
  const bool own = why.rfind("rank ", 0) == 0 && digits > 5 && colon == digits;
  return "tessera: " + (own ? why.substr(0, colon) + " failed:" + why.substr(colon + 1) : why) +
         "; stopping rank " + std::to_string(rank);
}

}  // namespace tessera
