// Deterministic column sums of a [rows, cols] matrix, shared by
// ops_activation.cu (bias_grad) and ops_layernorm.cu (layernorm_backward's
// dweight / dbias). Templates and inline functions only, so every .cu that
// includes it compiles its own copy and no symbol is defined twice.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_ops_internal.hpp"

namespace tessera::cuda {

// Column sums (bias_grad, layernorm's dweight/dbias), deterministic in two
// passes. Pass 1: block (32, 8) owns 32 * V columns and a chunk of rows;
// threadIdx.y strides the chunk's rows, and the 8 partial sums of a column
// are added in y order through shared memory into partial[chunk][col].
// Pass 2 adds each column's chunk partials in chunk order into the output.
//
// With kLn the summand is dy * (x - mean[r]) * rstd[r] (dweight) into
// partial and dy into partial + chunks * cols (dbias); else dy alone.

inline constexpr int kColY = 8;

// The end of a pass-1 block: each thread's V column sums over its rows
// (acc) are added in y order through `sh` into the block's row of partials
// (`out` = partial + chunk * cols), 32 * V columns over the 32 * kColY
// threads. Shared by col_partials and the activation backward's fused pass.
template <int V, int W>
__device__ __forceinline__ void block_partials(float (&sh)[kColY][W], const float (&acc)[V],
                                               int64_t cols, float *out) {
  static_assert(W == 32 * V, "block_partials: sh holds 32 * V columns per row");
#pragma unroll
  for (int j = 0; j < V; j++) sh[threadIdx.y][threadIdx.x * V + j] = acc[j];
  __syncthreads();
  const int tid = threadIdx.y * 32 + threadIdx.x;
  for (int j = tid; j < 32 * V; j += 32 * kColY) {
    const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 * V + j;
    if (c >= cols) continue;
    float w = 0.0f;
    for (int y = 0; y < kColY; y++) w += sh[y][j];
    out[c] = w;
  }
}

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
  block_partials<V>(sh_w, acc_w, cols, partial + blockIdx.y * cols);
  if constexpr (kLn)
    block_partials<V>(sh_b, acc_b, cols, partial + (gridDim.y + blockIdx.y) * cols);
}

// out[c] += scale * the column's sum; scale = 1 multiplies exactly. Block
// (32, kFinY): threadIdx.x picks the column (coalesced reads of a partials
// row), threadIdx.y strides the chunks, and the kFinY sums of a column are
// added in y order: a fixed order, so the result repeats bit for bit.
// blockIdx.y picks one of up to kMaxFinOuts outputs, each with its own
// [chunks, cols] partials after the previous one's: one launch finishes
// layernorm_backward's dweight, dbias and dsum together.
inline constexpr int kFinY = 32;
inline constexpr int kMaxFinOuts = 3;

template <typename TO>
struct FinOuts {
  TO *p[kMaxFinOuts];
};

template <typename TO>
__global__ void col_finalize(const float *partial, int64_t chunks, int64_t cols, FinOuts<TO> outs,
                             double scale) {
  __shared__ double sh[kFinY][33];
  partial += static_cast<int64_t>(blockIdx.y) * chunks * cols;
  TO *out = outs.p[blockIdx.y];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  double s = 0.0;
  if (c < cols)
    for (int64_t k = threadIdx.y; k < chunks; k += kFinY) s += partial[k * cols + c];
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  double t = 0.0;
  for (int y = 0; y < kFinY; y++) t += sh[y][threadIdx.x];
  out[c] = from_f<TO>(static_cast<float>(to_f(out[c]) + scale * t));
}

// How many chunks of rows pass 1 splits `rows` into for `tiles` column
// tiles: enough blocks to keep several in flight on every SM (each thread
// holds one or two loads at a time, so memory needs many threads to stay
// busy), none empty.
inline int64_t col_chunks(int64_t rows, int64_t tiles, int64_t *rows_per_chunk) {
  int64_t chunks = (8 * sm_count() + tiles - 1) / tiles;
  const int64_t max_chunks = (rows + kColY - 1) / kColY;
  if (chunks > max_chunks) chunks = max_chunks;
  if (chunks < 1) chunks = 1;
  if (chunks > 65535) chunks = 65535;
  *rows_per_chunk = (rows + chunks - 1) / chunks;
  return rows == 0 ? 1 : (rows + *rows_per_chunk - 1) / *rows_per_chunk;
}

// The chunk count pass 1 uses for dy [rows, cols] (x too with kLn): the
// same for every caller that passes the same shape and vec.
inline bool col_vec(int64_t cols, const void *dy, const void *x) {
  return cols % kPack == 0 && aligned16(dy) && (!x || aligned16(x));
}
inline int64_t col_plan(int64_t rows, int64_t cols, bool vec, int64_t *rows_per_chunk) {
  const int64_t tile = 32 * (vec ? kPack : 1);
  return col_chunks(rows, (cols + tile - 1) / tile, rows_per_chunk);
}

// Launches pass 1 over dy [rows, cols] (x, mean, rstd with kLn) into
// `into` (kLn: 2 * chunks * cols floats, else chunks * cols), or a scratch
// buffer when null, and returns the partials and their chunk count.
template <typename T, bool kLn>
float *launch_col_partials(const T *dy, const T *x, const float *mean, const float *rstd,
                           int64_t rows, int64_t cols, int64_t *chunks_out, float *into = nullptr) {
  const bool vec = col_vec(cols, dy, kLn ? x : nullptr);
  const int64_t tile = 32 * (vec ? kPack : 1);
  const int64_t tiles = (cols + tile - 1) / tile;
  int64_t rows_per_chunk = 0;
  const int64_t chunks = col_plan(rows, cols, vec, &rows_per_chunk);
  float *partial = into ? into
                        : static_cast<float *>(scratch(
                              Slot::Partials, sizeof(float) * chunks * cols * (kLn ? 2 : 1)));
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

// outs[i][c] += scale * the sum of column c of the i-th [chunks, cols]
// block of partials, for the n outputs in one launch. The outputs share
// one dtype and one length (cols).
inline void launch_col_finalize(const float *partial, int64_t chunks, const View *outs, int n,
                                float scale = 1.0f) {
  if (n == 0) return;
  const int64_t cols = outs[0].numel();
  const auto blocks = static_cast<unsigned>((cols + 31) / 32);
  if (blocks == 0) return;
  dispatch_float(outs[0].dt, [&](auto tag) {
    using TO = decltype(tag);
    FinOuts<TO> o{};
    for (int i = 0; i < n; i++) o.p[i] = outs[i].as<TO>();
    col_finalize<TO>
        <<<dim3(blocks, static_cast<unsigned>(n)), dim3(32, kFinY), 0, compute_stream()>>>(
            partial, chunks, cols, o, static_cast<double>(scale));
    check_launch();
  });
}

inline void launch_col_finalize(const float *partial, int64_t chunks, const View &out,
                                float scale = 1.0f) {
  launch_col_finalize(partial, chunks, &out, 1, scale);
}

}  // namespace tessera::cuda
