// What the `cpu` and `nvme` offload backends share: a small thread pool, the
// split of an update into per-thread chunks, and the optimizer step run over
// those chunks on host memory. In a CUDA build of the plugin
// (TSR_PLUGIN_CUDA) also the two copy streams that move gradients to the
// host and updated compute parameters back while the CPU works.
//
// The update math is the optimizer plugin's: these backends only call its
// CPU step (device kDLCPU) on host pointers, one chunk per thread. Each
// element's update depends on that element alone, so splitting a range into
// chunks changes nothing: the result is bit for bit the same as one call over
// the whole range (and as the `none` backend's step on the same device).
#pragma once

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <tessera/cpp/optimizer.hpp>
#include <tessera/cpp/plugin.hpp>
#include <thread>
#include <vector>

#if TSR_PLUGIN_CUDA
#include <cuda_runtime.h>
#endif

namespace tessera::offload {

namespace sdk = tessera::sdk;
using sdk::optim::fmt;

// Optimizer state arrays a backend can drive (adam has 2, sgd 0 or 1).
constexpr uint32_t kMaxStates = 8;

// 16 floats: a chunk boundary on a multiple of this keeps each thread's
// arrays on their own 64-byte cache lines (the arrays start 64-byte aligned).
constexpr size_t kAlignElems = 16;

inline size_t align_up(size_t x, size_t a) {
  return (x + a - 1) / a * a;
}

inline double mib(double bytes) {
  return bytes / 1048576.0;
}

// Threads for the CPU step when the config says 0: the cores this process
// may run on (affinity, cgroups), shared among the ranks of this machine,
// the same rule the engine uses for run.threads.
inline unsigned default_threads(const tsr_host *host) {
  cpu_set_t set;
  CPU_ZERO(&set);
  unsigned cores = sched_getaffinity(0, sizeof set, &set) == 0
                       ? static_cast<unsigned>(CPU_COUNT(&set))
                       : std::thread::hardware_concurrency();
  const uint32_t local = host->run ? std::max<uint32_t>(1, host->run->local_world_size) : 1;
  return std::max(1u, std::max(1u, cores) / local);
}

// The `threads` key of the backends that step on the CPU (cpu, nvme),
// which default_threads resolves when it is 0.
inline constexpr tsr_param_decl kThreadsParam = sdk::param_min(
    "threads", TSR_PARAM_INT, "0",
    "threads for the CPU step; 0: the cores of this process / ranks on the machine", 0);

inline size_t dtype_bytes(DLDataType t) {
  return (static_cast<size_t>(t.bits) * t.lanes + 7) / 8;
}

// [offset, offset + count) must lie within the n elements this rank owns.
inline void check_owned_range(const char *who, size_t offset, size_t count, size_t n) {
  if (offset > n || count > n - offset)
    throw sdk::Error(TSR_ERR_INVALID,
                     fmt("%s: range [%zu, %zu + %zu) is past the %zu owned elements", who, offset,
                         offset, count, n));
}

inline bool is_f32(DLDataType t) {
  return t.code == kDLFloat && t.bits == 32 && t.lanes == 1;
}

// The checks every backend of this folder makes of its setup: the struct's
// size, a device it was built for (`devices`: TSR_DEVICE_* bits), float32
// compute on the CPU, at most kMaxStates state arrays, and no ZeRO stage 0
// at several ranks, which would keep a full copy of the optimizer state on
// every rank (`where`: "in every rank's host memory", "on every rank's
// disk"). The zero plan says what the stage partitions (ABI 1.1); a 1.0
// host does not say, and is trusted. Returns whether the run is on CUDA.
inline bool check_setup(const tsr_host *host, const tsr_offload_setup *st, const char *who,
                        uint32_t devices, const char *where) {
  if (!TSR_HAS_FIELD(st, tsr_offload_setup, compute_dtype))
    throw sdk::Error(TSR_ERR_INVALID, fmt("%s: setup struct missing or too small", who));
  const int32_t dev = st->device.device_type;
  const bool cuda = dev == kDLCUDA;
  if (dev != kDLCPU && !(cuda && (devices & TSR_DEVICE_CUDA)))
    throw sdk::Error(TSR_ERR_UNSUPPORTED,
                     fmt("%s: device type %d is not supported (CPU%s)", who, int(dev),
                         (devices & TSR_DEVICE_CUDA) ? " and CUDA" : " only: built without CUDA"));
  if (!cuda && !is_f32(st->compute_dtype))
    throw sdk::Error(TSR_ERR_UNSUPPORTED, fmt("%s: CPU runs compute in float32", who));
  if (st->state_count > kMaxStates)
    throw sdk::Error(TSR_ERR_UNSUPPORTED, fmt("%s: the optimizer has %u state arrays; at most %u",
                                              who, st->state_count, kMaxStates));
  const uint32_t world = host->run ? host->run->world_size : 1;
  if (world > 1 && TSR_HAS_FIELD(st, tsr_offload_setup, zero_plan) && st->zero_plan &&
      !st->zero_plan->partition_optimizer)
    throw sdk::Error(TSR_ERR_UNSUPPORTED,
                     fmt("%s: ZeRO stage 0 at %u ranks would keep a full copy of the optimizer "
                         "state %s; use zero.plugin = \"stage1\", \"stage2\" or \"stage3\" "
                         "with offload (or run on one rank)",
                         who, world, where));
  return cuda;
}

// The CPUs this process may run on (affinity, cgroups), in order.
inline std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

// A fixed pool of threads - 1 workers; run() hands out tasks to them and to
// the calling thread, and returns when every task is done. Created at setup,
// so a step starts no threads. With `pin`, worker i stays on the (i + 1)-th
// allowed CPU (when there are at least `threads` of them): a thread that
// keeps its core keeps its caches and the pages it touched first.
class ThreadPool {
 public:
  explicit ThreadPool(unsigned threads, bool pin = false) {
    const std::vector<int> cpus = pin ? allowed_cpus() : std::vector<int>{};
    const bool pinned = pin && cpus.size() >= threads;
    for (unsigned i = 1; i < threads; ++i)
      workers_.emplace_back([this, pinned, cpu = pinned ? cpus[i] : -1] {
        if (pinned) {
          cpu_set_t one;
          CPU_ZERO(&one);
          CPU_SET(cpu, &one);
          (void)pthread_setaffinity_np(pthread_self(), sizeof one, &one);
        }
        work();
      });
  }
  ThreadPool(const ThreadPool &) = delete;
  ThreadPool &operator=(const ThreadPool &) = delete;
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto &t : workers_) t.join();
  }
  unsigned size() const { return static_cast<unsigned>(workers_.size()) + 1; }

  // fn(i) for i in [0, tasks). fn must not throw.
  void run(size_t tasks, const std::function<void(size_t)> &fn) {
    if (workers_.empty() || tasks <= 1) {
      for (size_t i = 0; i < tasks; ++i) fn(i);
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &fn;
      tasks_ = tasks;
      next_.store(0);
      active_ = workers_.size();
      ++generation_;
    }
    cv_.notify_all();
    drain();
    std::unique_lock<std::mutex> lk(mu_);
    done_.wait(lk, [&] { return active_ == 0; });
    fn_ = nullptr;
  }

 private:
  void drain() {
    for (size_t i; (i = next_.fetch_add(1)) < tasks_;) (*fn_)(i);
  }
  void work() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      lk.unlock();
      drain();
      lk.lock();
      if (--active_ == 0) done_.notify_all();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_;
  const std::function<void(size_t)> *fn_ = nullptr;
  size_t tasks_ = 0;
  std::atomic<size_t> next_{0};
  size_t active_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

