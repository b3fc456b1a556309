// What the CUDA steps of the optimizer plugins share (sgd_cuda.cu,
// adam_cuda.cu): checks that the step can run on the GPU at all, the
// segment table turned into a kernel parameter, loads and stores of every
// dtype, and the kernel that walks the partition calling the optimizer's
// per-element update. Header-only and plugin-private: each plugin library
// compiles its own copy and stands alone.
//
// One call is one launch (per kMaxRuns decay runs, see below) over all n
// elements, whatever the number of tensors behind them:
//  - each thread takes groups of 4 consecutive elements, grid-stride; when
//    every array is 16-byte aligned at the same element (the usual case:
//    allocations are 256-byte aligned and offsets multiples of 4) the group
//    is one 128-bit load or store per fp32 array and one 64-bit one per
//    16-bit array; otherwise the same groups use scalar accesses;
//  - the up to 3 elements before the first aligned group and after the last
//    are done one per thread by the first threads of the grid;
//  - the segments' decay flags travel in the launch itself, as a sorted
//    table of runs in a __grid_constant__ parameter, read through the
//    constant cache: no device allocation, no copy, nothing that a later
//    call on another stream could overwrite while this one is in flight.
//    A group finds its run through a coarse index of 1024 buckets and a
//    binary search among the bucket's runs (the 32 threads of a warp look
//    at the same entries, a broadcast), then walks forward within its 4.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <tessera/cpp/optimizer.hpp>
#include <tessera/cpp/plugin.hpp>
#include <vector>

