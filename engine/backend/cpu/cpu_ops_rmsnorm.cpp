// CPU ops, RMS normalization over the last dim (ABI 1.6): forward, the
// forward with the residual add before it, and backward, as Hugging Face's
// LlamaRMSNorm computes them in float32 (normalise, then multiply by the
// weight). Sums run in double as in cpu_ops_layernorm.cpp: per row over C,
// and the weight gradient over every row in fixed blocks of rows, so the
// results do not depend on the number of threads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_math.hpp"
#include "backend/cpu/cpu_ops_internal.hpp"
#include "backend/cpu/cpu_pool.hpp"
#include "util/error.hpp"

namespace tessera::cpu {

namespace {

constexpr int64_t kRmsGrain = 16384;
constexpr int64_t kRmsRowBlock = 64;

void rms_check_numel(const char *op, const char *arg, const DLTensor *t, const Mat<float> &m,
                     int64_t n, const char *what) {
  TSR_CHECK(m.numel() == n, TSR_ERR_INVALID,
            std::string(op) + ": " + arg + " " + describe(t) + " must have " + std::to_string(n) +
                " elements (" + what + ")");
}

void rms_check_like_x(const char *op, const char *arg, const DLTensor *t, const Mat<float> &m,
                      const DLTensor *x, const Mat<float> &X) {
  TSR_CHECK(m.rows == X.rows && m.cols == X.cols, TSR_ERR_INVALID,
            std::string(op) + ": " + arg + " " + describe(t) + " must have the shape of x " +
                describe(x) + " viewed as (rows, last dim)");
}

void rms_check_eps(const char *op, float eps) {
  TSR_CHECK(std::isfinite(eps) && eps >= 0.0f, TSR_ERR_INVALID,
            std::string(op) + ": eps must be finite and >= 0, got " + std::to_string(eps));
}

// sum of f(j) for j in [0, n), in eight double lanes added pairwise.
template <typename F>
inline double rms_lane_sum(int64_t n, F f) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; k++) acc[k] += f(j + k);
  for (; j < n; j++) acc[0] += f(j);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Rows [r0, r1): rstd from the double mean of squares, n = x * rstd rounded
// to float (HF's normalised hidden state), y = n * w. y may be x: each x[j]
// is read before y[j] is written.
TSR_OPS_CLONES void rms_forward_rows(const float *X, const float *W, float *Y, float *R, int64_t r0,
                                     int64_t r1, int64_t C, float eps) {
  for (int64_t r = r0; r < r1; r++) {
    const float *xr = X + r * C;
    float *yr = Y + r * C;
    const double ms = rms_lane_sum(C,
                                   [&](int64_t j) {
                                     const double v = xr[j];
                                     return v * v;
                                   }) /
                      static_cast<double>(C);
    const double rs = 1.0 / std::sqrt(ms + static_cast<double>(eps));
    for (int64_t j = 0; j < C; j++) yr[j] = static_cast<float>(xr[j] * rs) * W[j];
    R[r] = static_cast<float>(rs);
  }
}

void rms_forward(const Mat<float> &X, const Mat<float> &W, const Mat<float> &Y, const Mat<float> &R,
                 float eps, const float *add_x, const float *add_y) {
  const int64_t rows = X.rows, C = X.cols;
  if (C == 0) {
    for (int64_t r = 0; r < rows; r++) R.p[r] = 1.0f / std::sqrt(eps);
    return;
  }
  parallel_for(rows, std::max<int64_t>(1, kRmsGrain / C), [&](int64_t r0, int64_t r1) {
    // The residual add of a chunk just before its rows are normalised, so
    // the second read of r comes from cache.
    if (add_x)
      for (int64_t i = r0 * C; i < r1 * C; i++) X.p[i] = add_x[i] + add_y[i];
    rms_forward_rows(X.p, W.p, Y.p, R.p, r0, r1, C, eps);
  });
}

}  // namespace

tsr_status rmsnorm_forward(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *weight, float eps,
                           DLTensor *y, DLTensor *rstd) noexcept {
  return guarded(ctx, [&] {
    const char *op = "rmsnorm_forward";
    const Mat<float> X = f32(op, "x", x, 1), W = f32(op, "weight", weight), Y = f32(op, "y", y, 1),
                     R = f32(op, "rstd", rstd);
    rms_check_like_x(op, "y", y, Y, x, X);
    rms_check_numel(op, "weight", weight, W, X.cols, "the last dim of x");
    rms_check_numel(op, "rstd", rstd, R, X.rows, "one per row of x");
    rms_check_eps(op, eps);
    rms_forward(X, W, Y, R, eps, nullptr, nullptr);
  });
}

