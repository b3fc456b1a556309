// The nvme backend's state, shared by nvme.cpp (the state file, the block
// pipeline and the update) and extensions.cpp (parameter fetches and the
// gradient sink). nvme.cpp's opening comment describes the backend.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grad_sink.hpp"
#include "io.hpp"
#include "param_cache.hpp"
#include "param_home.hpp"

namespace tessera::offload::nvme {

constexpr size_t kDirectAlign = 4096;

// One range recorded by step(), updated by the next walk (walk.cpp).
struct Pending {
  size_t offset = 0, count = 0;
  const void *grads = nullptr;
  void *params = nullptr;
  std::vector<tsr_segment> segments;
  double lr = 0, grad_scale = 1;
  int64_t step = 0;
};

struct Nvme;
void walk_settle(Nvme *s);  // below

// The backend: its members setup .. stats are the vtable's entries
// (sdk::offload_vtable, nvme.cpp).
struct Nvme {
  static constexpr const char *kName = kWho;  // for messages
  const tsr_host *host = nullptr;
  std::string path;
  int64_t threads_cfg = 0;
  size_t sub_group = 0;
  bool overlap = true;                          // `overlap`: the walk runs beside the next forward
  int32_t params_where = TSR_PARAMS_ON_DEVICE;  // `params`
  ParamHome home;                               // params = "cpu"
  sdk::Buffer home_buf;
  uint64_t fetch_bytes_read = 0;

  size_t n = 0;
  const tsr_optimizer_vtable *opt = nullptr;
  void *opt_self = nullptr;
  uint32_t state_count = 0;
  bool cuda = false;
  int device_id = 0;  // the run's GPU, for the walk's thread
  DLDataType compute_dtype{};

  size_t block = 0;        // B: elements per block
  size_t blocks = 0;       // ceil(n / B)
  size_t block_bytes = 0;  // (1 + k) * 4B, + the parameters' region (params = "nvme")
  std::string file;
  bool direct = true;
  Io io;
  sdk::Buffer raw[kBuffers];
  char *buf[kBuffers] = {};  // 4096-aligned views of raw
  std::unique_ptr<ThreadPool> pool;
  std::vector<Pending> pending;

  // The walk in flight (walk.cpp): the blocks the recorded ranges touch, in
  // order, each block's bytes to read, and how many of them are written
  // back. Set by the main thread before the walk's thread starts; after
  // that only walk_written, walk_ended and walk_error change, under walk_mu.
  std::thread walker;
  std::mutex walk_mu;
  std::condition_variable walk_cv;
  std::vector<size_t> walk_blocks, walk_read_len;
  size_t walk_written = 0;
  bool walk_ended = true;
  std::exception_ptr walk_error;

  // params = "nvme": the fetches' own ring and three buffers of a block's
  // parameter region, so a fetch runs while the walk uses the others.
  Io fetch_io;
  sdk::Buffer fetch_raw[kBuffers];
  char *fetch_buf[kBuffers] = {};
  // params = "nvme": the regions of the blocks the walk wrote last
  // (`param_cache` of them), where the next forward's fetches find most.
  size_t cache_slots = 0;
  ParamCache cache;
  uint64_t fetch_bytes_cached = 0;

  // What it did, for the closing log line: block updates, the bytes the
  // update read and wrote, the bytes fetches of parameters read. The walk's
  // thread counts its own; they are read once it has ended.
  uint64_t updates = 0, bytes_read = 0, bytes_written = 0;
  double io_wait_s = 0;
  // Read by stats() while a walk may run: the CPU step's seconds and the
  // elements it updated, for the run's breakdown.
  std::atomic<double> update_s{0};
  std::atomic<uint64_t> elements_updated{0};

#if TSR_PLUGIN_CUDA
  CopyStreams copies;
  sdk::Buffer grads_stage, params_stage[2];  // pinned, B elements of the compute dtype
  cudaEvent_t grads_ev = nullptr, params_ev[2] = {};
  int next_params = 0;
  cudaEvent_t fetch_ev[kBuffers] = {};  // params = "nvme": a buffer's copy to the GPU
  static constexpr uint64_t kFetchEnds = 8;
  cudaEvent_t fetch_end[kFetchEnds] = {};  // a fetch's last copy, by ticket
  uint64_t fetches = 0;
#endif
  // With offloaded parameters, every owned gradient in host memory (pinned
  // in CUDA runs), where the zero plugin puts them and the update reads
  // them. After the copy streams: it waits for its copies before they go.
  sdk::Buffer grads_buf;
  GradSink sink;