// Asks for transparent huge pages over the 2 MiB-aligned interior of
// [p, p + bytes) (a no-op where the kernel has none).
inline void advise_huge_pages(void *p, size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  const uintptr_t b = align_up(reinterpret_cast<uintptr_t>(p), kHuge);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) / kHuge * kHuge;
  if (b < e) (void)madvise(reinterpret_cast<void *>(b), e - b, MADV_HUGEPAGE);
}

// Writes zeros over `bytes` at `p` from every pool thread, an even share
// each: the kernel then maps the pages in parallel (and, on a machine of
// several memory nodes, near the threads that will update them) instead of
// one page fault at a time inside the first step.
inline void first_touch(ThreadPool &pool, void *p, size_t bytes) {
  if (!p || bytes == 0) return;
  const size_t parts = pool.size();
  const size_t per = align_up((bytes + parts - 1) / parts, 4096);
  pool.run(parts, [&](size_t i) {
    const size_t b = std::min(bytes, i * per), e = std::min(bytes, b + per);
    if (b < e) std::memset(static_cast<char *>(p) + b, 0, e - b);
  });
}

// The segments of [begin, end) (relative to the same origin as `segs`),
// rebased to begin.
inline void slice_segments(const tsr_segment *segs, size_t num, size_t begin, size_t end,
                           std::vector<tsr_segment> &out) {
  out.clear();
  for (size_t k = 0; k < num; ++k) {
    const size_t lo = std::max(segs[k].offset, begin);
    const size_t hi = std::min(segs[k].offset + segs[k].count, end);
    if (lo < hi) out.push_back(tsr_segment{lo - begin, hi - lo, segs[k].decay});
  }
}

