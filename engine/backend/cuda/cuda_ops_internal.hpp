// Private to the CUDA ops: the tensor checks and dtype dispatch shared by
// ops_table.cpp, ops_matmul.cpp and the .cu files, process-wide scratch
// memory, the device-side load/store helpers, and the entries each file
// contributes to the table. The checks live in ops_table.cpp (host code).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlpack/dlpack.h>
#include <tessera/ops.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "backend/cuda/device.hpp"
#include "util/error.hpp"

namespace tessera::cuda {

// ---------------------------------------------------------------------------
// Tensors

// The element types the CUDA ops take. Floating tensors are F32/BF16/F16;
// ids and targets are I32.
enum class DType : int8_t { F32, BF16, F16, I32 };

const char *dtype_name(DType t);
inline size_t dtype_size(DType t) {
  return t == DType::BF16 || t == DType::F16 ? 2 : 4;
}

// A checked compact tensor viewed as a row-major matrix: rows = product of
// every dim but the last, cols = the last dim (a 0-D tensor is 1x1). p
// already includes byte_offset.
struct View {
  void *p;
  int64_t rows;
  int64_t cols;
  DType dt;
  int64_t numel() const { return rows * cols; }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dt); }
  template <typename T>
  T *as() const {
    return static_cast<T *>(p);
  }
};

// "bfloat16[4,8]", for messages.
std::string describe(const DLTensor *t);

// Where a call runs: Host when every non-NULL tensor argument is in host
// memory (kDLCPU or kDLCUDAHost), Device when every one is kDLCUDA on the
// selected GPU. Anything else (a mix, another device type, another GPU)
// throws, naming the op and the odd argument.
enum class Side { Host, Device };
struct Arg {
  const char *name;
  const DLTensor *t;
};
Side side_of(const char *op, std::initializer_list<Arg> args);

// Checks that t is a non-NULL compact kDLCUDA tensor with data, aligned to
// its element size, of one of the dtypes above, and returns its view;
// throws tessera::Error naming `op` and `arg` otherwise. `min_ndim` rejects
// tensors of fewer dims. floating() also requires F32/BF16/F16, f32() and
// i32() exactly that dtype.
View any_view(const char *op, const char *arg, const DLTensor *t, int min_ndim = 0);
View floating(const char *op, const char *arg, const DLTensor *t, int min_ndim = 0);
View f32(const char *op, const char *arg, const DLTensor *t, int min_ndim = 0);
View i32(const char *op, const char *arg, const DLTensor *t, int min_ndim = 0);

// Throws unless the two tensors hold the same number of elements / dtype.
void check_same_numel(const char *op, const char *a_name, const DLTensor *a, const View &va,
                      const char *b_name, const DLTensor *b, const View &vb);
void check_same_dtype(const char *op, const char *a_name, const DLTensor *a, const View &va,
                      const char *b_name, const DLTensor *b, const View &vb);
// Throws unless act is one of TSR_ACT_*.
void check_activation(const char *op, tsr_activation act);

// Forwarding to the CPU ops, which take kDLCPU only: a copy of the tensor
// header marked kDLCPU (pinned memory is host memory all the same). NULL
// stays NULL.
struct AsCpu {
  DLTensor t;
  const DLTensor *p;
  explicit AsCpu(const DLTensor *in) : t(in ? *in : DLTensor{}), p(in ? &t : nullptr) {
    if (in) t.device = DLDevice{kDLCPU, 0};
  }
  DLTensor *mut() { return const_cast<DLTensor *>(p); }
};
// Throws ReportedError when a forwarded call failed: the CPU op has already
// recorded its message with the host.
inline void host_result(tsr_status s) {
  if (s != TSR_OK) throw ReportedError(s);
}
// The CPU op `name` of the table, or a throw when the CPU table lacks it.
template <typename Fn>
Fn need_cpu(Fn fn, const char *op) {
  TSR_CHECK(fn != nullptr, TSR_ERR_UNSUPPORTED,
            std::string(op) + ": host-memory tensors need the CPU ops' " + op +
                ", which this build's CPU table lacks");
  return fn;
}

// ---------------------------------------------------------------------------
// Device state

// Multiprocessors of the selected GPU, read once.
int sm_count();

// Process-wide device scratch: one buffer per slot, grown on demand and kept,
// so the hot path allocates nothing after the first calls. Only ops on the
// compute stream use them, which orders every reuse after the last use.
enum class Slot : int { Partials, Rows, Flags, SortA, SortB, Temp, kCount };
void *scratch(Slot slot, size_t bytes);

