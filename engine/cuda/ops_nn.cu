// CUDA ops: the layer pieces. Activations (forward, backward, and fused
// with a bias), the bias gradient, softmax cross-entropy, layernorm,
// embedding and cast, for float32, bfloat16 and float16 tensors with float32
// arithmetic inside. Semantics follow the CPU ops (ops/cpu_ops_nn.cpp).
//
// Every reduction whose result a caller compares is deterministic: partial
// sums over fixed partitions, added up in a fixed order by a second pass.
#include <cub/device/device_radix_sort.cuh>

#include "cuda/cuda_ops_internal.hpp"
#include "ops/cpu_ops.hpp"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;

// ---------------------------------------------------------------------------
// Activations: functors, so the switch on `act` happens once per call on the
// host and each kernel is a plain map. gelu is the tanh approximation of
// GPT-2 and torch's approximate="tanh"; tanhf, not the fast intrinsic, so
// float32 results agree with the CPU to rounding.

constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

struct Identity {
  __device__ float operator()(float x) const { return x; }
};
struct Relu {
  __device__ float operator()(float x) const { return x < 0.0f ? 0.0f : x; }  // NaN stays
};
struct Tanh {
  __device__ float operator()(float x) const { return tanhf(x); }
};
struct Gelu {
  __device__ float operator()(float x) const {
    const float u = kGeluS * (x + kGeluC * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
  }
};

// Derivatives, by the same rules as the CPU's.
struct IdentityGrad {
  __device__ float operator()(float) const { return 1.0f; }
};
struct ReluGrad {  // input or output alike: relu(x) > 0 exactly when x > 0
  __device__ float operator()(float v) const { return v > 0.0f ? 1.0f : 0.0f; }
};
struct TanhGradFromOutput {
  __device__ float operator()(float t) const { return 1.0f - t * t; }
};
struct TanhGrad {
  __device__ float operator()(float v) const {
    const float t = tanhf(v);
    return 1.0f - t * t;
  }
};
struct GeluGrad {
  __device__ float operator()(float x) const {
    if (fabsf(x) > 10.0f) return x > 0.0f ? 1.0f : 0.0f;  // tanh is +-1; avoids inf * 0
    const float x2 = x * x;
    const float t = tanhf(kGeluS * (x + kGeluC * x2 * x));
    const float du = kGeluS * (1.0f + 3.0f * kGeluC * x2);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
  }
};

// Runs f(Act{}) with Act the functor of `act`.
template <typename F>
void dispatch_act(tsr_activation act, F &&f) {
  switch (act) {
    case TSR_ACT_NONE:
      f(Identity{});
      break;
    case TSR_ACT_RELU:
      f(Relu{});
      break;
    case TSR_ACT_GELU:
      f(Gelu{});
      break;
    case TSR_ACT_TANH:
      f(Tanh{});
      break;
    default:
      throw Error(TSR_ERR_INVALID, "unknown activation " + std::to_string(act));
  }
}

// map_kernel adapter: y = act(x).
template <typename Act>
struct ActMap {
  __device__ float operator()(float x, float) const { return Act{}(x); }
};

// dx = dy * g(x); each element is read before it is written by the same
// thread, so dx may alias dy (or x).
template <typename T, typename G>
__global__ void act_backward_kernel(const T *x, const T *dy, T *dx, int64_t n, int64_t packs) {
  const G g;
  for (int64_t p = global_thread(); p < packs; p += global_threads()) {
    float xv[kPack], dv[kPack];
    load8(x + p * kPack, xv);
    load8(dy + p * kPack, dv);
#pragma unroll
    for (int j = 0; j < kPack; j++) dv[j] *= g(xv[j]);
    store8(dx + p * kPack, dv);
  }
  for (int64_t i = packs * kPack + global_thread(); i < n; i += global_threads())
    dx[i] = from_f<T>(to_f(dy[i]) * g(to_f(x[i])));
}

// y[r, :] = act(y[r, :] + bias[:]). With packs (cols % 8 == 0, y and bias
// aligned) a pack never straddles rows, and its bias is one aligned pack.
template <typename T, typename TB, typename Act>
__global__ void bias_act_kernel(T *y, const TB *bias, int64_t n, int64_t cols, bool vec) {
  const Act act;
  if (vec) {
    const int64_t packs = n / kPack;
    for (int64_t p = global_thread(); p < packs; p += global_threads()) {
      float v[kPack], b[kPack];
      load8(y + p * kPack, v);
      load8(bias + (p * kPack) % cols, b);
#pragma unroll
      for (int j = 0; j < kPack; j++) v[j] = act(v[j] + b[j]);
      store8(y + p * kPack, v);
    }
    return;
  }
  for (int64_t i = global_thread(); i < n; i += global_threads())
    y[i] = from_f<T>(act(to_f(y[i]) + to_f(bias[i % cols])));
}

// ---------------------------------------------------------------------------
// Column sums (bias_grad, layernorm's dweight/dbias), deterministic in two
// passes. Pass 1: block (32, 8) owns 32 * V columns and a chunk of rows;
// threadIdx.y strides the chunk's rows, and the 8 partial sums of a column
// are added in y order through shared memory into partial[chunk][col].
// Pass 2 adds each column's chunk partials in chunk order into the output.
//
// With kLn the summand is dy * (x - mean[r]) * rstd[r] (dweight) into
// partial and dy into partial + chunks * cols (dbias); else dy alone.

constexpr int kColY = 8;

template <typename T, int V, bool kLn>
__global__ void col_partials(const T *dy, const T *x, const float *mean, const float *rstd,
                             int64_t rows, int64_t cols, int64_t rows_per_chunk, float *partial) {
  __shared__ float sh_w[kColY][32 * V];
  __shared__ float sh_b[kColY][kLn ? 32 * V : 1];
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x) * V;
  const int64_t r_begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r_end = r_begin + rows_per_chunk < rows ? r_begin + rows_per_chunk : rows;
  float acc_w[V] = {}, acc_b[V] = {};
  if (c0 < cols) {
    for (int64_t r = r_begin + threadIdx.y; r < r_end; r += kColY) {
      float d[V];
      if constexpr (V == kPack) {
        load8(dy + r * cols + c0, d);
      } else {
        d[0] = to_f(dy[r * cols + c0]);
      }
      if constexpr (kLn) {
        float xv[V];
        if constexpr (V == kPack) {
          load8(x + r * cols + c0, xv);
        } else {
          xv[0] = to_f(x[r * cols + c0]);
        }
        const float m = mean[r], s = rstd[r];
#pragma unroll
        for (int j = 0; j < V; j++) {
          acc_w[j] += d[j] * ((xv[j] - m) * s);
          acc_b[j] += d[j];
        }
      } else {
#pragma unroll
        for (int j = 0; j < V; j++) acc_w[j] += d[j];
      }
    }
  }
#pragma unroll
  for (int j = 0; j < V; j++) {
    sh_w[threadIdx.y][threadIdx.x * V + j] = acc_w[j];
    if constexpr (kLn) sh_b[threadIdx.y][threadIdx.x * V + j] = acc_b[j];
  }
  __syncthreads();
  // Row y of the block's threads finishes the columns, 32 * V of them over
  // the 32 * kColY threads.
  const int tid = threadIdx.y * 32 + threadIdx.x;
  for (int j = tid; j < 32 * V; j += 32 * kColY) {
    const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 * V + j;
    if (c >= cols) continue;
    float w = 0.0f, b = 0.0f;
    for (int y = 0; y < kColY; y++) {
      w += sh_w[y][j];
      if constexpr (kLn) b += sh_b[y][j];
    }
    partial[blockIdx.y * cols + c] = w;
    if constexpr (kLn) partial[(gridDim.y + blockIdx.y) * cols + c] = b;
  }
}