// One update on host memory: `count` elements from owned element `owned`,
// every pointer at the first of them.
struct HostUpdate {
  float *master = nullptr;
  std::array<float *, kMaxStates> state{};
  uint32_t state_count = 0;
  const void *grads = nullptr;  // in grads_dtype
  DLDataType grads_dtype{kDLFloat, 32, 1};
  void *params_out = nullptr;  // the compute copy, in out_dtype; NULL: none
  DLDataType out_dtype{kDLFloat, 32, 1};
  size_t owned = 0;  // owned index of the first element (chunk alignment)
  size_t count = 0;
  const tsr_segment *segments = nullptr;  // relative to the first element
  size_t num_segments = 0;
  double lr = 0, grad_scale = 1;
  int64_t step = 0;
};

// The optimizer's CPU step over all of `u` in one call, on this thread.
inline tsr_status step_block(const tsr_optimizer_vtable *opt, void *opt_self, const HostUpdate &u) {
  auto a = sdk::make<tsr_optimizer_step_args>();
  a.device = DLDevice{kDLCPU, 0};
  a.params = u.master;
  a.grads = static_cast<const float *>(u.grads);
  a.state = u.state.data();
  a.n = u.count;
  a.segments = u.segments;
  a.num_segments = u.num_segments;
  a.lr = u.lr;
  a.grad_scale = u.grad_scale;
  a.step = u.step;
  a.compute_params = u.params_out;
  a.compute_dtype = u.out_dtype;
  a.grads_dtype = u.grads_dtype;
  return opt->step(opt_self, &a);
}

