// The CUDA device runtime: device selection, the three streams, the caching
// allocator for device memory and the cache of pinned host memory.
//
// Allocator: a request is rounded up to its size class (512 B steps below
// 1 MiB, 2 MiB steps above) and served from that class's free list when it
// holds a block, else from cudaMalloc. device_free puts the block back on
// its class's list; only release_cache (or an allocation that failed once)
// returns blocks to the driver. Blocks are reused in stream order on the
// compute stream: a block freed while queued compute work still reads it is
// safe to hand out again for later compute work. Memory used on the comm or
// copy stream must be freed only once that use is ordered before the
// compute stream's later work (the comm's wait() does exactly that).
//
// Nothing here is ever destroyed: the CUDA runtime may be gone when static
// destructors run, and the driver reclaims everything at process exit.
#include "backend/cuda/device.hpp"

#include <spdlog/spdlog.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "util/error.hpp"
#include "util/text.hpp"

namespace tessera::cuda {

namespace {

constexpr size_t kKiB = 1024, kMiB = 1024 * kKiB;
constexpr size_t kSmallStep = 512, kLargeStep = 2 * kMiB, kSmallLimit = kMiB;

size_t size_class(size_t bytes) {
  const size_t step = bytes < kSmallLimit ? kSmallStep : kLargeStep;
  return (bytes + step - 1) / step * step;
}

struct Runtime {
  std::mutex mu;
  int device = -1;
  cudaStream_t compute = nullptr, comm = nullptr, copy = nullptr;
};

Runtime &runtime() {
  static Runtime *r = new Runtime;  // never destroyed (see the top)
  return *r;
}

// One cache of blocks by size class: device memory or pinned host memory.
struct Cache {
  std::mutex mu;
  std::unordered_map<void *, size_t> live;                 // block -> its class
  std::unordered_map<size_t, std::vector<void *>> blocks;  // class -> free blocks
  size_t reserved = 0, cached = 0;
};

Cache &device_cache() {
  static Cache *c = new Cache;
  return *c;
}

Cache &pinned_cache() {
  static Cache *c = new Cache;
  return *c;
}

// Returns every free block of `c` with `release` (c.mu held).
template <typename Release>
void drain(Cache &c, Release release) {
  for (auto &[cls, list] : c.blocks) {
    for (void *p : list) {
      release(p);
      c.reserved -= cls;
      c.cached -= cls;
    }
    list.clear();
  }
  c.blocks.clear();
}

void *take_cached(Cache &c, size_t cls) {
  auto it = c.blocks.find(cls);
  if (it == c.blocks.end() || it->second.empty()) return nullptr;
  void *p = it->second.back();
  it->second.pop_back();
  c.cached -= cls;
  c.live.emplace(p, cls);
  return p;
}

}  // namespace

void check_cuda(cudaError_t err, const char *call, const char *file, int line) {
  if (err == cudaSuccess) return;
  // Clears a non-sticky error so that it is not reported again by the next
  // call; a sticky one (a kernel fault) stays and every later call fails.
  (void)cudaGetLastError();
  const tsr_status code = err == cudaErrorMemoryAllocation ? TSR_ERR_NO_MEMORY : TSR_ERR_INTERNAL;
  throw Error(code, std::string("CUDA error ") + cudaGetErrorName(err) + " (" +
                        cudaGetErrorString(err) + ") in " + call + " at " + file + ":" +
                        std::to_string(line));
}

int visible_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

void select_device(int ordinal) {
  Runtime &r = runtime();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.device == ordinal) return;
  if (r.device >= 0)
    throw Error(TSR_ERR_INVALID, "select_device(" + std::to_string(ordinal) +
                                     "): this process already drives GPU " +
                                     std::to_string(r.device));
  const int n = visible_devices();
  if (ordinal < 0 || ordinal >= n)
    throw Error(TSR_ERR_INVALID,
                "CUDA device " + std::to_string(ordinal) + " does not exist: " + std::to_string(n) +
                    " visible (check CUDA_VISIBLE_DEVICES and the local rank of this worker)");
  TSR_CUDA_CHECK(cudaSetDevice(ordinal));
  // Lower numbers are higher priorities: collectives get the highest, so
  // a reduction that is ready is not starved by queued compute kernels.
  int least = 0, greatest = 0;
  TSR_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  TSR_CUDA_CHECK(cudaStreamCreateWithPriority(&r.compute, cudaStreamNonBlocking, least));
  TSR_CUDA_CHECK(cudaStreamCreateWithPriority(&r.comm, cudaStreamNonBlocking, greatest));
  TSR_CUDA_CHECK(cudaStreamCreateWithPriority(&r.copy, cudaStreamNonBlocking, least));
  r.device = ordinal;
}