// A "lowest bad row" flag (cross_entropy's targets, the embedding ops' ids):
// memset to 0x7f, then atomicMin'd by every row that fails a check, so it
// still holds this pattern when none did.
constexpr long long kNoBadRow = 0x7f7f7f7f7f7f7f7fLL;  // memset(0x7f) pattern

// Copies `bytes` (<= 4 KiB) of device memory to host memory `dst` through a
// pinned staging block and waits for it: for results the caller reads now.
void read_back(void *dst, const void *src, size_t bytes);

inline void check_launch() {
  TSR_CUDA_CHECK(cudaGetLastError());
}

// Blocks for a grid-stride loop over `work` items with `threads` threads a
// block: enough to fill the GPU a few times over, at least 1.
inline unsigned grid_for(int64_t work, int threads) {
  const int64_t want = (work + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(sm_count()) * 8;
  return static_cast<unsigned>(want < 1 ? 1 : (want > cap ? cap : want));
}

// True when p is 16-byte aligned (a pack may start there).
inline bool aligned16(const void *p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Runs f(T{}) with T the C++ type of a floating dtype.
template <typename F>
void dispatch_float(DType dt, F &&f) {
  switch (dt) {
    case DType::F32:
      f(float{});
      break;
    case DType::BF16:
      f(__nv_bfloat16{});
      break;
    case DType::F16:
      f(__half{});
      break;
    default:
      throw Error(TSR_ERR_INTERNAL, "dispatch_float: not a floating dtype");
  }
}

// ---------------------------------------------------------------------------
// Device helpers: conversions and 8-element packs moved with 128-bit
// accesses (two for float32). A pack needs its pointer 16-byte aligned.
#ifdef __CUDACC__
constexpr int kPack = 8;

__device__ __forceinline__ float to_f(float x) {
  return x;
}
__device__ __forceinline__ float to_f(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float to_f(__half x) {
  return __half2float(x);
}

template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_f<__half>(float x) {
  return __float2half_rn(x);
}

template <typename T>
__device__ __forceinline__ void load8(const T *p, float (&v)[kPack]) {
  if constexpr (sizeof(T) == 4) {
    const float4 a = reinterpret_cast<const float4 *>(p)[0];
    const float4 b = reinterpret_cast<const float4 *>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    const uint4 raw = *reinterpret_cast<const uint4 *>(p);
    const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
    for (int i = 0; i < kPack; i++) v[i] = to_f(e[i]);
  }
}

template <typename T>
__device__ __forceinline__ void store8(T *p, const float (&v)[kPack]) {
  if constexpr (sizeof(T) == 4) {
    reinterpret_cast<float4 *>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4 *>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    uint4 raw;
    T *e = reinterpret_cast<T *>(&raw);
#pragma unroll
    for (int i = 0; i < kPack; i++) e[i] = from_f<T>(v[i]);
    *reinterpret_cast<uint4 *>(p) = raw;
  }
}

// Sums over a warp by butterfly: every lane gets the same value, and the
// order of additions is fixed, so results repeat bit for bit.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sums over the block (blockDim.x a multiple of 32, at most 1024) in a fixed
// order; every thread gets the total. `shared` holds 32 elements.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T *shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : T(0);
  return warp_sum(v);
}

__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t global_threads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// y[i] = f(x[i], y[i]) over n elements, 8 at a time through packs where
// x and y are 16-byte aligned (`packs` = n / 8 then, else 0), the tail one
// by one. kReadX / kReadY skip loads f does not need (f gets 0 there).
template <typename Tx, typename Ty, bool kReadX, bool kReadY, typename F>
__global__ void map_kernel(const Tx *x, Ty *y, int64_t n, int64_t packs, F f) {
  for (int64_t p = global_thread(); p < packs; p += global_threads()) {
    float xv[kPack] = {}, yv[kPack] = {};
    if constexpr (kReadX) load8(x + p * kPack, xv);
    if constexpr (kReadY) load8(y + p * kPack, yv);
#pragma unroll
    for (int j = 0; j < kPack; j++) yv[j] = f(xv[j], yv[j]);
    store8(y + p * kPack, yv);
  }
  for (int64_t i = packs * kPack + global_thread(); i < n; i += global_threads()) {
    const float xv = kReadX ? to_f(x[i]) : 0.0f, yv = kReadY ? to_f(y[i]) : 0.0f;
    y[i] = from_f<Ty>(f(xv, yv));
  }
}

template <typename Tx, typename Ty, bool kReadX, bool kReadY, typename F>
void launch_map(const Tx *x, Ty *y, int64_t n, F f) {
  if (n == 0) return;
  const bool vec = (!kReadX || aligned16(x)) && aligned16(y);
  const int64_t packs = vec ? n / kPack : 0;
  constexpr int kThreads = 256;
  const unsigned grid = grid_for(packs > 0 ? packs : n, kThreads);
  map_kernel<Tx, Ty, kReadX, kReadY><<<grid, kThreads, 0, compute_stream()>>>(x, y, n, packs, f);
  check_launch();
}
#endif  // __CUDACC__

// ---------------------------------------------------------------------------
// Entries. ops_matmul.cpp:
tsr_status matmul(tsr_host_ctx *ctx, const DLTensor *a, int32_t trans_a, const DLTensor *b,
                  int32_t trans_b, DLTensor *c, float alpha, float beta) noexcept;
tsr_status linear(tsr_host_ctx *ctx, const DLTensor *a, int32_t trans_a, const DLTensor *b,
                  int32_t trans_b, const DLTensor *bias, tsr_activation act, DLTensor *c,
                  DLTensor *pre) noexcept;

// ops_elementwise.cu:
tsr_status fill(tsr_host_ctx *ctx, DLTensor *x, float value) noexcept;
tsr_status copy(tsr_host_ctx *ctx, const DLTensor *src, DLTensor *dst) noexcept;
tsr_status cast(tsr_host_ctx *ctx, const DLTensor *x, DLTensor *y) noexcept;
tsr_status axpy(tsr_host_ctx *ctx, float alpha, const DLTensor *x, DLTensor *y) noexcept;
tsr_status scale(tsr_host_ctx *ctx, float alpha, DLTensor *y) noexcept;
tsr_status sum_squares(tsr_host_ctx *ctx, const DLTensor *x, double *out) noexcept;

// ops_activation.cu:
tsr_status bias_act(tsr_host_ctx *ctx, DLTensor *y, const DLTensor *bias,
                    tsr_activation act) noexcept;
tsr_status bias_grad(tsr_host_ctx *ctx, const DLTensor *dy, DLTensor *dbias) noexcept;
tsr_status act_forward(tsr_host_ctx *ctx, tsr_activation act, const DLTensor *x,
                       DLTensor *y) noexcept;
tsr_status act_backward(tsr_host_ctx *ctx, tsr_activation act, const DLTensor *x,
                        int32_t from_output, const DLTensor *dy, DLTensor *dx) noexcept;

// ops_cross_entropy.cu:
tsr_status cross_entropy(tsr_host_ctx *ctx, const DLTensor *logits, const DLTensor *targets,
                         int64_t valid_classes, float grad_scale, DLTensor *dlogits,
                         double *loss_sum, int64_t *count, int64_t *correct) noexcept;

// ops_matmul_grad.cpp (ABI 1.3):
tsr_status matmul_bias_grad(tsr_host_ctx *ctx, const DLTensor *a, int32_t trans_a,
                            const DLTensor *b, int32_t trans_b, DLTensor *c, float alpha,
                            float beta, DLTensor *dbias) noexcept;
tsr_status matmul_act_backward(tsr_host_ctx *ctx, const DLTensor *a, int32_t trans_a,
                               const DLTensor *b, int32_t trans_b, tsr_activation act,
                               const DLTensor *pre, DLTensor *c, DLTensor *dbias) noexcept;

// ops_layernorm.cu (add_layernorm_forward: ABI 1.3):
tsr_status add_layernorm_forward(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *y,
                                 const DLTensor *weight, const DLTensor *bias, float eps,
                                 DLTensor *r, DLTensor *out, DLTensor *mean,
                                 DLTensor *rstd) noexcept;
tsr_status layernorm_forward(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *weight,
                             const DLTensor *bias, float eps, DLTensor *y, DLTensor *mean,
                             DLTensor *rstd) noexcept;
tsr_status layernorm_backward(tsr_host_ctx *ctx, const DLTensor *dy, const DLTensor *x,
                              const DLTensor *weight, const DLTensor *mean, const DLTensor *rstd,
                              DLTensor *dx, DLTensor *dweight, DLTensor *dbias) noexcept;
tsr_status layernorm_backward_sum(tsr_host_ctx *ctx, const DLTensor *dy, const DLTensor *x,
                                  const DLTensor *weight, const DLTensor *mean,
                                  const DLTensor *rstd, DLTensor *dx, DLTensor *dweight,
                                  DLTensor *dbias, DLTensor *dsum) noexcept;

// ops_embedding.cu:
tsr_status embedding_forward(tsr_host_ctx *ctx, const DLTensor *ids, const DLTensor *table,
                             DLTensor *out, int32_t accumulate) noexcept;
tsr_status embedding_backward(tsr_host_ctx *ctx, const DLTensor *ids, const DLTensor *dout,
                              DLTensor *dtable) noexcept;

// Device-side pieces other files reuse (ops_activation.cu), all on the
// compute stream with checked views: y = act(x) element-wise (x may be y),
// y[r, :] = act(y[r, :] + bias[:]) (bias may be NULL), dx = dy * act'(x)
// (dx may be dy; act_backward's rules), and dbias[:] += scale * the column
// sums of dy (bias_grad's deterministic two passes).
void launch_act_forward(tsr_activation act, const View &x, const View &y);
void launch_bias_act(const View &y, const View *bias, tsr_activation act);
void launch_act_backward(tsr_activation act, int32_t from_output, const View &x, const View &dy,
                         const View &dx);
void launch_bias_grad(const View &dy, const View &dbias, float scale);
// Both at once over [rows, cols] x and dy: dx = dy * act'(x) (dx may be
// dy) and dbias[:] += the column sums of dx, in one pass where rows are
// packs of 8 (else the two launches above).
void launch_act_backward_bias_grad(tsr_activation act, const View &x, const View &dy,
                                   const View &dx, const View &dbias);
// y *= alpha, and y += alpha * x with any two float dtypes
// (ops_elementwise.cu).
void launch_scale(const View &y, float alpha);
void launch_axpy(float alpha, const View &x, const View &y);

// attention_select.cpp: the table's entries. bf16/fp16 run through cuDNN's
// fused flash attention where cuDNN is present and takes the call, through
// the engine's kernels otherwise; TESSERA_ATTENTION=auto|native|cudnn
// overrides (docs/gpu.md).
tsr_status attention_forward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                             const DLTensor *v, float scale, DLTensor *out, DLTensor *lse) noexcept;
tsr_status attention_backward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                              const DLTensor *v, const DLTensor *out, const DLTensor *dout,
                              const DLTensor *lse, float scale, DLTensor *dq, DLTensor *dk,
                              DLTensor *dv) noexcept;
