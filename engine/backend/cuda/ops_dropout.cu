// CUDA ops, dropout (ABI 1.9): y = beta * y + x * keep / (1 - p) over
// float32, bfloat16 and float16 tensors, in float32 arithmetic rounded once
// to y's dtype. Each thread draws one Philox4x32-10 block (util/philox.hpp,
// the same function the CPU op calls) for four consecutive elements (one
// aligned access for the four where the tensors allow), so
// the mask is the CPU's bit for bit and nothing is stored between forward
// and backward. ABI 1.10's lowrank_dropout puts a low-rank product a @ b
// through the same mask without storing the product: each thread sums a
// column quad for a few rows in float32 (one fmaf a term, k rising, as the
// CPU op) and writes only y. Semantics follow
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

// Rows a thread of the low-rank kernel sums: a quad of b loaded once
// serves all of them, and a's elements are the same across a warp (one
// broadcast load).
constexpr int kLowrankRows = 4;

// y = beta * y + dropout(a @ b), a [M, r], b [r, N] viewed as quads [r,
// N4], y [M, N4] quads: a thread per (group of kLowrankRows rows, column
// quad), consecutive threads along the row so b and y are read coalesced.
// Each y quad is one Philox block (N % 4 == 0: quads never straddle rows).
template <typename T>
__global__ void lowrank_quad_kernel(const T *a, const Quad<T> *b, Quad<T> *y, int64_t M, int64_t N4,
                                    int r, float p, float scale, float beta, uint64_t seed,
                                    uint64_t stream) {
  const int64_t groups = (M + kLowrankRows - 1) / kLowrankRows;
  for (int64_t w = global_thread(); w < groups * N4; w += global_threads()) {
    const int64_t m0 = (w / N4) * kLowrankRows, c = w % N4;
    float s[kLowrankRows][4] = {};
    for (int k = 0; k < r; ++k) {
      const Quad<T> bq = b[static_cast<int64_t>(k) * N4 + c];
#pragma unroll
      for (int j = 0; j < kLowrankRows; ++j) {
        // Rows past M read row M - 1 (in bounds) and are never written.
        const int64_t m = m0 + j < M ? m0 + j : M - 1;
        const float av = to_f(a[m * r + k]);
#pragma unroll
        for (int q = 0; q < 4; ++q) s[j][q] = fmaf(av, to_f(bq.v[q]), s[j][q]);
      }
    }
#pragma unroll
    for (int j = 0; j < kLowrankRows; ++j) {
      const int64_t m = m0 + j;
      if (m >= M) break;
      const int64_t at = m * N4 + c;
      const philox::Block blk = philox::dropout_block(seed, stream, static_cast<uint64_t>(at));
      const Quad<T> yq = beta == 0.0f ? Quad<T>{} : y[at];
      Quad<T> out;
#pragma unroll
      for (int q = 0; q < 4; ++q)
        out.v[q] = from_f<T>(dropped(blk.w[q], s[j][q], p, scale, beta, to_f(yq.v[q])));
      y[at] = out;
    }
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
      if (N % 4 == 0 && aligned(B.as<const T>()) && aligned(Y.as<T>())) {
        const int64_t N4 = N / 4, work = (M + kLowrankRows - 1) / kLowrankRows * N4;
        lowrank_quad_kernel<T><<<grid_for(work, kThreads), kThreads, 0, compute_stream()>>>(
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