template <typename TO>
__global__ void col_finalize(const float *partial, int64_t chunks, int64_t cols, TO *out) {
  for (int64_t c = global_thread(); c < cols; c += global_threads()) {
    double s = 0.0;
    for (int64_t k = 0; k < chunks; k++) s += partial[k * cols + c];
    out[c] = from_f<TO>(static_cast<float>(to_f(out[c]) + s));
  }
}

// Launches pass 1 over dy [rows, cols] (x, mean, rstd with kLn) and returns
// the partials buffer and its chunk count.
template <typename T, bool kLn>
float *launch_col_partials(const T *dy, const T *x, const float *mean, const float *rstd,
                           int64_t rows, int64_t cols, int64_t *chunks_out) {
  const bool vec = cols % kPack == 0 && aligned16(dy) && (!kLn || aligned16(x));
  const int64_t tile = 32 * (vec ? kPack : 1);
  const int64_t tiles = (cols + tile - 1) / tile;
  // Enough chunks of rows to give every SM a couple of blocks, none empty.
  int64_t chunks = (2 * sm_count() + tiles - 1) / tiles;
  const int64_t max_chunks = (rows + kColY - 1) / kColY;
  if (chunks > max_chunks) chunks = max_chunks;
  if (chunks < 1) chunks = 1;
  if (chunks > 65535) chunks = 65535;
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  chunks = rows == 0 ? 1 : (rows + rows_per_chunk - 1) / rows_per_chunk;
  float *partial =
      static_cast<float *>(scratch(Slot::Partials, sizeof(float) * chunks * cols * (kLn ? 2 : 1)));
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
  const dim3 block(32, kColY);
  if (vec) {
    col_partials<T, kPack, kLn><<<grid, block, 0, compute_stream()>>>(dy, x, mean, rstd, rows, cols,
                                                                      rows_per_chunk, partial);
  } else {
    col_partials<T, 1, kLn><<<grid, block, 0, compute_stream()>>>(dy, x, mean, rstd, rows, cols,
                                                                  rows_per_chunk, partial);
  }
  check_launch();
  *chunks_out = chunks;
  return partial;
}

void launch_col_finalize(const float *partial, int64_t chunks, const View &out) {
  dispatch_float(out.dt, [&](auto tag) {
    using TO = decltype(tag);
    col_finalize<TO><<<grid_for(out.cols, kThreads), kThreads, 0, compute_stream()>>>(
        partial, chunks, out.numel(), out.as<TO>());
    check_launch();
  });
}

// ---------------------------------------------------------------------------
// Cross-entropy. Pass 0 checks the targets; pass 1 is one block per row
// (online max / sum-of-exp / argmax, then the gradient), and writes the
// row's loss; pass 2 adds the rows up in a fixed order. Pass 1 does nothing
// when pass 0 found a bad target, so a failed call writes no gradient.

constexpr long long kNoBadRow = 0x7f7f7f7f7f7f7f7fLL;  // memset(0x7f) pattern

struct CeResult {
  double loss;
  long long count;
  long long correct;
  long long bad_row;
  long long bad_target;
};

__global__ void ce_check(const int32_t *targets, int64_t rows, int64_t valid, long long *bad_row) {
  for (int64_t r = global_thread(); r < rows; r += global_threads())
    if (targets[r] >= valid) atomicMin(bad_row, static_cast<long long>(r));
}

// The running state of a softmax over part of a row: max, sum of
// exp(x - max), and the first index of the max.
struct Online {
  float m;
  float s;
  int64_t arg;
};

__device__ __forceinline__ void online_add(Online &o, float x, int64_t j) {
  if (x > o.m) {
    o.s = o.s * __expf(o.m - x) + 1.0f;  // o.m = -inf at first: 0 * 0 + 1
    o.m = x;
    o.arg = j;
  } else {
    o.s += expf(x - o.m);
  }
}

__device__ __forceinline__ Online online_merge(const Online &a, const Online &b) {
  if (b.s == 0.0f) return a;  // an empty side
  if (a.s == 0.0f) return b;
  Online o;
  o.m = fmaxf(a.m, b.m);
  o.s = a.s * expf(a.m - o.m) + b.s * expf(b.m - o.m);
  // The first index among equal maxima, as the CPU's `>` scan keeps.
  o.arg = a.m > b.m ? a.arg : (b.m > a.m ? b.arg : (a.arg < b.arg ? a.arg : b.arg));
  return o;
}

__device__ __forceinline__ Online online_warp(Online o) {
#pragma unroll
  for (int k = 16; k > 0; k >>= 1) {
    Online other;
    other.m = __shfl_xor_sync(0xffffffffu, o.m, k);
    other.s = __shfl_xor_sync(0xffffffffu, o.s, k);
    other.arg = __shfl_xor_sync(0xffffffffu, o.arg, k);
    // Merge in lane order so every lane computes the same result.
    o = (threadIdx.x & k) ? online_merge(other, o) : online_merge(o, other);
  }
  return o;
}

