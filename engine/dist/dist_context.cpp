#include "dist/dist_context.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "util/error.hpp"

namespace tessera {

namespace {
DistContext *g_current = nullptr;
}

DistContext *DistContext::current() {
  return g_current;
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
  o.timeout_s = timeout_s;
  o.interface = iface;
  return o;
}

DistContext::DistContext(const DistOptions &opt) : opt_(opt) {
  auto timeout = std::chrono::seconds(opt.timeout_s);
  if (opt.serve_store) server_ = std::make_unique<StoreServer>("", opt.master_port);
  client_ = std::make_unique<StoreClient>(opt.master_addr, opt.master_port, timeout);
  watch_client_ = std::make_unique<StoreClient>(opt.master_addr, opt.master_port, timeout);
  g_current = this;
  watcher_ = std::thread([this] { watch(); });
  try {
    gloo_ = std::make_unique<GlooComm>(
        *client_, opt.rank, opt.world_size, timeout, opt.interface,
        opt.master_addr == "127.0.0.1" || opt.master_addr == "localhost" ? "127.0.0.1" : "",
        "tessera");
  } catch (...) {
    stopping_ = true;
    watcher_.join();
    if (g_current == this) g_current = nullptr;
    throw;
  }
}

DistContext::~DistContext() {
  stopping_ = true;
  if (watcher_.joinable()) watcher_.join();
  gloo_.reset();
  try {
    // Rank 0 serving the store stays until every rank has left it.
    client_->add("tessera/done", 1);
    if (server_) {
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      std::string v;
      while (std::chrono::steady_clock::now() < deadline) {
        if (server_->peek("tessera/done", &v) &&
            std::strtoll(v.c_str(), nullptr, 10) >= opt_.world_size)
          break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  } catch (const std::exception &) {
    // The store may be gone already at shutdown; nothing is left to do.
  }
  if (g_current == this) g_current = nullptr;
}

void DistContext::post_abort(const std::string &reason) {
  try {
    client_->set(kAbortKey, "rank " + std::to_string(opt_.rank) + ": " + reason);
  } catch (const std::exception &) {
    // Best effort: the launcher still sees this rank exit non-zero.
  }
}

void DistContext::watch() {
  // Another rank's failure ends this one promptly instead of leaving it in
  // a collective until the timeout; so does losing the store.
  const std::string mine = "rank " + std::to_string(opt_.rank) + ":";
  while (!stopping_) {
    try {
      if (!watch_client_->wait({kAbortKey}, std::chrono::milliseconds(200))) continue;
      std::string why;
      if (!watch_client_->check(kAbortKey, &why) || why.rfind(mine, 0) == 0) {
        // Our own failure: the main thread is already on its way out.
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        continue;
      }
      auto colon = why.find(':');
      std::fprintf(stderr, "tessera: %s failed:%s; stopping rank %u\n",
                   why.substr(0, colon).c_str(),
                   colon == std::string::npos ? "" : why.substr(colon + 1).c_str(), opt_.rank);
      std::fflush(stderr);
      ::_exit(1);
    } catch (const std::exception &e) {
      if (stopping_) return;
      std::fprintf(stderr, "tessera: rank %u lost the rendezvous store (%s); stopping\n", opt_.rank,
                   e.what());
      std::fflush(stderr);
      ::_exit(1);
    }
  }
}

}  // namespace tessera