tsr_status add_rmsnorm_forward(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *y,
                               const DLTensor *weight, float eps, DLTensor *r, DLTensor *out,
                               DLTensor *rstd) noexcept {
  return guarded(ctx, [&] {
    const char *op = "add_rmsnorm_forward";
    const Mat<float> X = f32(op, "x", x, 1), Yv = f32(op, "y", y, 1), Rs = f32(op, "r", r, 1),
                     O = f32(op, "out", out, 1), W = f32(op, "weight", weight),
                     S = f32(op, "rstd", rstd);
    rms_check_like_x(op, "y", y, Yv, x, X);
    rms_check_like_x(op, "r", r, Rs, x, X);
    rms_check_like_x(op, "out", out, O, x, X);
    rms_check_numel(op, "weight", weight, W, X.cols, "the last dim of x");
    rms_check_numel(op, "rstd", rstd, S, X.rows, "one per row of x");
    rms_check_eps(op, eps);
    TSR_CHECK(O.p != X.p && O.p != Yv.p && O.p != Rs.p, TSR_ERR_INVALID,
              std::string(op) + ": out must not alias x, y or r");
    rms_forward(Rs, W, O, S, eps, X.p, Yv.p);
  });
}

namespace {

// dx rows [r0, r1): with n = x * rstd and g = w * dy,
// dx += rstd * (g - n * mean(g * n)).
TSR_OPS_CLONES void rms_dx_rows(const float *DY, const float *X, const float *W, const float *R,
                                float *DX, int64_t r0, int64_t r1, int64_t C) {
  for (int64_t r = r0; r < r1; r++) {
    const float *dy = DY + r * C, *xr = X + r * C;
    float *dx = DX + r * C;
    const double rs = R[r];
    const double gn =
        rms_lane_sum(C,
                     [&](int64_t j) { return static_cast<double>(W[j]) * dy[j] * (xr[j] * rs); }) /
        static_cast<double>(C);
    // dx may be dy: dy[j] is read before dx[j] is written.
    for (int64_t j = 0; j < C; j++) {
      const double n = xr[j] * rs, g = static_cast<double>(W[j]) * dy[j];
      dx[j] = static_cast<float>(dx[j] + rs * (g - n * gn));
    }
  }
}

// dweight's partial of rows [r0, r1) into pw[0..C): dy * n in double.
TSR_OPS_CLONES void rms_dw_rows(const float *DY, const float *X, const float *R, double *pw,
                                int64_t r0, int64_t r1, int64_t C) {
  for (int64_t r = r0; r < r1; r++) {
    const double rs = R[r];
    const float *dyr = DY + r * C, *xr = X + r * C;
    for (int64_t j = 0; j < C; j++) pw[j] += dyr[j] * (xr[j] * rs);
  }
}

// dweight += sum over rows of dy * n, before dx (it reads dy, which dx may
// alias): per fixed block of rows a double partial, the partials added in
// block order.
void rms_dweight(const Mat<float> &DY, const Mat<float> &X, const Mat<float> &R,
                 const Mat<float> &DW) {
  const int64_t rows = X.rows, C = X.cols;
  const int64_t blocks = (rows + kRmsRowBlock - 1) / kRmsRowBlock;
  std::vector<double> part(static_cast<size_t>(blocks * C), 0.0);
  parallel_for(blocks, std::max<int64_t>(1, kRmsGrain / (kRmsRowBlock * C)),
               [&](int64_t b0, int64_t b1) {
                 for (int64_t b = b0; b < b1; b++)
                   rms_dw_rows(DY.p, X.p, R.p, part.data() + b * C, b * kRmsRowBlock,
                               std::min(rows, (b + 1) * kRmsRowBlock), C);
               });
  for (int64_t j = 0; j < C; j++) {
    double s = 0.0;
    for (int64_t b = 0; b < blocks; b++) s += part[b * C + j];
    DW.p[j] = static_cast<float>(DW.p[j] + s);
  }
}

}  // namespace

tsr_status rmsnorm_backward(tsr_host_ctx *ctx, const DLTensor *dy, const DLTensor *x,
                            const DLTensor *weight, const DLTensor *rstd, DLTensor *dx,
                            DLTensor *dweight) noexcept {
  return guarded(ctx, [&] {
    const char *op = "rmsnorm_backward";
    const Mat<float> DY = f32(op, "dy", dy, 1), X = f32(op, "x", x, 1),
                     W = f32(op, "weight", weight), R = f32(op, "rstd", rstd),
                     DX = f32(op, "dx", dx, 1);
    const int64_t rows = X.rows, C = X.cols;
    rms_check_like_x(op, "dy", dy, DY, x, X);
    rms_check_like_x(op, "dx", dx, DX, x, X);
    rms_check_numel(op, "weight", weight, W, C, "the last dim of x");
    rms_check_numel(op, "rstd", rstd, R, rows, "one per row of x");
    // ABI 1.11: no dweight, no weight gradient (a frozen weight).
    Mat<float> DW{};
    if (dweight) {
      DW = f32(op, "dweight", dweight);
      rms_check_numel(op, "dweight", dweight, DW, C, "the last dim of x");
    }
    if (rows == 0 || C == 0) return;
    if (dweight) rms_dweight(DY, X, R, DW);
    parallel_for(rows, std::max<int64_t>(1, kRmsGrain / C), [&](int64_t r0, int64_t r1) {
      rms_dx_rows(DY.p, X.p, W.p, R.p, DX.p, r0, r1, C);
    });
  });
}

}  // namespace tessera::cpu