namespace tessera::optim_cuda {

using sdk::Error;
using sdk::optim::Elem;
using sdk::optim::fmt;

// ---------------------------------------------------------------------------
// The decay runs. An element's kind: 0 outside every segment (left alone,
// as the CPU step leaves it), 1 in a segment without decay, 2 with decay.

constexpr uint32_t kKindGap = 0, kKindPlain = 1, kKindDecay = 2;

// Up to 3072 runs per launch: 24 KiB, inside the 32 KiB a kernel's
// parameters may take (CUDA 12.1+, Volta+). A partition alternates decay
// (weights) and no decay (biases, norms) about twice per tensor, so one
// launch covers ~1500 tensors; more take one launch per 3072 runs.
constexpr uint32_t kMaxRuns = 3072;
// A coarse index over the launch's elements, so that finding a run is a
// lookup and a search among the few runs of one bucket rather than a
// binary search over all of them (with ~2000 runs the full search cost 15%
// of the bandwidth on an H200).
constexpr uint32_t kBuckets = 1024;

struct RunTable {
  // (first element << 2) | kind, ascending; elements counted from the
  // launch's first element, so run[0] starts at 0.
  uint64_t run[kMaxRuns];
  // bucket[b]: the run holding element min(b << shift, n - 1), b in
  // [0, kBuckets]; the run of element e lies in [bucket[b], bucket[b + 1]]
  // for b = e >> shift.
  uint16_t bucket[kBuckets + 1];
  uint32_t shift;
  uint32_t count;
};

struct Run {
  size_t start;
  uint32_t kind;
};

// Segments -> maximal runs of one kind covering [first segment, last end),
// with the gaps between segments as kGap runs. Segments may come in any
// order (sorted here when they are not) but must not overlap: the CPU step
// would update an element twice, which is never what the engine means.
inline std::vector<Run> decay_runs(const tsr_optimizer_step_args *args, const char *who,
                                   size_t *end) {
  std::vector<tsr_segment> segs;
  segs.reserve(args->num_segments);
  for (size_t k = 0; k < args->num_segments; ++k)
    if (args->segments[k].count > 0) segs.push_back(args->segments[k]);
  auto by_offset = [](const tsr_segment &a, const tsr_segment &b) { return a.offset < b.offset; };
  if (!std::is_sorted(segs.begin(), segs.end(), by_offset))
    std::stable_sort(segs.begin(), segs.end(), by_offset);
  std::vector<Run> runs;
  size_t at = segs.empty() ? 0 : segs.front().offset;
  for (const tsr_segment &s : segs) {
    if (s.offset < at)
      throw Error(TSR_ERR_INVALID,
                  fmt("%s: segments overlap at element %zu (segment [%zu, %zu + %zu)); the CUDA "
                      "step needs disjoint segments",
                      who, s.offset, s.offset, s.offset, s.count));
    if (s.offset > at) runs.push_back({at, kKindGap});
    const uint32_t kind = s.decay ? kKindDecay : kKindPlain;
    if (runs.empty() || runs.back().kind != kind) runs.push_back({s.offset, kind});
    at = s.offset + s.count;
  }
  *end = at;
  return runs;
}

// ---------------------------------------------------------------------------
// Device-side element access. Groups of 4 read and write each array with
// one vector access when `vec` (the launch checked the alignment), else
// with 4 scalar ones.

__device__ __forceinline__ float bf16_bits_to_float(uint32_t h) {
  return __uint_as_float(h << 16);
}
__device__ __forceinline__ float f16_bits_to_float(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}

// fp32 -> bf16, round to nearest even: the same bit arithmetic as the CPU
// step's sdk::float_to_bf16 (tessera/cpp/half.hpp), NaN handling included,
// so the copies agree bit for bit.
__device__ __forceinline__ uint32_t float_to_bf16_bits(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x0040u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}
// fp32 -> fp16: the hardware conversion rounds to nearest even with
// subnormals and overflow to infinity, as sdk::float_to_f16 does;
// NaN is made the CPU's quiet NaN (0x7e00 with the sign) so that the copies
// agree bit for bit there too.
__device__ __forceinline__ uint32_t float_to_f16_bits(float x) {
  if (isnan(x)) return ((__float_as_uint(x) >> 16) & 0x8000u) | 0x7e00u;
  return __half_as_ushort(__float2half_rn(x));
}

template <Elem E>
__device__ __forceinline__ float load1(const void *base, size_t i) {
  if constexpr (E == Elem::f32) return static_cast<const float *>(base)[i];
  if constexpr (E == Elem::bf16) return bf16_bits_to_float(static_cast<const uint16_t *>(base)[i]);
  if constexpr (E == Elem::f16) return f16_bits_to_float(static_cast<const uint16_t *>(base)[i]);
  return 0.0f;
}

template <Elem E>
__device__ __forceinline__ void load4(const void *base, size_t i, bool vec, float (&x)[4]) {
  if constexpr (E == Elem::f32) {
    if (vec) {
      const float4 v = *reinterpret_cast<const float4 *>(static_cast<const float *>(base) + i);
      x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
      return;
    }
  } else {
    if (vec) {
      const uint2 v = *reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(base) + i);
      const uint32_t h[4] = {v.x & 0xffffu, v.x >> 16, v.y & 0xffffu, v.y >> 16};
#pragma unroll
      for (int j = 0; j < 4; ++j)
        x[j] = E == Elem::bf16 ? bf16_bits_to_float(h[j]) : f16_bits_to_float(h[j]);
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) x[j] = load1<E>(base, i + j);
}

template <Elem E>
__device__ __forceinline__ void store1(void *base, size_t i, float x) {
  if constexpr (E == Elem::f32) static_cast<float *>(base)[i] = x;
  if constexpr (E == Elem::bf16)
    static_cast<uint16_t *>(base)[i] = static_cast<uint16_t>(float_to_bf16_bits(x));
  if constexpr (E == Elem::f16)
    static_cast<uint16_t *>(base)[i] = static_cast<uint16_t>(float_to_f16_bits(x));
}

template <Elem E>
__device__ __forceinline__ void store4(void *base, size_t i, bool vec, const float (&x)[4]) {
  if constexpr (E == Elem::none) {
    return;
  } else if constexpr (E == Elem::f32) {
    if (vec) {
      *reinterpret_cast<float4 *>(static_cast<float *>(base) + i) =
          make_float4(x[0], x[1], x[2], x[3]);
      return;
    }
  } else {
    if (vec) {
      uint32_t h[4];
#pragma unroll
      for (int j = 0; j < 4; ++j)
        h[j] = E == Elem::bf16 ? float_to_bf16_bits(x[j]) : float_to_f16_bits(x[j]);
      *reinterpret_cast<uint2 *>(static_cast<uint16_t *>(base) + i) =
          make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
      return;
    }
  }
  if constexpr (E != Elem::none) {
#pragma unroll
    for (int j = 0; j < 4; ++j) store1<E>(base, i + j, x[j]);
  }
}

// ---------------------------------------------------------------------------
// The kernel.

// One launch's arrays, already offset to its first element, and its shape:
// elements [0, head) and [body_end, n) one per thread, [head, body_end) in
// groups of 4.
struct Arrays {
  float *p;
  const void *g;
  float *s0;  // state arrays (NULL past nstates)
  float *s1;
  void *out;  // compute copy (NULL when none)
  size_t n, head, body_end;
  uint32_t nstates;
  bool vec;
};

// The run holding element e: the last r with start(r) <= e (start(0) = 0),
// searched for among the runs of e's bucket.
__device__ __forceinline__ uint32_t find_run(const RunTable &t, size_t e) {
  const size_t b = e >> t.shift;
  uint32_t lo = t.bucket[b], hi = t.bucket[b + 1] + 1u;
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if ((t.run[mid] >> 2) <= e)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// One element, scalar accesses. Op::operator()(p, grad, s0, s1, decay)
// returns the new p and updates the state it uses.
template <Elem G, Elem O, class Op>
__device__ __forceinline__ void step_one(const Arrays &a, const Op &op, size_t e, uint32_t kind) {
  if (kind == kKindGap) return;
  float s0 = a.nstates > 0 ? a.s0[e] : 0.0f;
  float s1 = a.nstates > 1 ? a.s1[e] : 0.0f;
  const float p = op(a.p[e], load1<G>(a.g, e), s0, s1, kind == kKindDecay);
  a.p[e] = p;
  if (a.nstates > 0) a.s0[e] = s0;
  if (a.nstates > 1) a.s1[e] = s1;
  if constexpr (O != Elem::none) store1<O>(a.out, e, p);
}

template <class Op, Elem G, Elem O>
__global__ void __launch_bounds__(256)
    step_kernel(const Arrays a, const Op op, const __grid_constant__ RunTable runs) {
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t nthreads = static_cast<size_t>(gridDim.x) * blockDim.x;

  // The ragged ends: at most 3 elements each.
  if (tid < a.head) step_one<G, O>(a, op, tid, runs.run[find_run(runs, tid)] & 3u);
  if (tid < a.n - a.body_end) {
    const size_t e = a.body_end + tid;
    step_one<G, O>(a, op, e, runs.run[find_run(runs, e)] & 3u);
  }

  const size_t groups = (a.body_end - a.head) / 4;
  for (size_t q = tid; q < groups; q += nthreads) {
    const size_t e = a.head + 4 * q;
    // Loads first: they do not depend on the run lookup below, so they are
    // in flight while it runs.
    float p[4], g[4], s0[4] = {0, 0, 0, 0}, s1[4] = {0, 0, 0, 0};
    load4<Elem::f32>(a.p, e, a.vec, p);
    load4<G>(a.g, e, a.vec, g);
    if (a.nstates > 0) load4<Elem::f32>(a.s0, e, a.vec, s0);
    if (a.nstates > 1) load4<Elem::f32>(a.s1, e, a.vec, s1);

    uint32_t kind[4];
    uint32_t r = runs.count == 1 ? 0 : find_run(runs, e);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      while (r + 1 < runs.count && (runs.run[r + 1] >> 2) <= e + j) ++r;
      kind[j] = static_cast<uint32_t>(runs.run[r] & 3u);
    }

    if (kind[0] != kKindGap && kind[1] != kKindGap && kind[2] != kKindGap && kind[3] != kKindGap) {
#pragma unroll
      for (int j = 0; j < 4; ++j) p[j] = op(p[j], g[j], s0[j], s1[j], kind[j] == kKindDecay);
      store4<Elem::f32>(a.p, e, a.vec, p);
      if (a.nstates > 0) store4<Elem::f32>(a.s0, e, a.vec, s0);
      if (a.nstates > 1) store4<Elem::f32>(a.s1, e, a.vec, s1);
      store4<O>(a.out, e, a.vec, p);
    } else {
      // A group touching a gap between segments (rare: the engine's
      // segments cover the partition) writes only its covered elements.
#pragma unroll
      for (int j = 0; j < 4; ++j) step_one<G, O>(a, op, e + j, kind[j]);
    }
  }
}

// ---------------------------------------------------------------------------
// Host side: checks, the device guard, and the launches.

inline const char *cuda_error(cudaError_t e) {
  return cudaGetErrorString(e);
}

// Runs the step on args->device.device_id and puts the caller's current
// device back afterwards.
class DeviceGuard {
 public:
  DeviceGuard(int device, const char *who) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      (void)cudaGetLastError();  // not sticky: do not leave it for the next caller
      throw Error(TSR_ERR_UNSUPPORTED,
                  fmt("%s: a CUDA step was asked for, but no CUDA device is usable: %s", who,
                      e != cudaSuccess ? cuda_error(e) : "no device"));
    }
    if (device < 0 || device >= count)
      throw Error(TSR_ERR_INVALID,
                  fmt("%s: CUDA device %d does not exist (%d visible)", who, device, count));
    e = cudaGetDevice(&prev_);
    if (e != cudaSuccess)
      throw Error(TSR_ERR_INTERNAL, fmt("%s: cudaGetDevice failed: %s", who, cuda_error(e)));
    if (prev_ != device) {
      e = cudaSetDevice(device);
      if (e != cudaSuccess)
        throw Error(TSR_ERR_INTERNAL,
                    fmt("%s: cudaSetDevice(%d) failed: %s", who, device, cuda_error(e)));
    }
  }
  ~DeviceGuard() {
    int now = prev_;
    if (cudaGetDevice(&now) == cudaSuccess && now != prev_) (void)cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard &) = delete;
  DeviceGuard &operator=(const DeviceGuard &) = delete;

 private:
  int prev_ = 0;
};