// Runs the optimizer's CPU step over `u`, split into chunks of at least
// `min_chunk` elements, one per pool thread, with boundaries on 64-byte
// multiples of the owned index space. Returns the first failing status (the
// optimizer has recorded its message with the host).
inline tsr_status run_update(ThreadPool &pool, const tsr_optimizer_vtable *opt, void *opt_self,
                             const HostUpdate &u, size_t min_chunk = 16384) {
  if (u.count == 0) return TSR_OK;
  const size_t parts =
      std::max<size_t>(1, std::min<size_t>(pool.size(), (u.count + min_chunk - 1) / min_chunk));
  const size_t per = (u.count + parts - 1) / parts;
  // Chunk i covers [bound(i), bound(i + 1)).
  auto bound = [&](size_t i) -> size_t {
    if (i == 0) return 0;
    if (i >= parts) return u.count;
    return std::min(u.count, align_up(u.owned + i * per, kAlignElems) - u.owned);
  };
  const size_t gb = dtype_bytes(u.grads_dtype), pb = dtype_bytes(u.out_dtype);
  std::atomic<tsr_status> first{TSR_OK};
  pool.run(parts, [&](size_t i) {
    const size_t b = bound(i), e = bound(i + 1);
    if (b >= e) return;
    std::vector<tsr_segment> segs;
    slice_segments(u.segments, u.num_segments, b, e, segs);
    HostUpdate part = u;
    part.master = u.master + b;
    for (uint32_t s = 0; s < u.state_count; ++s) part.state[s] = u.state[s] + b;
    part.grads = static_cast<const char *>(u.grads) + b * gb;
    part.params_out = u.params_out ? static_cast<char *>(u.params_out) + b * pb : nullptr;
    part.owned = u.owned + b;
    part.count = e - b;
    part.segments = segs.data();
    part.num_segments = segs.size();
    const tsr_status s = step_block(opt, opt_self, part);
    tsr_status ok = TSR_OK;
    if (s != TSR_OK) first.compare_exchange_strong(ok, s);
  });
  return first.load();
}

#if TSR_PLUGIN_CUDA

inline void cuda_check(cudaError_t e, const char *who, const char *what) {
  if (e != cudaSuccess)
    throw sdk::Error(TSR_ERR_INTERNAL, fmt("%s: %s: %s", who, what, cudaGetErrorString(e)));
}

// Two copy streams beside the engine's compute stream: gradients
// device -> host on one, updated compute parameters host -> device on the
// other, so both directions of the link run at once.
struct CopyStreams {
  const char *who = "offload";
  cudaStream_t d2h = nullptr, h2d = nullptr;
  cudaEvent_t ready = nullptr;  // recorded on the compute stream at each step

  void init(const char *name) {
    who = name;
    cuda_check(cudaStreamCreateWithFlags(&d2h, cudaStreamNonBlocking), who, "copy stream");
    cuda_check(cudaStreamCreateWithFlags(&h2d, cudaStreamNonBlocking), who, "copy stream");
    cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), who, "event");
  }
  ~CopyStreams() {
    if (ready) cudaEventDestroy(ready);
    if (d2h) cudaStreamDestroy(d2h);
    if (h2d) cudaStreamDestroy(h2d);
  }
  // Orders the copies after everything queued on the compute stream (the
  // backward pass and the reductions that produced the gradients).
  void after_compute(void *compute_stream) {
    cuda_check(cudaEventRecord(ready, static_cast<cudaStream_t>(compute_stream)), who, "record");
    cuda_check(cudaStreamWaitEvent(d2h, ready, 0), who, "wait");
    cuda_check(cudaStreamWaitEvent(h2d, ready, 0), who, "wait");
  }
  void to_host(void *dst, const void *src, size_t bytes, cudaEvent_t done) {
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, d2h), who, "copy to host");
    cuda_check(cudaEventRecord(done, d2h), who, "record");
  }
  void to_device(void *dst, const void *src, size_t bytes, cudaEvent_t done) {
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, h2d), who,
               "copy to device");
    cuda_check(cudaEventRecord(done, h2d), who, "record");
  }
  void wait(cudaEvent_t e) { cuda_check(cudaEventSynchronize(e), who, "event wait"); }
  void finish() {
    cuda_check(cudaStreamSynchronize(d2h), who, "copy stream");
    cuda_check(cudaStreamSynchronize(h2d), who, "copy stream");
  }
};

inline cudaEvent_t make_event(const char *who) {
  cudaEvent_t e = nullptr;
  cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), who, "event");
  return e;
}

#endif

}  // namespace tessera::offload