int current_device() {
  Runtime &r = runtime();
  std::lock_guard<std::mutex> lk(r.mu);
  return r.device;
}

void bind_thread() {
  // CUDA's current device is per host thread; each thread binds once.
  thread_local int bound = -1;
  const int dev = current_device();
  if (dev < 0)
    throw Error(TSR_ERR_INVALID, "CUDA: no device selected (select_device was not called)");
  if (bound == dev) return;
  TSR_CUDA_CHECK(cudaSetDevice(dev));
  bound = dev;
}

std::string device_name() {
  const int dev = current_device();
  if (dev < 0) return "no CUDA device selected";
  cudaDeviceProp p{};
  TSR_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  char buf[384];
  std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %s)", p.name, p.major, p.minor,
                format_bytes(static_cast<double>(p.totalGlobalMem)).c_str());
  return buf;
}

cudaStream_t compute_stream() {
  return runtime().compute;
}
cudaStream_t comm_stream() {
  return runtime().comm;
}
cudaStream_t copy_stream() {
  return runtime().copy;
}

void synchronize() {
  bind_thread();
  TSR_CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
}

void *device_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  bind_thread();
  const size_t cls = size_class(bytes);
  Cache &c = device_cache();
  std::lock_guard<std::mutex> lk(c.mu);
  if (void *p = take_cached(c, cls)) return p;
  void *p = nullptr;
  cudaError_t err = cudaMalloc(&p, cls);
  if (err == cudaErrorMemoryAllocation) {
    // Blocks of other classes may be what stands in the way: give them
    // back (cudaFree waits for the device) and try once more.
    (void)cudaGetLastError();
    drain(c, [](void *q) { (void)cudaFree(q); });
    err = cudaMalloc(&p, cls);
  }
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
    throw Error(TSR_ERR_NO_MEMORY, "CUDA: cannot allocate " + std::to_string(bytes) + " bytes (" +
                                       format_bytes(bytes) + "; " +
                                       format_bytes(c.reserved - c.cached) + " in use, " +
                                       format_bytes(c.cached) + " cached, " + format_bytes(free_b) +
                                       " free on device of " + format_bytes(total_b) + ")");
  }
  TSR_CUDA_CHECK(err);
  c.live.emplace(p, cls);
  c.reserved += cls;
  return p;
}

void device_free(void *p) {
  if (!p) return;
  Cache &c = device_cache();
  std::lock_guard<std::mutex> lk(c.mu);
  auto it = c.live.find(p);
  if (it == c.live.end()) {
    // A double free or a pointer from elsewhere: keeping it out of the
    // cache is all that is safe; say so loudly.
    spdlog::error("CUDA: device_free({}) of a block the allocator does not hold (double free?)", p);
    return;
  }
  const size_t cls = it->second;
  c.live.erase(it);
  c.blocks[cls].push_back(p);
  c.cached += cls;
}

size_t reserved_bytes() {
  Cache &c = device_cache();
  std::lock_guard<std::mutex> lk(c.mu);
  return c.reserved;
}

size_t device_capacity() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
  return total_b;
}

size_t cached_bytes() {
  Cache &c = device_cache();
  std::lock_guard<std::mutex> lk(c.mu);
  return c.cached;
}

