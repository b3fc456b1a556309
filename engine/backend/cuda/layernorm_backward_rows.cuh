// The one-pass layernorm backward for rows of whole 8-element packs
// (ops_layernorm.cu's layernorm_backward and layernorm_backward_sum):
// dx, and the column partials of dweight, dbias and dsum (the column sums
// of dx as stored), from one read of dy, x and dx. The multi-pass form it
// replaces read dy and x twice and dx once more: 150 MB read a call at
// GPT-2 small's [16384, 768] bf16 against 75 MB here (25 MB written by
// both). On an H100 one call takes 42 us against 55 us for the passes it
// replaces (dx 32.5, the dweight/dbias partials 21.9, and a share of the
// dsum partials), and GPT-2 124M trained 2% faster.
//
// Layout: a group of W warps owns one row at a time, each thread P packs of
// it (pack q = t + k * 32W of the row for thread t of the group, k < P), so
// a thread's column partials stay in registers: 8P columns, three sums
// each. A block holds R = 16 / W groups and a contiguous chunk of rows;
// group g walks rows g, g + R, ... of the chunk. The row means that dx
// needs are warp sums joined across the group's warps in warp order through
// shared memory, behind a named barrier of the group's threads. At the end
// the groups add their partials into shared memory in group order and the
// block writes its row of partials: partial[k][block][col], k = 0 dweight,
// 1 dbias, 2 dsum, which col_finalize (col_sums.cuh) adds up over the
// blocks in chunk order.
//
// Measured and dropped (H100, same calls): copying the next two rows ahead
// with cp.async (42.9 us, no gain: the loads were not what held it back),
// and rows dealt round the blocks instead of chunks (44.9 us).
//
// Deterministic: every sum has a fixed order for a given shape and GPU
// (the grid depends on the SM count only).
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_ops_internal.hpp"

namespace tessera::cuda {

inline constexpr int kLnbThreads = 512;
inline constexpr int kLnbWarps = kLnbThreads / 32;
// The widest row: its three rows of partials (dynamic) and the row sums'
// slots (static, 256 bytes) within the 48 KiB a block may use without
// opting in to more. Wider rows, 4096 among them, take the multi-pass form.
inline constexpr int kLnbMaxCols = 4072;

// The named barrier of group g's n threads (barrier 0 is __syncthreads').
__device__ __forceinline__ void group_barrier(int g, int n) {
  asm volatile("bar.sync %0, %1;" ::"r"(g + 1), "r"(n) : "memory");
}

// Eight elements as loaded: one 16-byte word for 2-byte types, two for
// float32. The loads stay packed across the row's barrier (4 registers a
// pack of bf16 against 8 as floats).
template <typename T>
struct Raw8 {
  uint4 u[sizeof(T) / 2];
};
template <typename T>
__device__ __forceinline__ Raw8<T> raw_load(const T *p) {
  Raw8<T> r;
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(T) / 2); i++)
    r.u[i] = reinterpret_cast<const uint4 *>(p)[i];
  return r;
}
template <typename T>
__device__ __forceinline__ void raw_unpack(const Raw8<T> &r, float (&v)[kPack]) {
  const T *e = reinterpret_cast<const T *>(&r);
#pragma unroll
  for (int j = 0; j < kPack; j++) v[j] = to_f(e[j]);
}

// Two blocks an SM (64 registers a thread) for 2-byte rows of one pack a
// thread; wider partials (P = 2) or float32 loads need more registers.
template <typename T, int P>
inline constexpr int kLnbMinBlocks = P == 1 && sizeof(T) == 2 ? 2 : 1;

