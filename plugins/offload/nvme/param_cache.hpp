// params = "nvme": the parameter regions of the blocks the walk wrote last,
// kept in host memory (pinned in CUDA runs) as well as on disk. The next
// forward trails the walk by a few blocks (walk.cpp), so its fetches find
// most blocks here and the disk reads them once a step fewer; a block the
// cache no longer holds is read from disk as before. `param_cache` slots,
// reused round robin in the walk's order; 0 turns the cache off.
//
// Two threads use it: the walk puts each block after its update, the host's
// fetches take from it. A slot changes only under the mutex, and a fetch
// copies out of a slot under the mutex too (a memcpy, or on CUDA a queued
// copy whose event the walk waits for before it reuses the slot).
#pragma once

#include <cstring>
#include <mutex>
#include <vector>

#include "io.hpp"

namespace tessera::offload::nvme {

class ParamCache {
 public:
  ParamCache() = default;
  ParamCache(const ParamCache &) = delete;
  ParamCache &operator=(const ParamCache &) = delete;
  ~ParamCache() {
#if TSR_PLUGIN_CUDA
    for (cudaEvent_t e : copied_)
      if (e) {
        (void)cudaEventSynchronize(e);
        cudaEventDestroy(e);
      }
#endif
  }

  // `slots` regions of `region` bytes in `mem` (pinned in CUDA runs).
  void init(const tsr_host *host, DLDevice mem, size_t slots, size_t region, bool cuda) {
    region_ = region;
    cuda_ = cuda;
    raw_.reserve(slots);
    for (size_t i = 0; i < slots; ++i)
      raw_.emplace_back(host, mem, std::max<size_t>(region, 1), TSR_MEM_PARAMS);
    block_.assign(slots, kNone);
#if TSR_PLUGIN_CUDA
    if (cuda)
      for (size_t i = 0; i < slots; ++i) copied_.push_back(make_event(kWho));
#endif
  }
  size_t slots() const {
    return raw_.size();
  }
  size_t bytes() const {
    return raw_.size() * region_;
  }

  // Forgets every block (a new walk rewrites them; a checkpoint's masters
  // rewrite the regions on disk).
  void clear() {
    std::lock_guard<std::mutex> lk(mu_);
    block_.assign(block_.size(), kNone);
  }

  // The walk: block b's region, just updated, into the next slot.
  void put(size_t b, const char *region) {
    if (raw_.empty()) return;
    const size_t slot = next_;
    next_ = (next_ + 1) % raw_.size();
    {
      std::lock_guard<std::mutex> lk(mu_);
      block_[slot] = kNone;  // no fetch starts a copy out of it from here on
    }
#if TSR_PLUGIN_CUDA
    if (cuda_) cuda_check(cudaEventSynchronize(copied_[slot]), kWho, "parameters' copy");
#endif
    std::memcpy(raw_[slot].get(), region, region_);
    std::lock_guard<std::mutex> lk(mu_);
    block_[slot] = b;
  }

  // A fetch: bytes [from, from + len) of block b's region to `out` if the
  // cache holds it (on CUDA a copy queued on `stream`, a device `out`);
  // false when it does not.
  bool take(size_t b, size_t from, size_t len, char *out, [[maybe_unused]] void *stream) {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t slot = 0; slot < block_.size(); ++slot) {
      if (block_[slot] != b) continue;
      const char *in = static_cast<const char *>(raw_[slot].get()) + from;
#if TSR_PLUGIN_CUDA
      if (cuda_) {
        auto *st = static_cast<cudaStream_t>(stream);
        cuda_check(cudaMemcpyAsync(out, in, len, cudaMemcpyHostToDevice, st), kWho,
                   "copy parameters to the GPU");
        cuda_check(cudaEventRecord(copied_[slot], st), kWho, "record");
        return true;
      }
#endif
      std::memcpy(out, in, len);
      return true;
    }
    return false;
  }

 private:
  static constexpr size_t kNone = ~size_t(0);
  size_t region_ = 0, next_ = 0;
  bool cuda_ = false;
  std::vector<sdk::Buffer> raw_;
  std::vector<size_t> block_;  // the block each slot holds, kNone: none
  std::mutex mu_;
#if TSR_PLUGIN_CUDA
  std::vector<cudaEvent_t> copied_;  // each slot's last copy to the GPU
#endif
};

}  // namespace tessera::offload::nvme
