// CUDA ops, dropout (ABI 1.9): y = beta * y + x * keep / (1 - p) over
// float32, bfloat16 and float16 tensors, in float32 arithmetic rounded once
// to y's dtype. Each thread draws one Philox4x32-10 block (util/philox.hpp,
// the same function the CPU op calls) for four consecutive elements (one
// aligned access for the four where the tensors allow), so
// the mask is the CPU's bit for bit and nothing is stored between forward
// and backward. ABI 1.10's lowrank_dropout puts a low-rank product a @ b
// through the same mask without storing the product: each thread sums a
// column quad for a tile of rows in float32 (one fmaf a term, k rising, as
// the CPU op) and writes only y. Semantics follow
// backend/cpu/cpu_ops_dropout.cpp.
#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cpu/cpu_ops.hpp"
#include "backend/cuda/cuda_ops_internal.hpp"
#include "backend/cuda/ops_decoder.hpp"
#include "util/dltensor.hpp"
#include "util/philox.hpp"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;

// One element: x * scale where the word keeps it, added to beta * y unless
// beta is 0 (y then unread). Rounded products and sums (no contraction
// into FMA), as the CPU op.
__device__ __forceinline__ float dropped(uint32_t w, float x, float p, float scale, float beta,
                                         float y) {
  const float kept = philox::uniform24(w) >= p ? __fmul_rn(x, scale) : 0.0f;
  return beta == 0.0f ? kept : __fadd_rn(__fmul_rn(beta, y), kept);
}

template <typename T>
__global__ void dropout_kernel(const T *x, T *y, int64_t n, float p, float scale, float beta,
                               uint64_t seed, uint64_t stream) {
  const int64_t quads = (n + 3) / 4;
  for (int64_t q = global_thread(); q < quads; q += global_threads()) {
    const philox::Block b = philox::dropout_block(seed, stream, static_cast<uint64_t>(q));
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const int64_t i = q * 4 + k;
      if (i >= n) break;
      y[i] =
          from_f<T>(dropped(b.w[k], to_f(x[i]), p, scale, beta, beta == 0.0f ? 0.0f : to_f(y[i])));
    }
  }
}

// Four elements as one aligned access (8 bytes in bf16/fp16, 16 in fp32).
template <typename T>
struct alignas(4 * sizeof(T)) Quad {
  T v[4];
};

// The same, a quad per thread loaded and stored whole: where n is a
// multiple of 4 and both tensors are aligned to a quad, which LoRA's
// [rows, width] activations are. The element-wise kernel above issues four
// 2-byte accesses per quad in bf16; this one, one of 8.
template <typename T>
__global__ void dropout_quad_kernel(const Quad<T> *x, Quad<T> *y, int64_t quads, float p,
                                    float scale, float beta, uint64_t seed, uint64_t stream) {
  for (int64_t q = global_thread(); q < quads; q += global_threads()) {
    const philox::Block b = philox::dropout_block(seed, stream, static_cast<uint64_t>(q));
    const Quad<T> xq = x[q], yq = beta == 0.0f ? Quad<T>{} : y[q];
    Quad<T> out;
#pragma unroll
    for (int k = 0; k < 4; k++)
      out.v[k] = from_f<T>(dropped(b.w[k], to_f(xq.v[k]), p, scale, beta, to_f(yq.v[k])));
    y[q] = out;
  }
}

// The low-rank kernel's tile: kTileRows rows by kTileQuads column quads a
// block, a thread per column quad. The tile's rows of a sit in shared
// memory as float32 (every thread of the block reads the same word: a
// broadcast), a chunk of b's column quad in registers serves all the rows,
// and y is read (beta != 0) and written once, coalesced along the row.
constexpr int kTileRows = 8, kTileQuads = 128;
// a's rows in shared memory (float32): every rank the op takes fits the
// 48 KiB a block gets without opting in.
static_assert(kTileRows * kLowrankMaxRank * 4 <= 48 * 1024, "lowrank tile: a's rows must fit");