void release_cache() {
  if (current_device() < 0) return;
  bind_thread();
  Cache &c = device_cache();
  std::lock_guard<std::mutex> lk(c.mu);
  drain(c, [](void *q) { (void)cudaFree(q); });  // a sticky error shows at the next sync
}

namespace {

// Blocks of at least this size are pinned by registering memory we map and
// fault in ourselves: cudaHostAlloc of many GiB pins one page at a time on
// one thread (the 1.5B offload run spent 50 s there). Here the pages come as
// transparent huge pages where the kernel has them, are faulted in by one
// thread per core, and are then registered in one piece (a copy must not
// span two registrations to run as a pinned copy).
constexpr size_t kRegisterAbove = 256 * kMiB;

std::unordered_map<void *, size_t> &registered() {  // block -> mapped bytes (cache mutex held)
  static auto *m = new std::unordered_map<void *, size_t>;
  return *m;
}

void *map_and_register(size_t bytes) {
  void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  (void)madvise(p, bytes, MADV_HUGEPAGE);
  const size_t threads = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  const size_t per = (bytes / threads + kLargeStep - 1) / kLargeStep * kLargeStep;
  std::vector<std::thread> touch;
  for (size_t i = 0; i < threads; ++i)
    touch.emplace_back([p, bytes, per, i] {
      const size_t b = std::min(bytes, i * per), e = std::min(bytes, b + per);
      if (b < e) std::memset(static_cast<char *>(p) + b, 0, e - b);
    });
  for (auto &t : touch) t.join();
  if (cudaHostRegister(p, bytes, cudaHostRegisterPortable) != cudaSuccess) {
    (void)cudaGetLastError();
    munmap(p, bytes);
    return nullptr;
  }
  registered().emplace(p, bytes);
  return p;
}

void free_pinned_block(void *q) {
  auto it = registered().find(q);
  if (it == registered().end()) {
    (void)cudaFreeHost(q);
    return;
  }
  (void)cudaHostUnregister(q);
  munmap(q, it->second);
  registered().erase(it);
}

}  // namespace

void *pinned_alloc(size_t bytes, bool *zeroed) {
  if (zeroed) *zeroed = false;
  if (bytes == 0) return nullptr;
  // Pinned memory is portable across devices, but the runtime needs a
  // context: bind one when a device is selected.
  if (current_device() >= 0) bind_thread();
  const size_t cls = size_class(bytes);
  Cache &c = pinned_cache();
  std::lock_guard<std::mutex> lk(c.mu);
  if (void *p = take_cached(c, cls)) return p;
  void *p = cls >= kRegisterAbove ? map_and_register(cls) : nullptr;
  if (p && zeroed) *zeroed = true;  // map_and_register wrote zeros over it
  cudaError_t err = p ? cudaSuccess : cudaHostAlloc(&p, cls, cudaHostAllocPortable);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    drain(c, free_pinned_block);
    err = cudaHostAlloc(&p, cls, cudaHostAllocPortable);
  }
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    throw Error(TSR_ERR_NO_MEMORY, "CUDA: cannot allocate " + std::to_string(bytes) +
                                       " bytes of pinned host memory (" + format_bytes(bytes) +
                                       "; " + format_bytes(c.reserved - c.cached) + " in use, " +
                                       format_bytes(c.cached) + " cached)");
  }
  TSR_CUDA_CHECK(err);
  c.live.emplace(p, cls);
  c.reserved += cls;
  return p;
}

void pinned_free(void *p) {
  if (!p) return;
  Cache &c = pinned_cache();
  std::lock_guard<std::mutex> lk(c.mu);
  auto it = c.live.find(p);
  if (it == c.live.end()) {
    spdlog::error("CUDA: pinned_free({}) of a block the allocator does not hold (double free?)", p);
    return;
  }
  const size_t cls = it->second;
  c.live.erase(it);
  c.blocks[cls].push_back(p);
  c.cached += cls;
}

}  // namespace tessera::cuda