// A kernel dereferencing plain host memory faults and takes the whole CUDA
// context down with it (every later call fails): refuse such pointers here,
// with their name, instead. Device memory must be on the step's device;
// managed and pinned host memory are reachable from any device.
inline void check_reachable(const void *ptr, const char *what, int device, const char *who) {
  cudaPointerAttributes at{};
  cudaError_t e = cudaPointerGetAttributes(&at, ptr);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(TSR_ERR_INVALID,
                fmt("%s: cannot tell where %s (%p) lives: %s", who, what, ptr, cuda_error(e)));
  }
  switch (at.type) {
    case cudaMemoryTypeDevice:
      if (at.device != device)
        throw Error(TSR_ERR_INVALID,
                    fmt("%s: %s (%p) is memory of CUDA device %d, but the step runs on device %d",
                        who, what, ptr, at.device, device));
      return;
    case cudaMemoryTypeManaged:
    case cudaMemoryTypeHost:
      return;
    default:
      throw Error(TSR_ERR_INVALID,
                  fmt("%s: %s (%p) is not memory a CUDA kernel can reach (plain host memory?); a "
                      "CUDA step needs device, managed or pinned memory",
                      who, what, ptr));
  }
}

// The stream of this step: the caller's, else the host's compute stream
// (ABI 1.1), else the legacy default stream.
inline cudaStream_t step_stream(const tsr_host *host, const tsr_optimizer_step_args *args) {
  if (args->stream) return static_cast<cudaStream_t>(args->stream);
  if (TSR_HAS_FIELD(host, tsr_host, compute_stream))
    return static_cast<cudaStream_t>(host->compute_stream);
  return nullptr;
}