template <typename T>
__global__ void ce_rows(const T *logits, const int32_t *targets, int64_t cols, int64_t valid,
                        float grad_scale, T *dlogits, bool vec, const long long *bad_row,
                        double *row_loss, int8_t *row_state) {
  if (*bad_row != kNoBadRow) return;
  __shared__ Online sh[32];
  __shared__ float sh_xt;
  const int64_t r = blockIdx.x;
  const T *x = logits + r * cols;
  T *d = dlogits ? dlogits + r * cols : nullptr;
  const int32_t t = targets[r];
  if (t < 0) {  // ignored row: no loss, zero gradient
    if (d)
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) d[j] = from_f<T>(0.0f);
    if (threadIdx.x == 0) {
      row_loss[r] = 0.0;
      row_state[r] = 0;
    }
    return;
  }
  // vec: packs, as rows are 16-byte aligned (cols % 8 == 0, aligned bases).
  const int64_t packs = vec ? valid / kPack : 0;
  Online o{-INFINITY, 0.0f, 0};
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    float v[kPack];
    load8(x + p * kPack, v);
#pragma unroll
    for (int j = 0; j < kPack; j++) online_add(o, v[j], p * kPack + j);
  }
  for (int64_t j = packs * kPack + threadIdx.x; j < valid; j += blockDim.x)
    online_add(o, to_f(x[j]), j);
  o = online_warp(o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) sh[warp] = o;
  if (threadIdx.x == 0) sh_xt = to_f(x[t]);  // read before any gradient write (aliasing)
  __syncthreads();
  o = lane < static_cast<int>(blockDim.x / 32) ? sh[lane] : Online{-INFINITY, 0.0f, 0};
  o = online_warp(o);
  const float xt = sh_xt;
  if (threadIdx.x == 0) {
    row_loss[r] = static_cast<double>(o.m) + log(static_cast<double>(o.s)) - xt;
    row_state[r] = o.arg == t ? 2 : 1;
  }
  if (!d) return;
  // softmax_j = exp(x_j - max) / sum; each x_j is read before d_j is
  // written, by the same thread, so d may alias x.
  const float g = grad_scale / o.s;
  const int64_t tpacks = vec ? cols / kPack : 0;
  for (int64_t p = threadIdx.x; p < tpacks; p += blockDim.x) {
    float v[kPack];
    load8(x + p * kPack, v);
#pragma unroll
    for (int j = 0; j < kPack; j++) {
      const int64_t col = p * kPack + j;
      v[j] = col < valid ? g * __expf(v[j] - o.m) - (col == t ? grad_scale : 0.0f) : 0.0f;
    }
    store8(d + p * kPack, v);
  }
  for (int64_t j = tpacks * kPack + threadIdx.x; j < cols; j += blockDim.x) {
    const float v = j < valid ? g * __expf(to_f(x[j]) - o.m) - (j == t ? grad_scale : 0.0f) : 0.0f;
    d[j] = from_f<T>(v);
  }
}

__global__ void ce_total(const double *row_loss, const int8_t *row_state, const int32_t *targets,
                         int64_t rows, const long long *bad_row, CeResult *out) {
  __shared__ double sh_d[32];
  __shared__ long long sh_i[32];
  double loss = 0.0;
  long long count = 0, correct = 0;
  const bool bad = *bad_row != kNoBadRow;
  if (!bad) {
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
      loss += row_loss[r];
      count += row_state[r] > 0;
      correct += row_state[r] == 2;
    }
  }
  loss = block_sum(loss, sh_d);
  count = block_sum(count, sh_i);
  correct = block_sum(correct, sh_i);
  if (threadIdx.x == 0) {
    out->loss = loss;
    out->count = count;
    out->correct = correct;
    out->bad_row = *bad_row;
    out->bad_target = bad ? targets[*bad_row] : 0;
  }
}

// ---------------------------------------------------------------------------
// Layernorm, llm.c style: one warp per row. Forward reads the row three
// times (mean, variance, output), the later passes from cache.

constexpr int kRowsPerBlock = kThreads / 32;

template <typename T, typename W>
__global__ void layernorm_forward_kernel(const T *x, const W *weight, const W *bias, float eps,
                                         T *y, float *mean_out, float *rstd_out, int64_t rows,
                                         int64_t C, bool vec) {
  const int lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const T *xr = x + r * C;
  T *yr = y + r * C;
  const int64_t packs = vec ? C / kPack : 0;
  float sum = 0.0f;
  for (int64_t p = lane; p < packs; p += 32) {
    float v[kPack];
    load8(xr + p * kPack, v);
#pragma unroll
    for (int j = 0; j < kPack; j++) sum += v[j];
  }
  for (int64_t j = packs * kPack + lane; j < C; j += 32) sum += to_f(xr[j]);
  const float m = warp_sum(sum) / static_cast<float>(C);
  float var = 0.0f;
  for (int64_t p = lane; p < packs; p += 32) {
    float v[kPack];
    load8(xr + p * kPack, v);
#pragma unroll
    for (int j = 0; j < kPack; j++) var += (v[j] - m) * (v[j] - m);
  }
  for (int64_t j = packs * kPack + lane; j < C; j += 32) {
    const float dv = to_f(xr[j]) - m;
    var += dv * dv;
  }
  const float s = rsqrtf(warp_sum(var) / static_cast<float>(C) + eps);
  for (int64_t p = lane; p < packs; p += 32) {
    float v[kPack], w[kPack], b[kPack] = {};
    load8(xr + p * kPack, v);
    load8(weight + p * kPack, w);
    if (bias) load8(bias + p * kPack, b);
#pragma unroll
    for (int j = 0; j < kPack; j++) v[j] = (v[j] - m) * s * w[j] + b[j];
    store8(yr + p * kPack, v);
  }
  for (int64_t j = packs * kPack + lane; j < C; j += 32) {
    const float b = bias ? to_f(bias[j]) : 0.0f;
    yr[j] = from_f<T>((to_f(xr[j]) - m) * s * to_f(weight[j]) + b);
  }
  if (lane == 0) {
    mean_out[r] = m;
    rstd_out[r] = s;
  }
}