// The same with the implementation given rather than read from the
// environment (tests, benchmarks): Native runs the engine's kernels, Cudnn
// runs cuDNN for bf16/fp16 and fails with TSR_ERR_UNSUPPORTED, naming the
// reason, where cuDNN cannot take the call, Auto falls back silently.
enum class AttnImpl { Auto, Native, Cudnn };
tsr_status attention_forward_with(AttnImpl impl, tsr_host_ctx *ctx, const DLTensor *q,
                                  const DLTensor *k, const DLTensor *v, float scale, DLTensor *out,
                                  DLTensor *lse) noexcept;
tsr_status attention_backward_with(AttnImpl impl, tsr_host_ctx *ctx, const DLTensor *q,
                                   const DLTensor *k, const DLTensor *v, const DLTensor *out,
                                   const DLTensor *dout, const DLTensor *lse, float scale,
                                   DLTensor *dq, DLTensor *dk, DLTensor *dv) noexcept;
// The implementation TESSERA_ATTENTION asks for (logged once a process),
// and, after cuDNN declined a call, the error (impl = Cudnn) or the log
// line once per shape (Auto) that says so: for attention_gqa.cpp.
AttnImpl attention_env_impl();
void attention_declined(AttnImpl impl, const char *op, const std::string &shape,
                        const std::string &why);
// True when cuDNN can serve attention in this process; *what names the
// library ("cuDNN 9.19.0 (libcudnn.so.9)") or why it cannot.
bool attention_cudnn_available(std::string *what);

// attention_forward.cu / attention_backward.cu: the engine's flash kernels.
// `positions` (device int32 [B, T], checked by the caller), when not NULL,
// masks each query to its document window (ABI 1.8 attention_packed_*).
// With kv_group > 1, k and v hold q's heads / kv_group heads and query head
// h reads key/value head h / kv_group (grouped-query attention, read in
// place); backward's dk and dv still have q's heads, one per query head,
// for the caller to sum over each group.
tsr_status attention_forward_native(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                    const DLTensor *v, float scale, DLTensor *out, DLTensor *lse,
                                    const int32_t *positions = nullptr,
                                    int64_t kv_group = 1) noexcept;
tsr_status attention_backward_native(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                     const DLTensor *v, const DLTensor *out, const DLTensor *dout,
                                     const DLTensor *lse, float scale, DLTensor *dq, DLTensor *dk,
                                     DLTensor *dv, const int32_t *positions = nullptr,
                                     int64_t kv_group = 1) noexcept;

}  // namespace tessera::cuda
