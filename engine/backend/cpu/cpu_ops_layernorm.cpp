// CPU ops, layer normalization over the last dim, forward and backward, as
// in llm.c's layernorm_forward/backward. Data stay float32; the sums run in
// double: per row over C (cheap next to the memory traffic, and it makes the
// statistics exact to float precision whatever C is) and, in backward, the
// parameter gradients over every row (B*T terms, where float would drift).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_math.hpp"
#include "backend/cpu/cpu_ops_internal.hpp"
#include "backend/cpu/cpu_pool.hpp"
#include "util/error.hpp"

namespace tessera::cpu {

// Throws unless t holds exactly n elements: weight, bias, mean, rstd.
static void check_numel(const char *op, const char *arg, const DLTensor *t, const Mat<float> &m,
                        int64_t n, const char *what) {
  TSR_CHECK(m.numel() == n, TSR_ERR_INVALID,
            std::string(op) + ": " + arg + " " + describe(t) + " must have " + std::to_string(n) +
                " elements (" + what + ")");
}

// Throws unless t views as the same (rows, C) matrix as x.
static void check_like_x(const char *op, const char *arg, const DLTensor *t, const Mat<float> &m,
                         const DLTensor *x, const Mat<float> &X) {
  TSR_CHECK(m.rows == X.rows && m.cols == X.cols, TSR_ERR_INVALID,
            std::string(op) + ": " + arg + " " + describe(t) + " must have the shape of x " +
                describe(x) + " viewed as (rows, last dim)");
}

// Items per pool chunk, and rows per block of the backward's parameter
// sums (fixed, so the sums do not depend on the number of threads).
constexpr int64_t kGrain = 16384;
constexpr int64_t kRowBlock = 64;

// sum of f(j) for j in [0, n), in eight double lanes added pairwise.
template <typename F>
static inline double lane_sum(int64_t n, F f) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; k++) acc[k] += f(j + k);
  for (; j < n; j++) acc[0] += f(j);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Rows [r0, r1) of the forward. Two passes over each row (it is in L1 for
// the second): the mean, then the variance about it; summing (x - mean)^2
// rather than E[x^2] - mean^2 avoids cancellation when |mean| >> std. The
// sums run in eight double lanes, a fixed order the compiler can vectorize.
TSR_OPS_CLONES static void forward_rows(const float *X, const float *W, const float *B, float *Y,
                                        float *M, float *R, int64_t r0, int64_t r1, int64_t C,
                                        float eps) {
  for (int64_t r = r0; r < r1; r++) {
    const float *xr = X + r * C;
    float *yr = Y + r * C;
    const double mu =
        lane_sum(C, [&](int64_t j) { return static_cast<double>(xr[j]); }) / static_cast<double>(C);
    const double var = lane_sum(C,
                                [&](int64_t j) {
                                  const double d = xr[j] - mu;
                                  return d * d;
                                }) /
                       static_cast<double>(C);  // biased, as torch and GPT-2
    const double rs = 1.0 / std::sqrt(var + static_cast<double>(eps));
    // y from the double statistics: with the mean rounded to float first,
    // x - mean would be off by up to half an ulp of the mean, which is a
    // lot when |mean| >> std. Backward only has the float32 mean and rstd,
    // and the difference that makes there is of the same order. y may be
    // x: each x[j] is read before y[j] is written.
    for (int64_t j = 0; j < C; j++) yr[j] = static_cast<float>((xr[j] - mu) * rs) * W[j] + B[j];
    M[r] = static_cast<float>(mu);
    R[r] = static_cast<float>(rs);
  }
}

tsr_status layernorm_forward(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *weight,
                             const DLTensor *bias, float eps, DLTensor *y, DLTensor *mean,
                             DLTensor *rstd) noexcept {
  return guarded(ctx, [&] {
    const char *op = "layernorm_forward";
    const Mat<float> X = f32(op, "x", x, 1), W = f32(op, "weight", weight),
                     B = f32(op, "bias", bias), Y = f32(op, "y", y, 1), M = f32(op, "mean", mean),
                     R = f32(op, "rstd", rstd);
    const int64_t rows = X.rows, C = X.cols;
    check_like_x(op, "y", y, Y, x, X);
    check_numel(op, "weight", weight, W, C, "the last dim of x");
    check_numel(op, "bias", bias, B, C, "the last dim of x");
    check_numel(op, "mean", mean, M, rows, "one per row of x");
    check_numel(op, "rstd", rstd, R, rows, "one per row of x");
    TSR_CHECK(std::isfinite(eps) && eps >= 0.0f, TSR_ERR_INVALID,
              std::string(op) + ": eps must be finite and >= 0, got " + std::to_string(eps));
    if (C == 0) {
      // No features: nothing to normalize; the statistics are conventions.
      for (int64_t r = 0; r < rows; r++) {
        M.p[r] = 0.0f;
        R.p[r] = 1.0f / std::sqrt(eps);
      }
      return;
    }

    parallel_for(rows, std::max<int64_t>(1, kGrain / C), [&](int64_t r0, int64_t r1) {
      forward_rows(X.p, W.p, B.p, Y.p, M.p, R.p, r0, r1, C, eps);
    });
  });
}

// r = x + y over rows [r0, r1), then those rows of the forward on r as
// stored: the same bits as axpy followed by layernorm_forward. A chunk's
// rows are summed just before they are normalized, so the second read of
// r comes from cache. r may be x or y: each element is read before r[j] is
// written, by the same iteration.
TSR_OPS_CLONES static void add_rows(const float *X, const float *Y, float *Rs, int64_t r0,
                                    int64_t r1, int64_t C) {
  for (int64_t i = r0 * C; i < r1 * C; i++) Rs[i] = X[i] + Y[i];
}

tsr_status add_layernorm_forward(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *y,
                                 const DLTensor *weight, const DLTensor *bias, float eps,
                                 DLTensor *r, DLTensor *out, DLTensor *mean,
                                 DLTensor *rstd) noexcept {
  return guarded(ctx, [&] {
    const char *op = "add_layernorm_forward";
    const Mat<float> X = f32(op, "x", x, 1), Y = f32(op, "y", y, 1), Rs = f32(op, "r", r, 1),
                     W = f32(op, "weight", weight), B = f32(op, "bias", bias),
                     O = f32(op, "out", out, 1), M = f32(op, "mean", mean),
                     R = f32(op, "rstd", rstd);
    const int64_t rows = X.rows, C = X.cols;
    check_like_x(op, "y", y, Y, x, X);
    check_like_x(op, "r", r, Rs, x, X);
    check_like_x(op, "out", out, O, x, X);
    check_numel(op, "weight", weight, W, C, "the last dim of x");
    check_numel(op, "bias", bias, B, C, "the last dim of x");
    check_numel(op, "mean", mean, M, rows, "one per row of x");
    check_numel(op, "rstd", rstd, R, rows, "one per row of x");
    TSR_CHECK(std::isfinite(eps) && eps >= 0.0f, TSR_ERR_INVALID,
              std::string(op) + ": eps must be finite and >= 0, got " + std::to_string(eps));
    // out is written while r is still read: it may not share memory with
    // any input (r itself may be x or y, which the row loops allow).
    const auto overlaps = [&](const Mat<float> &a) {
      return a.numel() > 0 && O.numel() > 0 && a.p < O.p + O.numel() && O.p < a.p + a.numel();
    };
    TSR_CHECK(!overlaps(X) && !overlaps(Y) && !overlaps(Rs), TSR_ERR_INVALID,
              std::string(op) + ": out " + describe(out) + " overlaps x, y or r in memory");
    if (C == 0) {
      for (int64_t i = 0; i < rows; i++) {
        M.p[i] = 0.0f;
        R.p[i] = 1.0f / std::sqrt(eps);
      }
      return;
    }
    parallel_for(rows, std::max<int64_t>(1, kGrain / C), [&](int64_t r0, int64_t r1) {
      add_rows(X.p, Y.p, Rs.p, r0, r1, C);
      forward_rows(Rs.p, W.p, B.p, O.p, M.p, R.p, r0, r1, C, eps);
    });
  });
}

// Rows [r0, r1) of the backward: dx, and the rows' sums of dweight (dy * n)
// and dbias (dy) into acc[0, C) and acc[C, 2C).
TSR_OPS_CLONES static void backward_rows(const float *X, const float *DY, const float *W,
                                         const float *M, const float *R, float *DX, double *acc,
                                         int64_t r0, int64_t r1, int64_t C) {
  double *dw_acc = acc, *db_acc = acc + C;
  for (int64_t j = 0; j < 2 * C; j++) acc[j] = 0.0;
  for (int64_t r = r0; r < r1; r++) {
    const float *xr = X + r * C, *dyr = DY + r * C;
    float *dxr = DX + r * C;
    const float m = M[r], rs = R[r];
    // With n = (x - mean) * rstd and g = weight * dy (the gradient reaching
    // n), llm.c's formula:
    //   dx = rstd * (g - mean(g) - n * mean(g * n))
    // Pass 1: the two row means.
    const double g_sum = lane_sum(C, [&](int64_t j) { return double(W[j] * dyr[j]); });
    const double gn_sum = lane_sum(C, [&](int64_t j) {
      const float n = (xr[j] - m) * rs;
      return static_cast<double>(W[j] * dyr[j]) * n;
    });
    const float g_mean = static_cast<float>(g_sum / static_cast<double>(C));
    const float gn_mean = static_cast<float>(gn_sum / static_cast<double>(C));
    // Pass 2: dx, and this row's share of dweight and dbias.
    for (int64_t j = 0; j < C; j++) {
      const float n = (xr[j] - m) * rs;
      const float g = W[j] * dyr[j];
      db_acc[j] += dyr[j];
      dw_acc[j] += static_cast<double>(dyr[j]) * n;
      dxr[j] += rs * (g - g_mean - n * gn_mean);
    }
  }
}

namespace {

// layernorm_backward under `op`'s name and, with dsum (ABI 1.4's
// layernorm_backward_sum), then bias_grad's column sums of dx: the
// sequence itself, so the CPU gives the sequence's bits. Every check runs
// before anything is written.
void layernorm_backward_impl(const char *op, const DLTensor *dy, const DLTensor *x,
                             const DLTensor *weight, const DLTensor *mean, const DLTensor *rstd,
                             DLTensor *dx, DLTensor *dweight, DLTensor *dbias, DLTensor *dsum) {
  const Mat<float> X = f32(op, "x", x, 1), DY = f32(op, "dy", dy, 1), W = f32(op, "weight", weight),
                   M = f32(op, "mean", mean), R = f32(op, "rstd", rstd), DX = f32(op, "dx", dx, 1),
                   DW = f32(op, "dweight", dweight), DB = f32(op, "dbias", dbias);
  const int64_t rows = X.rows, C = X.cols;
  check_like_x(op, "dy", dy, DY, x, X);
  check_like_x(op, "dx", dx, DX, x, X);
  check_numel(op, "weight", weight, W, C, "the last dim of x");
  check_numel(op, "dweight", dweight, DW, C, "the last dim of x");
  check_numel(op, "dbias", dbias, DB, C, "the last dim of x");
  check_numel(op, "mean", mean, M, rows, "one per row of x");
  check_numel(op, "rstd", rstd, R, rows, "one per row of x");
  Mat<float> S{};
  if (dsum) {
    S = f32(op, "dsum", dsum);
    check_numel(op, "dsum", dsum, S, C, "the last dim of x");
    const auto apart = [&](const Mat<float> &o) {
      return o.p + o.numel() <= S.p || S.p + S.numel() <= o.p;
    };
    TSR_CHECK(apart(DX) && apart(DY), TSR_ERR_INVALID,
              std::string(op) + ": dsum " + describe(dsum) + " overlaps dx or dy in memory");
  }
  if (C == 0 || rows == 0) return;

  // The parameter gradients' column sums in double, per fixed block of
  // rows (each block's on one thread), then the blocks added in order.
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  thread_local std::vector<double> sums;  // grow-only: no allocation per step
  if (sums.size() < static_cast<size_t>(blocks * 2 * C))
    sums.resize(static_cast<size_t>(blocks * 2 * C));
  double *part = sums.data();  // this thread's: a worker naming `sums` would get its own
  parallel_for(blocks, std::max<int64_t>(1, kGrain / (C * kRowBlock)), [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; blk++)
      backward_rows(X.p, DY.p, W.p, M.p, R.p, DX.p, part + blk * 2 * C, blk * kRowBlock,
                    std::min(rows, (blk + 1) * kRowBlock), C);
  });
  for (int64_t j = 0; j < C; j++) {
    double dw = 0.0, db = 0.0;
    for (int64_t blk = 0; blk < blocks; blk++) {
      dw += part[blk * 2 * C + j];
      db += part[blk * 2 * C + C + j];
    }
    DW.p[j] += static_cast<float>(dw);
    DB.p[j] += static_cast<float>(db);
  }
  // ABI 1.4's dsum: bias_grad's column sums of dx as stored.
  if (dsum) add_col_sums(DX, S, 1.0);
}

}  // namespace

tsr_status layernorm_backward(tsr_host_ctx *ctx, const DLTensor *dy, const DLTensor *x,
                              const DLTensor *weight, const DLTensor *mean, const DLTensor *rstd,
                              DLTensor *dx, DLTensor *dweight, DLTensor *dbias) noexcept {
  return guarded(ctx, [&] {
    layernorm_backward_impl("layernorm_backward", dy, x, weight, mean, rstd, dx, dweight, dbias,
                            nullptr);
  });
}

tsr_status layernorm_backward_sum(tsr_host_ctx *ctx, const DLTensor *dy, const DLTensor *x,
                                  const DLTensor *weight, const DLTensor *mean,
                                  const DLTensor *rstd, DLTensor *dx, DLTensor *dweight,
                                  DLTensor *dbias, DLTensor *dsum) noexcept {
  return guarded(ctx, [&] {
    layernorm_backward_impl("layernorm_backward_sum", dy, x, weight, mean, rstd, dx, dweight, dbias,
                            dsum);
  });
}

}  // namespace tessera::cpu