// dx += rstd * (dy w - mean(dy w) - norm * mean(dy w norm)), norm the
// normalized input. Pass 1 takes the two row means, pass 2 writes; dx may
// alias dy (each element read, then written, by one thread).
template <typename T, typename W>
__global__ void layernorm_dx_kernel(const T *dy, const T *x, const W *weight, const float *mean,
                                    const float *rstd, T *dx, int64_t rows, int64_t C, bool vec) {
  const int lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const T *dyr = dy + r * C, *xr = x + r * C;
  T *dxr = dx + r * C;
  const float m = mean[r], s = rstd[r];
  const int64_t packs = vec ? C / kPack : 0;
  float a = 0.0f, b = 0.0f;  // sums of dy w and dy w norm
  for (int64_t p = lane; p < packs; p += 32) {
    float d[kPack], v[kPack], w[kPack];
    load8(dyr + p * kPack, d);
    load8(xr + p * kPack, v);
    load8(weight + p * kPack, w);
#pragma unroll
    for (int j = 0; j < kPack; j++) {
      const float dn = d[j] * w[j];
      a += dn;
      b += dn * ((v[j] - m) * s);
    }
  }
  for (int64_t j = packs * kPack + lane; j < C; j += 32) {
    const float dn = to_f(dyr[j]) * to_f(weight[j]);
    a += dn;
    b += dn * ((to_f(xr[j]) - m) * s);
  }
  const float mean_a = warp_sum(a) / static_cast<float>(C);
  const float mean_b = warp_sum(b) / static_cast<float>(C);
  for (int64_t p = lane; p < packs; p += 32) {
    float d[kPack], v[kPack], w[kPack], o[kPack];
    load8(dyr + p * kPack, d);
    load8(xr + p * kPack, v);
    load8(weight + p * kPack, w);
    load8(dxr + p * kPack, o);
#pragma unroll
    for (int j = 0; j < kPack; j++) o[j] += s * (d[j] * w[j] - mean_a - ((v[j] - m) * s) * mean_b);
    store8(dxr + p * kPack, o);
  }
  for (int64_t j = packs * kPack + lane; j < C; j += 32) {
    const float dn = to_f(dyr[j]) * to_f(weight[j]);
    const float nv = (to_f(xr[j]) - m) * s;
    dxr[j] = from_f<T>(to_f(dxr[j]) + s * (dn - mean_a - nv * mean_b));
  }
}

// ---------------------------------------------------------------------------
// Embedding. Ids are checked on the device first (the lowest row holding an
// id outside [0, vocab)), and the result read back before anything is
// written, so a bad id fails the call cleanly.

__global__ void ids_check(const int32_t *ids, int64_t rows, int64_t vocab, long long *bad_row) {
  for (int64_t r = global_thread(); r < rows; r += global_threads())
    if (ids[r] < 0 || ids[r] >= vocab) atomicMin(bad_row, static_cast<long long>(r));
}

template <typename T>
__global__ void embedding_gather(const int32_t *ids, const T *table, T *out, int64_t n, int64_t C,
                                 bool vec, bool accumulate) {
  if (vec) {
    const int64_t packs = n / kPack;
    for (int64_t p = global_thread(); p < packs; p += global_threads()) {
      const int64_t i = p * kPack, r = i / C, c = i % C;
      float v[kPack];
      load8(table + static_cast<int64_t>(ids[r]) * C + c, v);
      if (accumulate) {
        float o[kPack];
        load8(out + i, o);
#pragma unroll
        for (int j = 0; j < kPack; j++) v[j] += o[j];
      }
      store8(out + i, v);
    }
    return;
  }
  for (int64_t i = global_thread(); i < n; i += global_threads()) {
    const int64_t r = i / C, c = i % C;
    float v = to_f(table[static_cast<int64_t>(ids[r]) * C + c]);
    if (accumulate) v += to_f(out[i]);
    out[i] = from_f<T>(v);
  }
}

__global__ void iota(int32_t *p, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += global_threads()) p[i] = static_cast<int32_t>(i);
}

// After sorting (id, position) pairs by id (stably, so positions ascend
// within an id): one warp per sorted entry; the warp at the start of each
// run of equal ids sums that run's dout rows in position order in float32
// and adds the sum into the table row once. Deterministic, and each table
// element is rounded once whatever its dtype.
template <typename T>
__global__ void embedding_scatter(const int32_t *sorted_ids, const int32_t *positions,
                                  const T *dout, T *dtable, int64_t rows, int64_t C, bool vec) {
  const int lane = threadIdx.x % 32;
  const int64_t k = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (k >= rows) return;
  const int32_t id = sorted_ids[k];
  if (k > 0 && sorted_ids[k - 1] == id) return;
  int64_t end = k + 1;
  while (end < rows && sorted_ids[end] == id) end++;
  T *dst = dtable + static_cast<int64_t>(id) * C;
  const int64_t packs = vec ? C / kPack : 0;
  for (int64_t p = lane; p < packs; p += 32) {
    float acc[kPack] = {};
    for (int64_t q = k; q < end; q++) {
      float v[kPack];
      load8(dout + static_cast<int64_t>(positions[q]) * C + p * kPack, v);
#pragma unroll
      for (int j = 0; j < kPack; j++) acc[j] += v[j];
    }
    float o[kPack];
    load8(dst + p * kPack, o);
#pragma unroll
    for (int j = 0; j < kPack; j++) o[j] += acc[j];
    store8(dst + p * kPack, o);
  }
  for (int64_t c = packs * kPack + lane; c < C; c += 32) {
    float acc = 0.0f;
    for (int64_t q = k; q < end; q++) acc += to_f(dout[static_cast<int64_t>(positions[q]) * C + c]);
    dst[c] = from_f<T>(to_f(dst[c]) + acc);
  }
}

// The lowest row of `ids` outside [0, vocab), or -1: one small kernel and a
// read-back (a synchronization: the price of failing before writing).
int64_t first_bad_id(const View &ids, int64_t vocab) {
  long long *flag = static_cast<long long *>(scratch(Slot::Flags, sizeof(long long)));
  cudaStream_t stream = compute_stream();
  TSR_CUDA_CHECK(cudaMemsetAsync(flag, 0x7f, sizeof(long long), stream));
  ids_check<<<grid_for(ids.numel(), kThreads), kThreads, 0, stream>>>(ids.as<int32_t>(),
                                                                      ids.numel(), vocab, flag);
  check_launch();
  long long bad = 0;
  read_back(&bad, flag, sizeof(bad));
  return bad == kNoBadRow ? -1 : static_cast<int64_t>(bad);
}