// long-function: kept whole on purpose: a thread's pack of dy, x and
// the weight is loaded once and stays in registers through the row
// statistics, dx and the column partials; the launch bounds above budget
// those registers for the one kernel body.
template <typename T, typename TW, int P, bool kSum>
__global__ void __launch_bounds__(kLnbThreads, kLnbMinBlocks<T, P>)
    layernorm_backward_rows(const T *dy, const T *x, const TW *weight, const float *mean,
                            const float *rstd, T *dx, int64_t rows, int64_t C, int W,
                            int64_t rows_per_block, float *partial) {
  extern __shared__ float sh_cols[];         // [3][C]: the block's partials
  __shared__ float sh_red[2][kLnbWarps][2];  // the warps' row sums, two rows' worth
  static_assert(sizeof(float) * (3 * kLnbMaxCols + 2 * kLnbWarps * 2) <= 48 * 1024,
                "layernorm_backward_rows: shared memory past 48 KiB needs an opt-in");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int R = kLnbWarps / W, g = warp / W;
  const int t = (warp % W) * 32 + lane;  // thread within the group
  const int64_t packs = C / kPack;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;
  const float inv_c = 1.0f / static_cast<float>(C);
  float acc_w[P][kPack] = {}, acc_b[P][kPack] = {}, acc_s[P][kPack] = {};
  if (g < R) {
    int slot = 0;
    for (int64_t r = r0 + g; r < r1; r += R) {
      const T *dyr = dy + r * C, *xr = x + r * C;
      T *dxr = dx + r * C;
      const float m = mean[r], s = rstd[r];
      Raw8<T> rd[P], rx[P], ro[P];
#pragma unroll
      for (int k = 0; k < P; k++) {
        const int64_t q = t + static_cast<int64_t>(k) * 32 * W;
        if (q < packs) {
          rd[k] = raw_load(dyr + q * kPack);
          rx[k] = raw_load(xr + q * kPack);
          ro[k] = raw_load(dxr + q * kPack);
        }
      }
      float a = 0.0f, b = 0.0f;  // this thread's sums of dy w and dy w norm
#pragma unroll
      for (int k = 0; k < P; k++) {
        const int64_t q = t + static_cast<int64_t>(k) * 32 * W;
        if (q >= packs) continue;
        float d[kPack], v[kPack], w[kPack];
        raw_unpack(rd[k], d);
        raw_unpack(rx[k], v);
        load8(weight + q * kPack, w);
#pragma unroll
        for (int j = 0; j < kPack; j++) {
          const float dn = d[j] * w[j];
          a += dn;
          b += dn * ((v[j] - m) * s);
        }
      }
      a = warp_sum(a);
      b = warp_sum(b);
      if (W > 1) {
        if (lane == 0) {
          sh_red[slot][warp][0] = a;
          sh_red[slot][warp][1] = b;
        }
        group_barrier(g, 32 * W);
        a = 0.0f, b = 0.0f;
        for (int i = 0; i < W; i++) {
          a += sh_red[slot][g * W + i][0];
          b += sh_red[slot][g * W + i][1];
        }
        slot ^= 1;  // the next row's sums go to the other slot: one barrier a row
      }
      const float mean_a = a * inv_c, mean_b = b * inv_c;
#pragma unroll
      for (int k = 0; k < P; k++) {
        const int64_t q = t + static_cast<int64_t>(k) * 32 * W;
        if (q >= packs) continue;
        float d[kPack], v[kPack], o[kPack], w[kPack];
        raw_unpack(rd[k], d);
        raw_unpack(rx[k], v);
        raw_unpack(ro[k], o);
        load8(weight + q * kPack, w);
#pragma unroll
        for (int j = 0; j < kPack; j++) {
          const float nv = (v[j] - m) * s;
          const float out = o[j] + s * (d[j] * w[j] - mean_a - nv * mean_b);
          acc_w[k][j] += d[j] * nv;
          acc_b[k][j] += d[j];
          o[j] = to_f(from_f<T>(out));  // dx as stored: dsum adds these
          if constexpr (kSum) acc_s[k][j] += o[j];
        }
        store8(dxr + q * kPack, o);
      }
    }
  }
  // The groups' partials into shared memory, in group order (every group
  // covers all C columns; groups past R add nothing, groups without rows
  // zeros), then the block's row of partials out.
  for (int i = 0; i < R; i++) {
    if (i == g) {
#pragma unroll
      for (int k = 0; k < P; k++) {
        const int64_t q = t + static_cast<int64_t>(k) * 32 * W;
        if (q >= packs) continue;
#pragma unroll
        for (int j = 0; j < kPack; j++) {
          const int64_t c = q * kPack + j;
          sh_cols[c] = i == 0 ? acc_w[k][j] : sh_cols[c] + acc_w[k][j];
          sh_cols[C + c] = i == 0 ? acc_b[k][j] : sh_cols[C + c] + acc_b[k][j];
          if constexpr (kSum)
            sh_cols[2 * C + c] = i == 0 ? acc_s[k][j] : sh_cols[2 * C + c] + acc_s[k][j];
        }
      }
    }
    __syncthreads();
  }
  const int64_t n = (kSum ? 3 : 2) * C;
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
    const int64_t k = e / C, c = e - k * C;
    partial[(k * gridDim.x + blockIdx.x) * C + c] = sh_cols[e];
  }
}

// Launches the one-pass backward when the rows suit it: whole packs
// (`vec`: C % 8 == 0, every pointer 16-byte aligned) and C <= 4072. Writes
// dx and the partials of dweight, dbias and (`sum`) dsum into scratch
// ([3][blocks][C] floats, returned in *partial_out) and returns the block
// count (the finalize's chunks), or 0 when the rows do not suit it.
template <typename T, typename TW>
int64_t launch_layernorm_backward_rows(const T *dy, const T *x, const TW *weight, const float *mean,
                                       const float *rstd, T *dx, int64_t rows, int64_t C, bool vec,
                                       bool sum, float **partial_out) {
  if (!vec || C <= 0 || C > kLnbMaxCols || rows <= 0) return 0;
  const int64_t packs = C / kPack;
  const int P = packs <= 32 * kLnbWarps / 2 ? 1 : 2;  // W <= 8: two groups a block or more
  const int W = static_cast<int>((packs + 32 * P - 1) / (32 * P));
  // Two blocks an SM, the launch bounds' occupancy; more blocks would only
  // add rows of partials for the finalize to read.
  int64_t blocks = 2 * static_cast<int64_t>(sm_count());
  if (blocks > rows) blocks = rows;
  const int64_t rows_per_block = (rows + blocks - 1) / blocks;
  blocks = (rows + rows_per_block - 1) / rows_per_block;
  float *partial = static_cast<float *>(scratch(Slot::Partials, sizeof(float) * 3 * blocks * C));
  const size_t smem = sizeof(float) * (sum ? 3 : 2) * C;
  const auto launch = [&](auto kernel) {
    kernel<<<static_cast<unsigned>(blocks), kLnbThreads, smem, compute_stream()>>>(
        dy, x, weight, mean, rstd, dx, rows, C, W, rows_per_block, partial);
    check_launch();
  };
  if (P == 1)
    sum ? launch(layernorm_backward_rows<T, TW, 1, true>)
        : launch(layernorm_backward_rows<T, TW, 1, false>);
  else
    sum ? launch(layernorm_backward_rows<T, TW, 2, true>)
        : launch(layernorm_backward_rows<T, TW, 2, false>);
  *partial_out = partial;
  return blocks;
}

}  // namespace tessera::cuda