// s[j] += a_s[j][k + i] * b[k + i] for i < KC, one fmaf a term, k rising
// (the CPU op's order, so float32 agrees bit for bit).
template <int KC, typename T>
__device__ __forceinline__ void lowrank_terms(const float *a_s, int r, int k, const Quad<T> *b,
                                              int64_t N4, int64_t c, float (&s)[kTileRows][4]) {
  float bv[KC][4];
#pragma unroll
  for (int i = 0; i < KC; ++i) {
    const Quad<T> bq = b[static_cast<int64_t>(k + i) * N4 + c];
#pragma unroll
    for (int q = 0; q < 4; ++q) bv[i][q] = to_f(bq.v[q]);
  }
#pragma unroll
  for (int j = 0; j < kTileRows; ++j)
#pragma unroll
    for (int i = 0; i < KC; ++i) {
      const float av = a_s[j * r + k + i];
#pragma unroll
      for (int q = 0; q < 4; ++q) s[j][q] = fmaf(av, bv[i][q], s[j][q]);
    }
}

// y = beta * y + dropout(a @ b), a [M, r], b [r, N] viewed as quads [r,
// N4], y [M, N4] quads; blockIdx.x picks the rows, blockIdx.y the column
// quads. Each y quad is one Philox block (N % 4 == 0: quads never
// straddle rows).
template <typename T>
__global__ void __launch_bounds__(kTileQuads)
    lowrank_tile_kernel(const T *a, const Quad<T> *b, Quad<T> *y, int64_t M, int64_t N4, int r,
                        float p, float scale, float beta, uint64_t seed, uint64_t stream) {
  extern __shared__ float a_s[];  // [kTileRows][r]; rows past M are 0 and never written
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kTileRows;
  const int rows = M - m0 < kTileRows ? static_cast<int>(M - m0) : kTileRows;
  for (int i = threadIdx.x; i < kTileRows * r; i += blockDim.x) {
    const int j = i / r;
    a_s[i] = j < rows ? to_f(a[(m0 + j) * r + i % r]) : 0.0f;
  }
  __syncthreads();
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kTileQuads + threadIdx.x;
  if (c >= N4) return;
  float s[kTileRows][4] = {};
  int k = 0;
  for (; k + 8 <= r; k += 8) lowrank_terms<8>(a_s, r, k, b, N4, c, s);
  for (; k + 4 <= r; k += 4) lowrank_terms<4>(a_s, r, k, b, N4, c, s);
  for (; k < r; ++k) lowrank_terms<1>(a_s, r, k, b, N4, c, s);
#pragma unroll
  for (int j = 0; j < kTileRows; ++j) {
    if (j >= rows) break;
    const int64_t at = (m0 + j) * N4 + c;
    const philox::Block blk = philox::dropout_block(seed, stream, static_cast<uint64_t>(at));
    const Quad<T> yq = beta == 0.0f ? Quad<T>{} : y[at];
    Quad<T> out;
#pragma unroll
    for (int q = 0; q < 4; ++q)
      out.v[q] = from_f<T>(dropped(blk.w[q], s[j][q], p, scale, beta, to_f(yq.v[q])));
    y[at] = out;
  }
}

// The same an element a thread, for any N and alignment.
template <typename T>
__global__ void lowrank_kernel(const T *a, const T *b, T *y, int64_t M, int64_t N, int r, float p,
                               float scale, float beta, uint64_t seed, uint64_t stream) {
  for (int64_t i = global_thread(); i < M * N; i += global_threads()) {
    const int64_t m = i / N, n = i % N;
    float s = 0.0f;
    for (int k = 0; k < r; ++k) s = fmaf(to_f(a[m * r + k]), to_f(b[k * N + n]), s);
    const philox::Block blk = philox::dropout_block(seed, stream, static_cast<uint64_t>(i / 4));
    y[i] = from_f<T>(dropped(blk.w[i % 4], s, p, scale, beta, beta == 0.0f ? 0.0f : to_f(y[i])));
  }
}

}  // namespace