std::string bad_id_message(const char *op, const View &ids, const DLTensor *ids_t, int64_t row,
                           int64_t vocab) {
  int32_t id = 0;
  TSR_CUDA_CHECK(cudaMemcpy(&id, ids.as<int32_t>() + row, sizeof(id), cudaMemcpyDeviceToHost));
  return std::string(op) + ": ids " + describe(ids_t) + " row " + std::to_string(row) +
         " holds id " + std::to_string(id) + ", outside [0, " + std::to_string(vocab) + ")";
}

}  // namespace

// ---------------------------------------------------------------------------
// Launchers shared with ops_matmul.cpp

void launch_act_forward(tsr_activation act, const View &x, const View &y) {
  dispatch_float(y.dt, [&](auto tag) {
    using T = decltype(tag);
    dispatch_act(act, [&](auto a) {
      launch_map<T, T, true, false>(x.as<T>(), y.as<T>(), y.numel(), ActMap<decltype(a)>{});
    });
  });
}

void launch_bias_act(const View &y, const View *bias, tsr_activation act) {
  if (!bias) {
    if (act != TSR_ACT_NONE) launch_act_forward(act, y, y);
    return;
  }
  const int64_t n = y.numel();
  if (n == 0) return;
  const bool vec = y.cols % kPack == 0 && aligned16(y.p) && aligned16(bias->p);
  const unsigned grid = grid_for(vec ? n / kPack : n, kThreads);
  dispatch_float(y.dt, [&](auto ytag) {
    using T = decltype(ytag);
    dispatch_float(bias->dt, [&](auto btag) {
      using TB = decltype(btag);
      dispatch_act(act, [&](auto a) {
        bias_act_kernel<T, TB, decltype(a)>
            <<<grid, kThreads, 0, compute_stream()>>>(y.as<T>(), bias->as<TB>(), n, y.cols, vec);
        check_launch();
      });
    });
  });
}

// ---------------------------------------------------------------------------
// Entries

tsr_status bias_act(tsr_host_ctx *ctx, DLTensor *y, const DLTensor *bias,
                    tsr_activation act) noexcept {
  return guarded(ctx, [&] {
    if (side_of("bias_act", {{"y", y}, {"bias", bias}}) == Side::Host) {
      AsCpu hy(y), hb(bias);
      host_result(cpu_ops()->bias_act(ctx, hy.mut(), hb.p, act));
      return;
    }
    const View Y = floating("bias_act", "y", y, 1), B = floating("bias_act", "bias", bias, 1);
    TSR_CHECK(B.numel() == Y.cols, TSR_ERR_INVALID,
              "bias_act: bias " + describe(bias) + " must have the last dim of y " + describe(y) +
                  " (" + std::to_string(Y.cols) + " elements)");
    check_activation("bias_act", act);
    launch_bias_act(Y, &B, act);
  });
}

tsr_status bias_grad(tsr_host_ctx *ctx, const DLTensor *dy, DLTensor *dbias) noexcept {
  return guarded(ctx, [&] {
    if (side_of("bias_grad", {{"dy", dy}, {"dbias", dbias}}) == Side::Host) {
      AsCpu hd(dy), hb(dbias);
      host_result(cpu_ops()->bias_grad(ctx, hd.p, hb.mut()));
      return;
    }
    const View D = floating("bias_grad", "dy", dy, 1), G = floating("bias_grad", "dbias", dbias, 1);
    TSR_CHECK(G.numel() == D.cols, TSR_ERR_INVALID,
              "bias_grad: dbias " + describe(dbias) + " must have the last dim of dy " +
                  describe(dy) + " (" + std::to_string(D.cols) + " elements)");
    if (D.cols == 0 || D.rows == 0) return;
    dispatch_float(D.dt, [&](auto tag) {
      using T = decltype(tag);
      int64_t chunks = 0;
      const float *partial = launch_col_partials<T, false>(D.as<T>(), nullptr, nullptr, nullptr,
                                                           D.rows, D.cols, &chunks);
      launch_col_finalize(partial, chunks, G);
    });
  });
}

tsr_status act_forward(tsr_host_ctx *ctx, tsr_activation act, const DLTensor *x,
                       DLTensor *y) noexcept {
  return guarded(ctx, [&] {
    if (side_of("act_forward", {{"x", x}, {"y", y}}) == Side::Host) {
      AsCpu hx(x), hy(y);
      host_result(cpu_ops()->act_forward(ctx, act, hx.p, hy.mut()));
      return;
    }
    const View X = floating("act_forward", "x", x), Y = floating("act_forward", "y", y);
    check_same_numel("act_forward", "x", x, X, "y", y, Y);
    check_same_dtype("act_forward", "x", x, X, "y", y, Y);
    check_activation("act_forward", act);
    launch_act_forward(act, X, Y);
  });
}

tsr_status act_backward(tsr_host_ctx *ctx, tsr_activation act, const DLTensor *x,
                        int32_t from_output, const DLTensor *dy, DLTensor *dx) noexcept {
  return guarded(ctx, [&] {
    if (side_of("act_backward", {{"x", x}, {"dy", dy}, {"dx", dx}}) == Side::Host) {
      AsCpu hx(x), hdy(dy), hdx(dx);
      host_result(cpu_ops()->act_backward(ctx, act, hx.p, from_output, hdy.p, hdx.mut()));
      return;
    }
    const View X = floating("act_backward", "x", x), DY = floating("act_backward", "dy", dy),
               DX = floating("act_backward", "dx", dx);
    check_same_numel("act_backward", "x", x, X, "dy", dy, DY);
    check_same_numel("act_backward", "dy", dy, DY, "dx", dx, DX);
    check_same_dtype("act_backward", "x", x, X, "dy", dy, DY);
    check_same_dtype("act_backward", "dy", dy, DY, "dx", dx, DX);
    check_activation("act_backward", act);
    TSR_CHECK(from_output == 0 || from_output == 1, TSR_ERR_INVALID,
              "act_backward: from_output must be 0 or 1, got " + std::to_string(from_output));
    TSR_CHECK(!(act == TSR_ACT_GELU && from_output), TSR_ERR_INVALID,
              "act_backward: gelu needs its input (from_output must be 0)");
    const int64_t n = X.numel();
    if (n == 0) return;
    const bool vec = aligned16(X.p) && aligned16(DY.p) && aligned16(DX.p);
    const int64_t packs = vec ? n / kPack : 0;
    const unsigned grid = grid_for(packs > 0 ? packs : n, kThreads);
    dispatch_float(X.dt, [&](auto tag) {
      using T = decltype(tag);
      auto go = [&](auto g) {
        act_backward_kernel<T, decltype(g)>
            <<<grid, kThreads, 0, compute_stream()>>>(X.as<T>(), DY.as<T>(), DX.as<T>(), n, packs);
        check_launch();
      };
      switch (act) {
        case TSR_ACT_NONE:
          go(IdentityGrad{});
          break;
        case TSR_ACT_RELU:
          go(ReluGrad{});
          break;
        case TSR_ACT_GELU:
          go(GeluGrad{});
          break;
        case TSR_ACT_TANH:
          if (from_output) {
            go(TanhGradFromOutput{});
          } else {
            go(TanhGrad{});
          }
          break;
      }
    });
  });
}

