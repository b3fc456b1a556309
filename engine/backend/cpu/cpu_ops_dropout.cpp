// CPU ops, dropout (ABI 1.9): y = beta * y + x * keep / (1 - p), the mask
// drawn from Philox4x32-10 by element index (util/philox.hpp, the layout in
// sdk ops.h), so it is the same mask the CUDA op draws and needs no
// storage: backward and a recomputed forward draw it again. Blocks of four
// elements (one Philox call each) on the ops' pool; the mask does not
// depend on how the blocks are split. ABI 1.10's lowrank_dropout puts a
// low-rank product a @ b through the same mask, each element's sum one
// fused multiply-add a term in rising k, as the CUDA kernel adds it.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/cpu_math.hpp"
#include "backend/cpu/cpu_ops_internal.hpp"
#include "backend/cpu/cpu_pool.hpp"
#include "util/dltensor.hpp"
#include "util/error.hpp"
#include "util/philox.hpp"

namespace tessera::cpu {

namespace {

// One element of a dropped result: kept * scale where the word keeps it,
// added to beta * y unless beta is 0 (y then unread: it may hold anything,
// NaN included). Rounded products and sums, as the CUDA kernels.
inline float dropped(uint32_t w, float x, float p, float scale, float beta, float y) {
  const float kept = philox::uniform24(w) >= p ? x * scale : 0.0f;
  return beta == 0.0f ? kept : beta * y + kept;
}

// Elements [i0, i1) of the tensor, i0 a multiple of 4.
TSR_OPS_CLONES void dropout_span(const float *x, float *y, int64_t i0, int64_t i1, float p,
                                 float scale, float beta, uint64_t seed, uint64_t stream) {
  for (int64_t i = i0; i < i1; i += 4) {
    const philox::Block b = philox::dropout_block(seed, stream, static_cast<uint64_t>(i) / 4);
    const int64_t n = i1 - i < 4 ? i1 - i : 4;
    for (int64_t k = 0; k < n; k++)
      y[i + k] = dropped(b.w[k], x[i + k], p, scale, beta, beta == 0.0f ? 0.0f : y[i + k]);
  }
}

// Rows [m0, m1) of y = beta * y + dropout(a @ b), a [M, r], b [r, N]; `s`
// holds a row of sums. The row's elements go to Philox in blocks of four
// by their index in y, which may straddle rows when N % 4 != 0.
TSR_OPS_CLONES void lowrank_rows(const float *a, const float *b, float *y, int64_t m0, int64_t m1,
                                 int64_t r, int64_t N, float p, float scale, float beta,
                                 uint64_t seed, uint64_t stream, float *s) {
  for (int64_t m = m0; m < m1; ++m) {
    std::fill(s, s + N, 0.0f);
    for (int64_t k = 0; k < r; ++k) {
      const float av = a[m * r + k];
      const float *bk = b + k * N;
      for (int64_t n = 0; n < N; ++n) s[n] = std::fma(av, bk[n], s[n]);
    }
    float *yr = y + m * N;
    for (int64_t n = 0; n < N;) {
      const int64_t i = m * N + n;
      const philox::Block blk = philox::dropout_block(seed, stream, static_cast<uint64_t>(i) / 4);
      const int64_t end = std::min(N, n + (4 - i % 4));
      for (; n < end; ++n)
        yr[n] = dropped(blk.w[(m * N + n) % 4], s[n], p, scale, beta, beta == 0.0f ? 0.0f : yr[n]);
    }
  }
}

}  // namespace

tsr_status lowrank_dropout(tsr_host_ctx *ctx, const DLTensor *a, const DLTensor *b, float p,
                           uint64_t seed, uint64_t stream, float beta, DLTensor *y) noexcept {
  return guarded(ctx, [&] {
    const char *op = "lowrank_dropout";
    const Mat<float> A = f32(op, "a", a), B = f32(op, "b", b), Y = f32(op, "y", y);
    check_lowrank_shapes(op, a, b, y);
    check_dropout_args(op, p, beta);
    const float scale = philox::dropout_scale(p);
    const int64_t M = Y.rows, N = Y.cols, r = A.cols;
    if (M * N == 0) return;
    parallel_for(M, std::max<int64_t>(1, 65536 / N), [&](int64_t m0, int64_t m1) {
      std::vector<float> s(static_cast<size_t>(N));
      lowrank_rows(A.p, B.p, Y.p, m0, m1, r, N, p, scale, beta, seed, stream, s.data());
    });
  });
}

tsr_status dropout(tsr_host_ctx *ctx, const DLTensor *x, float p, uint64_t seed, uint64_t stream,
                   float beta, DLTensor *y) noexcept {
  return guarded(ctx, [&] {
    const char *op = "dropout";
    const Mat<float> X = f32(op, "x", x), Y = f32(op, "y", y);
    check_same_numel(op, "x", x, "y", y);
    check_dropout_args(op, p, beta);
    const float scale = philox::dropout_scale(p);
    const int64_t n = X.numel(), quads = (n + 3) / 4;
    parallel_for(quads, 4096, [&](int64_t q0, int64_t q1) {
      dropout_span(X.p, Y.p, q0 * 4, std::min(n, q1 * 4), p, scale, beta, seed, stream);
    });
  });
}

}  // namespace tessera::cpu
