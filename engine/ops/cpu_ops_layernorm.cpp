// CPU ops, layer normalization over the last dim, forward and backward, as
// in llm.c's layernorm_forward/backward. Data stay float32; the sums run in
// double: per row over C (cheap next to the memory traffic, and it makes the
// statistics exact to float precision whatever C is) and, in backward, the
// parameter gradients over every row (B*T terms, where float would drift).
#include <cmath>
#include <vector>

#include "ops/cpu_ops_internal.hpp"
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

    for (int64_t r = 0; r < rows; r++) {
      const float *xr = X.p + r * C;
      float *yr = Y.p + r * C;
      // Two passes over the row (it is in L1 for the second): the mean,
      // then the variance about it. Summing (x - mean)^2 rather than
      // E[x^2] - mean^2 avoids cancellation when |mean| >> std.
      double s = 0.0;
      for (int64_t j = 0; j < C; j++) s += xr[j];
      const double mu = s / static_cast<double>(C);
      double v = 0.0;
      for (int64_t j = 0; j < C; j++) {
        const double d = xr[j] - mu;
        v += d * d;
      }
      const double var = v / static_cast<double>(C);  // biased, as torch and GPT-2
      const double rs = 1.0 / std::sqrt(var + static_cast<double>(eps));
      // y from the double statistics: with the mean rounded to float first,
      // x - mean would be off by up to half an ulp of the mean, which is a
      // lot when |mean| >> std. Backward only has the float32 mean and rstd
      // below, and the difference that makes there is of the same order.
      // y may be x: each x[j] is read before y[j] is written.
      for (int64_t j = 0; j < C; j++)
        yr[j] = static_cast<float>((xr[j] - mu) * rs) * W.p[j] + B.p[j];
      M.p[r] = static_cast<float>(mu);
      R.p[r] = static_cast<float>(rs);
    }
  });
}

tsr_status layernorm_backward(tsr_host_ctx *ctx, const DLTensor *dy, const DLTensor *x,
                              const DLTensor *weight, const DLTensor *mean, const DLTensor *rstd,
                              DLTensor *dx, DLTensor *dweight, DLTensor *dbias) noexcept {
  return guarded(ctx, [&] {
    const char *op = "layernorm_backward";
    const Mat<float> X = f32(op, "x", x, 1), DY = f32(op, "dy", dy, 1),
                     W = f32(op, "weight", weight), M = f32(op, "mean", mean),
                     R = f32(op, "rstd", rstd), DX = f32(op, "dx", dx, 1),
                     DW = f32(op, "dweight", dweight), DB = f32(op, "dbias", dbias);
    const int64_t rows = X.rows, C = X.cols;
    check_like_x(op, "dy", dy, DY, x, X);
    check_like_x(op, "dx", dx, DX, x, X);
    check_numel(op, "weight", weight, W, C, "the last dim of x");
    check_numel(op, "dweight", dweight, DW, C, "the last dim of x");
    check_numel(op, "dbias", dbias, DB, C, "the last dim of x");
    check_numel(op, "mean", mean, M, rows, "one per row of x");
    check_numel(op, "rstd", rstd, R, rows, "one per row of x");
    if (C == 0 || rows == 0) return;

    // Column sums of the parameter gradients, over all rows, in double.
    // One allocation of 2 C doubles per call, small next to the rows * C
    // work; the arrays stay in cache while the rows stream past.
    std::vector<double> acc(static_cast<size_t>(2 * C), 0.0);
    double *dw_acc = acc.data(), *db_acc = acc.data() + C;

    for (int64_t r = 0; r < rows; r++) {
      const float *xr = X.p + r * C, *dyr = DY.p + r * C;
      float *dxr = DX.p + r * C;
      const float m = M.p[r], rs = R.p[r];
      // With n = (x - mean) * rstd and g = weight * dy (the gradient
      // reaching n), llm.c's formula:
      //   dx = rstd * (g - mean(g) - n * mean(g * n))
      // Pass 1: the two row means.
      double g_sum = 0.0, gn_sum = 0.0;
      for (int64_t j = 0; j < C; j++) {
        const float n = (xr[j] - m) * rs;
        const float g = W.p[j] * dyr[j];
        g_sum += g;
        gn_sum += static_cast<double>(g) * n;
      }
      const float g_mean = static_cast<float>(g_sum / static_cast<double>(C));
      const float gn_mean = static_cast<float>(gn_sum / static_cast<double>(C));
      // Pass 2: dx, and this row's share of dweight (dy * n) and dbias (dy).
      for (int64_t j = 0; j < C; j++) {
        const float n = (xr[j] - m) * rs;
        const float g = W.p[j] * dyr[j];
        db_acc[j] += dyr[j];
        dw_acc[j] += static_cast<double>(dyr[j]) * n;
        dxr[j] += rs * (g - g_mean - n * gn_mean);
      }
    }
    for (int64_t j = 0; j < C; j++) {
      DW.p[j] += static_cast<float>(dw_acc[j]);
      DB.p[j] += static_cast<float>(db_acc[j]);
    }
  });
}

}  // namespace tessera::cpu