tsr_status cross_entropy(tsr_host_ctx *ctx, const DLTensor *logits, const DLTensor *targets,
                         int64_t valid_classes, float grad_scale, DLTensor *dlogits,
                         double *loss_sum, int64_t *count, int64_t *correct) noexcept {
  return guarded(ctx, [&] {
    if (side_of("cross_entropy",
                {{"logits", logits}, {"targets", targets}, {"dlogits", dlogits}}) == Side::Host) {
      AsCpu hl(logits), ht(targets), hd(dlogits);
      host_result(cpu_ops()->cross_entropy(ctx, hl.p, ht.p, valid_classes, grad_scale, hd.mut(),
                                           loss_sum, count, correct));
      return;
    }
    const View L = floating("cross_entropy", "logits", logits, 1);
    const View T = i32("cross_entropy", "targets", targets);
    TSR_CHECK(T.numel() == L.rows, TSR_ERR_INVALID,
              "cross_entropy: targets " + describe(targets) + " must have one entry per row of " +
                  "logits " + describe(logits) + " (" + std::to_string(L.rows) + " rows)");
    TSR_CHECK(valid_classes <= L.cols, TSR_ERR_INVALID,
              "cross_entropy: valid_classes " + std::to_string(valid_classes) +
                  " exceeds the last dim of logits " + describe(logits));
    TSR_CHECK(loss_sum != nullptr && count != nullptr, TSR_ERR_INVALID,
              "cross_entropy: loss_sum and count must not be NULL");
    TSR_CHECK(L.rows < (int64_t(1) << 31), TSR_ERR_UNSUPPORTED,
              "cross_entropy: too many rows in logits " + describe(logits));
    View DL{};
    if (dlogits) {
      DL = floating("cross_entropy", "dlogits", dlogits, 1);
      TSR_CHECK(
          DL.rows == L.rows && DL.cols == L.cols && DL.dt == L.dt, TSR_ERR_INVALID,
          "cross_entropy: dlogits " + describe(dlogits) + " must match logits " + describe(logits));
    }
    const int64_t rows = L.rows, V = valid_classes > 0 ? valid_classes : L.cols;
    CeResult res{0.0, 0, 0, kNoBadRow, 0};
    if (rows > 0) {
      TSR_CHECK(V > 0, TSR_ERR_INVALID,
                "cross_entropy: logits " + describe(logits) + " have no classes");
      cudaStream_t stream = compute_stream();
      // One scratch block: [result | bad_row | row losses | row states].
      const size_t off_flag = 64, off_loss = 128, off_state = off_loss + sizeof(double) * rows;
      char *base = static_cast<char *>(scratch(Slot::Rows, off_state + rows));
      auto *out = reinterpret_cast<CeResult *>(base);
      auto *flag = reinterpret_cast<long long *>(base + off_flag);
      auto *row_loss = reinterpret_cast<double *>(base + off_loss);
      auto *row_state = reinterpret_cast<int8_t *>(base + off_state);
      TSR_CUDA_CHECK(cudaMemsetAsync(flag, 0x7f, sizeof(long long), stream));
      ce_check<<<grid_for(rows, kThreads), kThreads, 0, stream>>>(T.as<int32_t>(), rows, V, flag);
      check_launch();
      const int threads = V >= 8192 ? 512 : (V >= 1024 ? 256 : 128);
      const bool vec = L.cols % kPack == 0 && aligned16(L.p) && (!dlogits || aligned16(DL.p));
      dispatch_float(L.dt, [&](auto tag) {
        using TT = decltype(tag);
        ce_rows<TT><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
            L.as<TT>(), T.as<int32_t>(), L.cols, V, grad_scale, dlogits ? DL.as<TT>() : nullptr,
            vec, flag, row_loss, row_state);
        check_launch();
      });
      ce_total<<<1, 1024, 0, stream>>>(row_loss, row_state, T.as<int32_t>(), rows, flag, out);
      check_launch();
      read_back(&res, out, sizeof(res));
    }
    TSR_CHECK(res.bad_row == kNoBadRow, TSR_ERR_INVALID,
              "cross_entropy: row " + std::to_string(res.bad_row) + " has target " +
                  std::to_string(res.bad_target) + " but only " + std::to_string(V) +
                  " valid classes (logits " + describe(logits) + ")");
    *loss_sum = res.loss;
    *count = res.count;
    if (correct) *correct = res.correct;
  });
}

tsr_status cast(tsr_host_ctx *ctx, const DLTensor *x, DLTensor *y) noexcept {
  return guarded(ctx, [&] {
    if (side_of("cast", {{"x", x}, {"y", y}}) == Side::Host) {
      AsCpu hx(x), hy(y);
      host_result(need_cpu(cpu_ops()->cast, "cast")(ctx, hx.p, hy.mut()));
      return;
    }
    const View X = floating("cast", "x", x), Y = floating("cast", "y", y);
    check_same_numel("cast", "x", x, X, "y", y, Y);
    if (X.numel() == 0) return;
    if (X.dt == Y.dt) {
      if (X.p != Y.p)
        TSR_CUDA_CHECK(
            cudaMemcpyAsync(Y.p, X.p, X.bytes(), cudaMemcpyDeviceToDevice, compute_stream()));
      return;
    }
    const auto x0 = reinterpret_cast<uintptr_t>(X.p), y0 = reinterpret_cast<uintptr_t>(Y.p);
    TSR_CHECK(!(x0 < y0 + Y.bytes() && y0 < x0 + X.bytes()), TSR_ERR_INVALID,
              "cast: x " + describe(x) + " and y " + describe(y) + " overlap in memory");
    dispatch_float(X.dt, [&](auto xtag) {
      using Tx = decltype(xtag);
      dispatch_float(Y.dt, [&](auto ytag) {
        using Ty = decltype(ytag);
        launch_map<Tx, Ty, true, false>(X.as<Tx>(), Y.as<Ty>(), X.numel(), ActMap<Identity>{});
      });
    });
  });
}