inline bool aligned(const void *p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

template <Elem G, Elem O, class Op>
void launch_one(const Arrays &a, const Op &op, const RunTable &runs, cudaStream_t stream,
                int device, const char *who) {
  constexpr int kThreads = 256;
  auto kernel = step_kernel<Op, G, O>;
  // One full wave of resident blocks; the grid-stride loop does the rest.
  int sms = 0, per_sm = 0;
  cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess)
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
  if (e != cudaSuccess)
    throw Error(TSR_ERR_INTERNAL, fmt("%s: querying device %d for the launch failed: %s", who,
                                      device, cuda_error(e)));
  const size_t groups = (a.body_end - a.head) / 4;
  const size_t wave = static_cast<size_t>(std::max(sms, 1)) * std::max(per_sm, 1);
  const size_t blocks = std::clamp<size_t>((groups + kThreads - 1) / kThreads, 1, wave);

  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  e = cudaLaunchKernelEx(&cfg, kernel, a, op, runs);
  if (e != cudaSuccess)
    throw Error(TSR_ERR_INTERNAL,
                fmt("%s: launching the update kernel (%zu elements, %zu blocks, %u runs, device "
                    "%d) failed: %s",
                    who, a.n, blocks, runs.count, device, cuda_error(e)));
}

template <Elem G, class Op>
void launch_out(Elem out, const Arrays &a, const Op &op, const RunTable &runs, cudaStream_t stream,
                int device, const char *who) {
  switch (out) {
    case Elem::f32:
      return launch_one<G, Elem::f32>(a, op, runs, stream, device, who);
    case Elem::bf16:
      return launch_one<G, Elem::bf16>(a, op, runs, stream, device, who);
    case Elem::f16:
      return launch_one<G, Elem::f16>(a, op, runs, stream, device, who);
    default:
      return launch_one<G, Elem::none>(a, op, runs, stream, device, who);
  }
}

