// CPU ops, SwiGLU's gate (ABI 1.6): out = silu(gate) * up and its backward,
// element-wise over [rows, F], computed in double and rounded once. A 2-D
// argument may carry a row stride, so gate and up may be the two halves of
// one [rows, 2F] linear output (and dgate, dup of its gradient).
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_ops_internal.hpp"
#include "backend/cpu/cpu_pool.hpp"
#include "util/error.hpp"

namespace tessera::cpu {

namespace {

// [rows, cols] float32 with row stride ld (>= cols), unit column stride.
struct SwigluRows {
  float *p;
  int64_t rows, cols, ld;
  float *row(int64_t r) const { return p + r * ld; }
};

SwigluRows swiglu_rows(const char *op, const char *arg, const DLTensor *t) {
  if (t && t->ndim == 2 && t->shape && t->strides && (t->strides[1] == 1 || t->shape[1] <= 1) &&
      t->shape[0] > 1 && t->strides[0] != t->shape[1]) {
    // A strided 2-D view: check it as its compact [rows, ld] span would be,
    // then narrow the columns.
    const std::string w = std::string(op) + ": " + arg + " ";
    TSR_CHECK(t->shape[1] >= 0 && t->strides[0] >= t->shape[1], TSR_ERR_UNSUPPORTED,
              w + describe(t) + " has row stride " + std::to_string(t->strides[0]) +
                  ", less than its row length");
    DLTensor span = *t;
    int64_t shape[2] = {t->shape[0], t->strides[0]};
    span.shape = shape;
    span.strides = nullptr;
    const Mat<float> m = f32(op, arg, &span, 2);
    return SwigluRows{m.p, t->shape[0], t->shape[1], t->strides[0]};
  }
  const Mat<float> m = f32(op, arg, t, 1);
  return SwigluRows{m.p, m.rows, m.cols, m.cols};
}

void swiglu_check_like(const char *op, const char *arg, const DLTensor *t, const SwigluRows &v,
                       const DLTensor *gate, const SwigluRows &g) {
  TSR_CHECK(v.rows == g.rows && v.cols == g.cols, TSR_ERR_INVALID,
            std::string(op) + ": " + arg + " " + describe(t) + " must have the shape of gate " +
                describe(gate) + " viewed as (rows, last dim)");
}

inline double swiglu_sigmoid(double g) {
  return 1.0 / (1.0 + std::exp(-g));
}

constexpr int64_t kSwigluGrain = 16384;

}  // namespace

tsr_status swiglu_forward(tsr_host_ctx *ctx, const DLTensor *gate, const DLTensor *up,
                          DLTensor *out) noexcept {
  return guarded(ctx, [&] {
    const char *op = "swiglu_forward";
    const SwigluRows G = swiglu_rows(op, "gate", gate), U = swiglu_rows(op, "up", up),
                     O = swiglu_rows(op, "out", out);
    swiglu_check_like(op, "up", up, U, gate, G);
    swiglu_check_like(op, "out", out, O, gate, G);
    if (G.cols == 0) return;
    parallel_for(G.rows, std::max<int64_t>(1, kSwigluGrain / G.cols), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; r++) {
        const float *g = G.row(r), *u = U.row(r);
        float *o = O.row(r);
        for (int64_t j = 0; j < G.cols; j++) {
          const double gv = g[j];
          o[j] = static_cast<float>(gv * swiglu_sigmoid(gv) * u[j]);
        }
      }
    });
  });
}

tsr_status swiglu_backward(tsr_host_ctx *ctx, const DLTensor *gate, const DLTensor *up,
                           const DLTensor *dout, DLTensor *dgate, DLTensor *dup) noexcept {
  return guarded(ctx, [&] {
    const char *op = "swiglu_backward";
    const SwigluRows G = swiglu_rows(op, "gate", gate), U = swiglu_rows(op, "up", up),
                     D = swiglu_rows(op, "dout", dout), DG = swiglu_rows(op, "dgate", dgate),
                     DU = swiglu_rows(op, "dup", dup);
    swiglu_check_like(op, "up", up, U, gate, G);
    swiglu_check_like(op, "dout", dout, D, gate, G);
    swiglu_check_like(op, "dgate", dgate, DG, gate, G);
    swiglu_check_like(op, "dup", dup, DU, gate, G);
    if (G.cols == 0) return;
    parallel_for(G.rows, std::max<int64_t>(1, kSwigluGrain / G.cols), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; r++) {
        const float *g = G.row(r), *u = U.row(r), *d = D.row(r);
        float *dg = DG.row(r), *du = DU.row(r);
        for (int64_t j = 0; j < G.cols; j++) {
          // Everything read before either write: dgate may be gate, dup up.
          const double gv = g[j], uv = u[j], dv = d[j], s = swiglu_sigmoid(gv);
          dg[j] = static_cast<float>(dv * uv * (s * (1.0 + gv * (1.0 - s))));
          du[j] = static_cast<float>(dv * gv * s);
        }
      }
    });
  });
}

}  // namespace tessera::cpu