tsr_status layernorm_forward(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *weight,
                             const DLTensor *bias, float eps, DLTensor *y, DLTensor *mean,
                             DLTensor *rstd) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "layernorm_forward";
    if (side_of(op, {{"x", x},
                     {"weight", weight},
                     {"bias", bias},
                     {"y", y},
                     {"mean", mean},
                     {"rstd", rstd}}) == Side::Host) {
      AsCpu hx(x), hw(weight), hb(bias), hy(y), hm(mean), hr(rstd);
      host_result(need_cpu(cpu_ops()->layernorm_forward, op)(ctx, hx.p, hw.p, hb.p, eps, hy.mut(),
                                                             hm.mut(), hr.mut()));
      return;
    }
    const View X = floating(op, "x", x, 1), W = floating(op, "weight", weight),
               Y = floating(op, "y", y, 1), M = f32(op, "mean", mean), R = f32(op, "rstd", rstd);
    View B{};
    if (bias) {
      B = floating(op, "bias", bias);
      check_same_dtype(op, "weight", weight, W, "bias", bias, B);
      TSR_CHECK(B.numel() == X.cols, TSR_ERR_INVALID,
                std::string(op) + ": bias " + describe(bias) + " must have " +
                    std::to_string(X.cols) + " elements, the last dim of x " + describe(x));
    }
    TSR_CHECK(W.numel() == X.cols, TSR_ERR_INVALID,
              std::string(op) + ": weight " + describe(weight) + " must have " +
                  std::to_string(X.cols) + " elements, the last dim of x " + describe(x));
    TSR_CHECK(Y.rows == X.rows && Y.cols == X.cols, TSR_ERR_INVALID,
              std::string(op) + ": y " + describe(y) + " must match x " + describe(x));
    check_same_dtype(op, "x", x, X, "y", y, Y);
    TSR_CHECK(M.numel() == X.rows && R.numel() == X.rows, TSR_ERR_INVALID,
              std::string(op) + ": mean " + describe(mean) + " and rstd " + describe(rstd) +
                  " must have one entry per row of x " + describe(x));
    TSR_CHECK(X.cols > 0 || X.rows == 0, TSR_ERR_INVALID,
              std::string(op) + ": x " + describe(x) + " has rows of no elements");
    if (X.rows == 0) return;
    const bool vec = X.cols % kPack == 0 && aligned16(X.p) && aligned16(Y.p) && aligned16(W.p) &&
                     (!bias || aligned16(B.p));
    const unsigned grid = static_cast<unsigned>((X.rows + kRowsPerBlock - 1) / kRowsPerBlock);
    dispatch_float(X.dt, [&](auto xtag) {
      using T = decltype(xtag);
      dispatch_float(W.dt, [&](auto wtag) {
        using TW = decltype(wtag);
        layernorm_forward_kernel<T, TW><<<grid, kThreads, 0, compute_stream()>>>(
            X.as<T>(), W.as<TW>(), bias ? B.as<TW>() : nullptr, eps, Y.as<T>(), M.as<float>(),
            R.as<float>(), X.rows, X.cols, vec);
        check_launch();
      });
    });
  });
}

tsr_status layernorm_backward(tsr_host_ctx *ctx, const DLTensor *dy, const DLTensor *x,
                              const DLTensor *weight, const DLTensor *mean, const DLTensor *rstd,
                              DLTensor *dx, DLTensor *dweight, DLTensor *dbias) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "layernorm_backward";
    if (side_of(op, {{"dy", dy},
                     {"x", x},
                     {"weight", weight},
                     {"mean", mean},
                     {"rstd", rstd},
                     {"dx", dx},
                     {"dweight", dweight},
                     {"dbias", dbias}}) == Side::Host) {
      AsCpu hdy(dy), hx(x), hw(weight), hm(mean), hr(rstd), hdx(dx), hdw(dweight), hdb(dbias);
      host_result(need_cpu(cpu_ops()->layernorm_backward, op)(ctx, hdy.p, hx.p, hw.p, hm.p, hr.p,
                                                              hdx.mut(), hdw.mut(), hdb.mut()));
      return;
    }
    const View DY = floating(op, "dy", dy, 1), X = floating(op, "x", x, 1),
               W = floating(op, "weight", weight), M = f32(op, "mean", mean),
               R = f32(op, "rstd", rstd), DX = floating(op, "dx", dx, 1),
               DW = floating(op, "dweight", dweight);
    View DB{};
    if (dbias) {
      DB = floating(op, "dbias", dbias);
      TSR_CHECK(DB.numel() == X.cols, TSR_ERR_INVALID,
                std::string(op) + ": dbias " + describe(dbias) + " must have " +
                    std::to_string(X.cols) + " elements");
    }
    TSR_CHECK(DY.rows == X.rows && DY.cols == X.cols && DX.rows == X.rows && DX.cols == X.cols,
              TSR_ERR_INVALID,
              std::string(op) + ": dy " + describe(dy) + " and dx " + describe(dx) +
                  " must match x " + describe(x));
    check_same_dtype(op, "x", x, X, "dy", dy, DY);
    check_same_dtype(op, "x", x, X, "dx", dx, DX);
    TSR_CHECK(W.numel() == X.cols && DW.numel() == X.cols, TSR_ERR_INVALID,
              std::string(op) + ": weight " + describe(weight) + " and dweight " +
                  describe(dweight) + " must have " + std::to_string(X.cols) + " elements");
    TSR_CHECK(M.numel() == X.rows && R.numel() == X.rows, TSR_ERR_INVALID,
              std::string(op) + ": mean " + describe(mean) + " and rstd " + describe(rstd) +
                  " must have one entry per row of x " + describe(x));
    if (X.rows == 0 || X.cols == 0) return;
    const bool vec = X.cols % kPack == 0 && aligned16(X.p) && aligned16(DY.p) && aligned16(DX.p) &&
                     aligned16(W.p);
    const unsigned grid = static_cast<unsigned>((X.rows + kRowsPerBlock - 1) / kRowsPerBlock);
    dispatch_float(X.dt, [&](auto xtag) {
      using T = decltype(xtag);
      // Parameter gradients first: they read dy, which dx may alias.
      int64_t chunks = 0;
      const float *partial = launch_col_partials<T, true>(DY.as<T>(), X.as<T>(), M.as<float>(),
                                                          R.as<float>(), X.rows, X.cols, &chunks);
      launch_col_finalize(partial, chunks, DW);
      if (dbias) launch_col_finalize(partial + chunks * X.cols, chunks, DB);
      dispatch_float(W.dt, [&](auto wtag) {
        using TW = decltype(wtag);
        layernorm_dx_kernel<T, TW><<<grid, kThreads, 0, compute_stream()>>>(
            DY.as<T>(), X.as<T>(), W.as<TW>(), M.as<float>(), R.as<float>(), DX.as<T>(), X.rows,
            X.cols, vec);
        check_launch();
      });
    });
  });
}