  bool on_disk() const {
    return params_where == TSR_PARAMS_ON_DISK;
  }
  size_t params_region() const {
    return on_disk() ? block * dtype_bytes(compute_dtype) : 0;
  }
  // The master weights and state arrays of a block: its first bytes.
  size_t state_bytes() const {
    return (1 + state_count) * block * sizeof(float);
  }
  // Byte offset of block b's compute parameters (params = "nvme").
  off_t params_offset(size_t b) const {
    return block_offset(b) + static_cast<off_t>(state_bytes());
  }
  ~Nvme() {
    // A walk still running (a run that failed mid-step) ends first; its
    // failure, if any, was or will not be reported here.
    if (walker.joinable()) walker.join();
    log_totals();
    io.drain();
    fetch_io.drain();
    if (io.fd >= 0) {
      close(io.fd);
      unlink(file.c_str());
    }
#if TSR_PLUGIN_CUDA
    if (grads_ev) cudaEventDestroy(grads_ev);
    for (cudaEvent_t e : params_ev)
      if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : fetch_ev)
      if (e) {
        (void)cudaEventSynchronize(e);
        cudaEventDestroy(e);
      }
    for (cudaEvent_t e : fetch_end)
      if (e) {
        (void)cudaEventSynchronize(e);
        cudaEventDestroy(e);
      }
#endif
  }

  void log_totals() const;

  void setup(const tsr_offload_setup *st);
  void step(const tsr_offload_step *st);
  void flush();
  void read_state(uint32_t slot, size_t offset, size_t count, float *dst);
  void write_state(uint32_t slot, size_t offset, size_t count, const float *src);
  void wait_params(size_t offset, size_t count);
  void wait_grads();
  void stats(tsr_offload_stats *out);

  void check_range(size_t offset, size_t count) const {
    check_owned_range(kWho, offset, count, n);
  }
  // The gradient sink (GradsExtension). The walk reads the gradients and
  // uses the pool: each call lets it end first (it has, by the backward
  // that brings new gradients: the host's wait_grads came before), so a
  // put never replaces gradients an update still reads.
  uint64_t sink_put(size_t offset, size_t count, const void *src, bool add) {
    walk_settle(this);
    return sink.put(offset, count, src, add);
  }
  void sink_release(uint64_t ticket) {
    sink.release(ticket);
  }
  double sink_norm_sq() {
    walk_settle(this);
    return sink.norm_sq();
  }
  off_t block_offset(size_t b) const {
    return static_cast<off_t>(b * block_bytes);
  }
  // Waits for the walk's operation `tag`, calling landed() after each
  // completion it reaps, and counts the time.
  template <class F>
  void wait(int tag, F &&landed) {
    const auto t0 = std::chrono::steady_clock::now();
    io.wait(tag, landed);
    io_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

// The update of the recorded ranges, block by block on a thread of its own
// (walk.cpp): it starts at the first call that needs it (walk_start, a
// no-op with nothing recorded or a walk running) and runs beside the next
// forward, which asks for each group's blocks as it goes (walk_wait).
void walk_start(Nvme *s);
// Blocks until every block the walk updates among those holding owned
// [offset, offset + count) is written back (starting the walk if ranges
// wait); rethrows a failure of the walk.
void walk_wait(Nvme *s, size_t offset, size_t count);
// walk_settle(s): starts the walk if ranges wait, and waits for all of it.

// TSR_EXT_OFFLOAD_PARAMS and TSR_EXT_OFFLOAD_GRADS (extensions.cpp).
const void *get_extension(const char *id);

}  // namespace tessera::offload::nvme