tsr_status lowrank_dropout(tsr_host_ctx *ctx, const DLTensor *a, const DLTensor *b, float p,
                           uint64_t seed, uint64_t stream, float beta, DLTensor *y) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "lowrank_dropout";
    if (side_of(op, {{"a", a}, {"b", b}, {"y", y}}) == Side::Host) {
      AsCpu ha(a), hb(b), hy(y);
      host_result(need_cpu(cpu_ops()->lowrank_dropout, op)(ctx, ha.p, hb.p, p, seed, stream, beta,
                                                           hy.mut()));
      return;
    }
    const View A = floating(op, "a", a), B = floating(op, "b", b), Y = floating(op, "y", y);
    check_same_dtype(op, "a", a, A, "y", y, Y);
    check_same_dtype(op, "b", b, B, "y", y, Y);
    check_lowrank_shapes(op, a, b, y);
    check_dropout_args(op, p, beta);
    const int64_t M = y->shape[0], N = y->shape[1];
    const int r = static_cast<int>(a->shape[1]);
    if (M * N == 0) return;
    const float scale = philox::dropout_scale(p);
    dispatch_float(Y.dt, [&](auto tag) {
      using T = decltype(tag);
      const auto aligned = [](const void *ptr) {
        return reinterpret_cast<uintptr_t>(ptr) % sizeof(Quad<T>) == 0;
      };
      const int64_t N4 = N / 4, tiles = (N4 + kTileQuads - 1) / kTileQuads;
      if (N % 4 == 0 && aligned(B.as<const T>()) && aligned(Y.as<T>()) && tiles <= 65535) {
        const dim3 grid(static_cast<unsigned>((M + kTileRows - 1) / kTileRows),
                        static_cast<unsigned>(tiles));
        const size_t smem = static_cast<size_t>(kTileRows) * static_cast<size_t>(r) * 4;
        lowrank_tile_kernel<T><<<grid, kTileQuads, smem, compute_stream()>>>(
            A.as<const T>(), reinterpret_cast<const Quad<T> *>(B.as<const T>()),
            reinterpret_cast<Quad<T> *>(Y.as<T>()), M, N4, r, p, scale, beta, seed, stream);
      } else {
        lowrank_kernel<T><<<grid_for(M * N, kThreads), kThreads, 0, compute_stream()>>>(
            A.as<const T>(), B.as<const T>(), Y.as<T>(), M, N, r, p, scale, beta, seed, stream);
      }
      check_launch();
    });
  });
}

tsr_status dropout(tsr_host_ctx *ctx, const DLTensor *x, float p, uint64_t seed, uint64_t stream,
                   float beta, DLTensor *y) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "dropout";
    if (side_of(op, {{"x", x}, {"y", y}}) == Side::Host) {
      AsCpu hx(x), hy(y);
      host_result(need_cpu(cpu_ops()->dropout, op)(ctx, hx.p, p, seed, stream, beta, hy.mut()));
      return;
    }
    const View X = floating(op, "x", x), Y = floating(op, "y", y);
    check_same_numel(op, "x", x, X, "y", y, Y);
    check_same_dtype(op, "x", x, X, "y", y, Y);
    check_dropout_args(op, p, beta);
    const int64_t n = X.numel();
    if (n == 0) return;
    const float scale = philox::dropout_scale(p);
    dispatch_float(X.dt, [&](auto tag) {
      using T = decltype(tag);
      const auto aligned = [](const void *ptr) {
        return reinterpret_cast<uintptr_t>(ptr) % sizeof(Quad<T>) == 0;
      };
      if (n % 4 == 0 && aligned(X.as<const T>()) && aligned(Y.as<T>()))
        dropout_quad_kernel<T><<<grid_for(n / 4, kThreads), kThreads, 0, compute_stream()>>>(
            reinterpret_cast<const Quad<T> *>(X.as<const T>()),
            reinterpret_cast<Quad<T> *>(Y.as<T>()), n / 4, p, scale, beta, seed, stream);
      else
        dropout_kernel<T><<<grid_for((n + 3) / 4, kThreads), kThreads, 0, compute_stream()>>>(
            X.as<const T>(), Y.as<T>(), n, p, scale, beta, seed, stream);
      check_launch();
    });
  });
}

}  // namespace tessera::cuda