tsr_status embedding_forward(tsr_host_ctx *ctx, const DLTensor *ids, const DLTensor *table,
                             DLTensor *out, int32_t accumulate) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "embedding_forward";
    if (side_of(op, {{"ids", ids}, {"table", table}, {"out", out}}) == Side::Host) {
      AsCpu hi(ids), ht(table), ho(out);
      host_result(
          need_cpu(cpu_ops()->embedding_forward, op)(ctx, hi.p, ht.p, ho.mut(), accumulate));
      return;
    }
    const View I = i32(op, "ids", ids), T = floating(op, "table", table, 2),
               O = floating(op, "out", out, 1);
    TSR_CHECK(table->ndim == 2, TSR_ERR_INVALID,
              std::string(op) + ": table must be 2-D [vocab, C], got " + describe(table));
    TSR_CHECK(O.rows == I.numel() && O.cols == T.cols, TSR_ERR_INVALID,
              std::string(op) + ": out " + describe(out) + " must be [" +
                  std::to_string(I.numel()) + ", " + std::to_string(T.cols) + "] for ids " +
                  describe(ids) + " and table " + describe(table));
    check_same_dtype(op, "table", table, T, "out", out, O);
    TSR_CHECK(accumulate == 0 || accumulate == 1, TSR_ERR_INVALID,
              std::string(op) + ": accumulate must be 0 or 1, got " + std::to_string(accumulate));
    if (O.numel() == 0) return;
    const int64_t bad = first_bad_id(I, T.rows);
    TSR_CHECK(bad < 0, TSR_ERR_INVALID, bad_id_message(op, I, ids, bad, T.rows));
    const bool vec = T.cols % kPack == 0 && aligned16(T.p) && aligned16(O.p);
    const int64_t n = O.numel();
    dispatch_float(T.dt, [&](auto tag) {
      using TT = decltype(tag);
      embedding_gather<TT>
          <<<grid_for(vec ? n / kPack : n, kThreads), kThreads, 0, compute_stream()>>>(
              I.as<int32_t>(), T.as<TT>(), O.as<TT>(), n, T.cols, vec, accumulate != 0);
      check_launch();
    });
  });
}

tsr_status embedding_backward(tsr_host_ctx *ctx, const DLTensor *ids, const DLTensor *dout,
                              DLTensor *dtable) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "embedding_backward";
    if (side_of(op, {{"ids", ids}, {"dout", dout}, {"dtable", dtable}}) == Side::Host) {
      AsCpu hi(ids), hd(dout), ht(dtable);
      host_result(need_cpu(cpu_ops()->embedding_backward, op)(ctx, hi.p, hd.p, ht.mut()));
      return;
    }
    const View I = i32(op, "ids", ids), D = floating(op, "dout", dout, 1),
               T = floating(op, "dtable", dtable, 2);
    TSR_CHECK(dtable->ndim == 2, TSR_ERR_INVALID,
              std::string(op) + ": dtable must be 2-D [vocab, C], got " + describe(dtable));
    TSR_CHECK(D.rows == I.numel() && D.cols == T.cols, TSR_ERR_INVALID,
              std::string(op) + ": dout " + describe(dout) + " must be [" +
                  std::to_string(I.numel()) + ", " + std::to_string(T.cols) + "] for ids " +
                  describe(ids) + " and dtable " + describe(dtable));
    check_same_dtype(op, "dout", dout, D, "dtable", dtable, T);
    const int64_t rows = I.numel();
    TSR_CHECK(rows < (int64_t(1) << 31), TSR_ERR_UNSUPPORTED,
              std::string(op) + ": too many ids " + describe(ids));
    if (rows == 0 || T.cols == 0) return;
    const int64_t bad = first_bad_id(I, T.rows);
    TSR_CHECK(bad < 0, TSR_ERR_INVALID, bad_id_message(op, I, ids, bad, T.rows));

    // Sort (id, position) by id; ids are now known to lie in [0, vocab), so
    // only the low bits take part.
    cudaStream_t stream = compute_stream();
    const size_t n = static_cast<size_t>(rows), ints = (n + 63) / 64 * 64;
    int32_t *buf = static_cast<int32_t *>(scratch(Slot::SortA, sizeof(int32_t) * ints * 3));
    int32_t *keys_out = buf, *vals_in = buf + ints, *vals_out = buf + 2 * ints;
    int end_bit = 1;
    while (end_bit < 31 && (int64_t(1) << end_bit) < T.rows) end_bit++;
    const auto *keys_in = reinterpret_cast<const unsigned *>(I.as<int32_t>());
    auto *keys_sorted = reinterpret_cast<unsigned *>(keys_out);
    size_t temp_bytes = 0;
    TSR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_sorted,
                                                   vals_in, vals_out, static_cast<int>(n), 0,
                                                   end_bit, stream));
    void *temp = scratch(Slot::SortB, temp_bytes);
    iota<<<grid_for(rows, kThreads), kThreads, 0, stream>>>(vals_in, rows);
    check_launch();
    TSR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_sorted, vals_in,
                                                   vals_out, static_cast<int>(n), 0, end_bit,
                                                   stream));
    const bool vec = T.cols % kPack == 0 && aligned16(T.p) && aligned16(D.p);
    const unsigned grid = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
    dispatch_float(T.dt, [&](auto tag) {
      using TT = decltype(tag);
      embedding_scatter<TT><<<grid, kThreads, 0, stream>>>(keys_out, vals_out, D.as<TT>(),
                                                           T.as<TT>(), rows, T.cols, vec);
      check_launch();
    });
  });
}

}  // namespace tessera::cuda
