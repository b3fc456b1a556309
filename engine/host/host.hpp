// The engine side of the host table: errors, logging, config handles,
// memory with statistics by purpose, the run facts, ops and collectives.
#pragma once

#include <tessera/host.h>
#include <toml++/toml.h>

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

// A plugin's validated config section, opaque to plugins.
namespace tessera {
class Comm;
class Host;
}  // namespace tessera
struct tsr_config {
  tessera::Host *host = nullptr;  // receives error messages of config reads
  std::string section;            // "optimizer", "data.train", ...
  std::string plugin;             // plugin name
  toml::table values;             // every declared key, defaults filled in
};

namespace tessera {

struct MemoryStats {
  std::array<size_t, TSR_MEM_PURPOSE_COUNT> current{};
  std::array<size_t, TSR_MEM_PURPOSE_COUNT> peak{};
  size_t current_total = 0;
  size_t peak_total = 0;
};

const char *purpose_name(tsr_mem_purpose p);

// The step context handed to models (tsr_step is opaque to plugins).
struct StepHooks {
  std::function<tsr_status(uint32_t, DLTensor *)> param;
  std::function<tsr_status(uint32_t, DLTensor *)> grad;
  std::function<tsr_status(uint32_t)> grads_done;
  std::function<tsr_status(uint32_t)> params_done;
  // ABI 1.5 grads_zeroed: whether this pass's gradient buffers began at zero.
  std::function<bool()> grads_zeroed;
  // ABI 1.9 step_position: steps completed before this pass, its micro-batch.
  uint64_t update = 0;
  uint32_t micro = 0;
};

class Host {
 public:
  struct RunFacts {
    uint32_t rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
    DLDevice device{kDLCPU, 0};
    tsr_precision precision = TSR_PRECISION_FP32;
    uint64_t seed = 42;
    std::string run_dir;
    // The run's collectives (comm/comm.hpp; null: a world of one). The
    // table's comm entries call it (host/comm_table.cpp).
    Comm *comm = nullptr;
    // run.max_gpu_memory: device allocations beyond this many bytes fail
    // with a message naming what did not fit (0: no cap).
    uint64_t max_gpu_memory = 0;
  };

  explicit Host(RunFacts facts);
  ~Host();
  Host(const Host &) = delete;
  Host &operator=(const Host &) = delete;

  const tsr_host *table() const { return &table_; }
  tsr_host_ctx *ctx() const;

  // The message of the last error a plugin or host call reported.
  std::string last_error() const;
  void clear_error();
  void set_error(const std::string &message);

  // The training step under way (-1 outside training), for messages that
  // say when a plugin call failed.
  int64_t step() const { return step_.load(std::memory_order_relaxed); }
  void set_step(int64_t step) { step_.store(step, std::memory_order_relaxed); }

  // A config handle for a plugin; lives as long as the Host.
  tsr_config *make_config(const std::string &section, const std::string &plugin,
                          toml::table values);

  // Allocation statistics on the run's compute device (the GPU in CUDA
  // runs, host memory otherwise), and in host memory (pageable and pinned).
  MemoryStats memory() const;
  MemoryStats host_memory() const;
  // Of host_memory's bytes in a CUDA run, those pinned (page-locked).
  size_t pinned_bytes() const;
  const RunFacts &facts() const { return facts_; }
  // The collectives behind the table's comm entries.
  Comm &comm() const;

  // Step hooks used while a model runs forward/backward.
  tsr_step *step_handle(StepHooks *hooks) { return reinterpret_cast<tsr_step *>(hooks); }

  // Engine-internal allocation with the same accounting as plugins'.
  void *alloc(DLDevice device, size_t bytes, tsr_mem_purpose purpose);
  void free(void *ptr);

  struct Impl;

 private:
  RunFacts facts_;
  tsr_run_info run_info_{};
  tsr_host table_{};
  std::unique_ptr<Impl> impl_;
  std::atomic<int64_t> step_{-1};
};

// The host behind a ctx pointer (the ctx is the Host's Impl).
Host *host_from_ctx(tsr_host_ctx *ctx);

// The ABI's tsr_comm table: each entry calls the Comm of the ctx's host.
const tsr_comm *host_comm_table();

}  // namespace tessera
