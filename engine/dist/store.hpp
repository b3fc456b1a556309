// The rendezvous store: a small TCP key-value service (set, get, wait with
// timeout, add) that every rank of a job connects to. It carries Gloo's
// rendezvous, NCCL's unique id, start-up barriers and the abort key.
#pragma once

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

// The key a failing rank writes its reason to ("rank R: reason"), under the
// job attempt's key prefix.
inline std::string abort_key(const std::string &prefix) {
  return prefix + "/abort";
}

class StoreServer {
 public:
  // Listens on host:port (port 0 picks a free one; see port()).
  StoreServer(const std::string &host, uint16_t port);
  ~StoreServer();
  StoreServer(const StoreServer &) = delete;
  StoreServer &operator=(const StoreServer &) = delete;
  uint16_t port() const { return port_; }
  // Reads or writes a key directly (the launcher reads the abort reason,
  // and posts one for a rank that died without a word).
  bool peek(const std::string &key, std::string *value);
  void put(const std::string &key, const std::string &value);

 private:
  void accept_loop();
  void serve(int fd);

  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
  std::vector<int> clients_;
  std::vector<std::thread> threads_;
  std::thread acceptor_;
  bool stopping_ = false;
};

class StoreClient {
 public:
  // Connects, retrying until `timeout` (the server may start after us).
  StoreClient(const std::string &host, uint16_t port, std::chrono::milliseconds timeout);
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

  int fd_ = -1;
  std::mutex mu_;
  std::string endpoint_;
};

}  // namespace tessera