// The whole CUDA step: `nstates` fp32 state arrays (0, 1 or 2), and `op`
// the per-element update (see step_one). Arguments already passed
// sdk::optim::check_step_args.
template <class Op>
void run_step(const tsr_host *host, const tsr_optimizer_step_args *args, uint32_t nstates,
              const Op &op, const char *who) {
  const Elem gdt = sdk::optim::grads_elem(args, who);
  const Elem odt = sdk::optim::compute_elem(args, who);
  const int device = args->device.device_id;
  DeviceGuard guard(device, who);
  if (args->n == 0) return;

  check_reachable(args->params, "params", device, who);
  check_reachable(args->grads, "grads", device, who);
  if (nstates > 0) check_reachable(args->state[0], "state array 0", device, who);
  if (nstates > 1) check_reachable(args->state[1], "state array 1", device, who);
  if (odt != Elem::none) check_reachable(args->compute_params, "compute_params", device, who);

  size_t end = 0;
  const std::vector<Run> runs = decay_runs(args, who, &end);
  if (runs.empty()) return;
  const cudaStream_t stream = step_stream(host, args);
  const size_t gsize = gdt == Elem::f32 ? 4 : 2;
  const size_t osize = odt == Elem::f32 ? 4 : 2;
  auto table = std::make_unique<RunTable>();  // 26 KiB: not on the stack

  for (size_t first = 0; first < runs.size(); first += kMaxRuns) {
    const size_t last = std::min(runs.size(), first + kMaxRuns);  // one past
    const size_t lo = runs[first].start;
    const size_t hi = last < runs.size() ? runs[last].start : end;
    table->count = static_cast<uint32_t>(last - first);
    for (size_t r = first; r < last; ++r)
      table->run[r - first] = (static_cast<uint64_t>(runs[r].start - lo) << 2) | runs[r].kind;
    // The coarse index: the smallest shift that puts every element in one
    // of kBuckets buckets, then each bucket's first run by a merge walk.
    table->shift = 0;
    while (((hi - lo - 1) >> table->shift) >= kBuckets) ++table->shift;
    for (uint32_t b = 0, r = 0; b <= kBuckets; ++b) {
      const size_t e = std::min((static_cast<size_t>(b) << table->shift), hi - lo - 1);
      while (r + 1 < table->count && (table->run[r + 1] >> 2) <= e) ++r;
      table->bucket[b] = static_cast<uint16_t>(r);
    }

    Arrays a{};
    a.p = args->params + lo;
    a.g = static_cast<const char *>(static_cast<const void *>(args->grads)) + lo * gsize;
    a.s0 = nstates > 0 ? args->state[0] + lo : nullptr;
    a.s1 = nstates > 1 ? args->state[1] + lo : nullptr;
    a.out = odt != Elem::none ? static_cast<char *>(args->compute_params) + lo * osize : nullptr;
    a.n = hi - lo;
    a.nstates = nstates;
    // Vector groups start where params is 16-byte aligned; every other
    // array must then be aligned for its own vector width at that element.
    a.head = 0;
    a.vec = false;
    if (aligned(a.p, 4)) {
      const size_t head = std::min(a.n, ((16 - reinterpret_cast<uintptr_t>(a.p) % 16) % 16) / 4);
      bool ok = aligned(static_cast<const char *>(a.g) + head * gsize, 4 * gsize);
      if (a.s0) ok = ok && aligned(a.s0 + head, 16);
      if (a.s1) ok = ok && aligned(a.s1 + head, 16);
      if (a.out) ok = ok && aligned(static_cast<const char *>(a.out) + head * osize, 4 * osize);
      if (ok) a.head = head, a.vec = true;
    }
    a.body_end = a.head + (a.n - a.head) / 4 * 4;

    switch (gdt) {
      case Elem::bf16:
        launch_out<Elem::bf16>(odt, a, op, *table, stream, device, who);
        break;
      case Elem::f16:
        launch_out<Elem::f16>(odt, a, op, *table, stream, device, who);
        break;
      default:
        launch_out<Elem::f32>(odt, a, op, *table, stream, device, who);
        break;
    }
  }
}

}  // namespace tessera::optim_cuda
