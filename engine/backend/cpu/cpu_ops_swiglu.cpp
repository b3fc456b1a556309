// CPU ops, SwiGLU's gate (ABI 1.6): out = silu(gate) * up and its backward,
// element-wise over [rows, F], in float32 with the vectorised exp_v (a
// few ulps; in double with std::exp the loops did not vectorise and took
// a tenth of a llama-tiny-cpu step). A 2-D argument may carry a row
// stride, so gate and up may be the two halves of one [rows, 2F] linear
// output (and dgate, dup of its gradient). ABI 1.12's swiglu_backward_out
// writes the forward's output again beside the gradients, from one read.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_math.hpp"
#include "backend/cpu/cpu_ops_internal.hpp"
#include "backend/cpu/cpu_pool.hpp"
#include "util/dltensor.hpp"
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

TSR_OPS_CLONES void swiglu_row(const float *g, const float *u, float *o, int64_t n) {
  for (int64_t j = 0; j < n; j++) {
    const float gv = g[j], s = 1.0f / (1.0f + exp_v(-gv));
    o[j] = gv * s * u[j];
  }
}

// Each element read before either write: dgate may be gate, dup up.
TSR_OPS_CLONES void swiglu_grad_row(const float *g, const float *u, const float *d, float *dg,
                                    float *du, int64_t n) {
  for (int64_t j = 0; j < n; j++) {
    const float gv = g[j], uv = u[j], dv = d[j], s = 1.0f / (1.0f + exp_v(-gv));
    dg[j] = dv * uv * (s * (1.0f + gv * (1.0f - s)));
    du[j] = dv * gv * s;
  }
}

// Both: the forward's output and the gradients, each as the two loops above
// compute it (the same bits). out is its own tensor (check_apart), which
// __restrict says: without it GCC gives up the alias checks of six
// pointers and leaves the loop scalar (3.6x slower).
TSR_OPS_CLONES void swiglu_grad_out_row(const float *g, const float *u, const float *d, float *dg,
                                        float *du, float *__restrict o, int64_t n) {
  for (int64_t j = 0; j < n; j++) {
    const float gv = g[j], uv = u[j], dv = d[j], s = 1.0f / (1.0f + exp_v(-gv));
    o[j] = gv * s * uv;
    dg[j] = dv * uv * (s * (1.0f + gv * (1.0f - s)));
    du[j] = dv * gv * s;
  }
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
      for (int64_t r = r0; r < r1; r++) swiglu_row(G.row(r), U.row(r), O.row(r), G.cols);
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
      for (int64_t r = r0; r < r1; r++)
        swiglu_grad_row(G.row(r), U.row(r), D.row(r), DG.row(r), DU.row(r), G.cols);
    });
  });
}

tsr_status swiglu_backward_out(tsr_host_ctx *ctx, const DLTensor *gate, const DLTensor *up,
                               const DLTensor *dout, DLTensor *dgate, DLTensor *dup,
                               DLTensor *out) noexcept {
  return guarded(ctx, [&] {
    const char *op = "swiglu_backward_out";
    const SwigluRows G = swiglu_rows(op, "gate", gate), U = swiglu_rows(op, "up", up),
                     D = swiglu_rows(op, "dout", dout), DG = swiglu_rows(op, "dgate", dgate),
                     DU = swiglu_rows(op, "dup", dup), O = swiglu_rows(op, "out", out);
    swiglu_check_like(op, "up", up, U, gate, G);
    swiglu_check_like(op, "dout", dout, D, gate, G);
    swiglu_check_like(op, "dgate", dgate, DG, gate, G);
    swiglu_check_like(op, "dup", dup, DU, gate, G);
    swiglu_check_like(op, "out", out, O, gate, G);
    if (G.cols == 0 || G.rows == 0) return;
    check_apart(op, "out", out,
                {{"gate", gate}, {"up", up}, {"dout", dout}, {"dgate", dgate}, {"dup", dup}});
    parallel_for(G.rows, std::max<int64_t>(1, kSwigluGrain / G.cols), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; r++)
        swiglu_grad_out_row(G.row(r), U.row(r), D.row(r), DG.row(r), DU.row(r), O.row(r), G.cols);
    });
  });
}

}  // namespace tessera::cpu
