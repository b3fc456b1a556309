// CPU ops, part 2: the layer pieces: bias + activation, activation forward
// and backward, bias gradient, softmax cross-entropy. float32 throughout, with
// double only where sums run long (bias_grad columns, the softmax normalizer,
// the loss).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_math.hpp"
#include "backend/cpu/cpu_ops_internal.hpp"
#include "backend/cpu/cpu_pool.hpp"
#include "util/error.hpp"

namespace tessera::cpu {

// ---------------------------------------------------------------------------
// Activations. Each is a small functor so the switch on `act` happens once per
// call and the inner loop is a plain map the compiler can inline. tanh comes
// from cpu_math.hpp, not libm, so these loops vectorize; each chunk of a
// large map runs on the ops' thread pool, in the widest vector code the
// processor has (TSR_OPS_CLONES).

// sqrt(2/pi) and the cubic coefficient of the tanh approximation of GELU, as
// GPT-2 and torch's approximate="tanh" use.
static constexpr float kGeluS = 0.7978845608028654f;
static constexpr float kGeluC = 0.044715f;

struct Identity {
  float operator()(float x) const { return x; }
};
struct Relu {
  // `x < 0 ? 0 : x` rather than fmaxf so a NaN stays visible.
  float operator()(float x) const { return x < 0.0f ? 0.0f : x; }
};
struct Tanh {
  float operator()(float x) const { return tanh_v(x); }
};
struct Gelu {
  float operator()(float x) const {
    // Past |x| = 10 the result is x or 0 in float; clamping the cube's
    // argument keeps a huge x from overflowing x^3 into inf - inf = NaN.
    const float xc = x > 10.0f ? 10.0f : (x < -10.0f ? -10.0f : x);
    const float u = kGeluS * (xc + kGeluC * xc * xc * xc);
    return 0.5f * x * (1.0f + tanh_v(u));
  }
};

// d/dx of the GELU above, exactly:
//   0.5 (1 + t) + 0.5 x (1 - t^2) s (1 + 3 c x^2),  t = tanh(s (x + c x^3)).
// Past |x| = 10 tanh is +-1 in float, so the slope is exactly 1 or 0; the
// clamp keeps x^2 from overflowing into 0 * inf = NaN for huge x, and the
// select at the end (not a branch) keeps the loop vectorizable.
struct GeluGrad {
  float operator()(float x) const {
    const float xc = x > 10.0f ? 10.0f : (x < -10.0f ? -10.0f : x);
    const float x2 = xc * xc;
    const float t = tanh_v(kGeluS * (xc + kGeluC * x2 * xc));
    const float du = kGeluS * (1.0f + 3.0f * kGeluC * x2);
    const float g = 0.5f * (1.0f + t) + 0.5f * xc * (1.0f - t * t) * du;
    const float far = x > 0.0f ? 1.0f : 0.0f;
    return x > 10.0f || x < -10.0f ? far : g;
  }
};
struct TanhGrad {
  float operator()(float v) const {
    const float t = tanh_v(v);
    return 1.0f - t * t;
  }
};

// Items per pool chunk: below this a loop stays on the calling thread.
constexpr int64_t kGrain = 16384;

template <typename F>
TSR_OPS_CLONES static void map_span(const float *x, float *y, int64_t n) {
  const F f{};
  for (int64_t i = 0; i < n; i++) y[i] = f(x[i]);
}
template <typename F>
static void map(const float *x, float *y, int64_t n, F) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) { map_span<F>(x + b, y + b, e - b); });
}

// y[r, :] = f(y[r, :] + bias[:]), one pass over y.
template <typename F>
TSR_OPS_CLONES static void bias_map_rows(float *y, const float *bias, int64_t rows, int64_t cols) {
  const F f{};
  for (int64_t r = 0; r < rows; r++) {
    float *yr = y + r * cols;
    for (int64_t j = 0; j < cols; j++) yr[j] = f(yr[j] + bias[j]);
  }
}
template <typename F>
static void bias_map(float *y, const float *bias, int64_t rows, int64_t cols, F) {
  const int64_t grain = cols > 0 ? (kGrain + cols - 1) / cols : rows;
  parallel_for(rows, grain,
               [&](int64_t b, int64_t e) { bias_map_rows<F>(y + b * cols, bias, e - b, cols); });
}

tsr_status bias_act(tsr_host_ctx *ctx, DLTensor *y, const DLTensor *bias,
                    tsr_activation act) noexcept {
  return guarded(ctx, [&] {
    const Mat<float> Y = f32("bias_act", "y", y, 1), B = f32("bias_act", "bias", bias, 1);
    TSR_CHECK(B.numel() == Y.cols, TSR_ERR_INVALID,
              "bias_act: bias " + describe(bias) + " must have the last dim of y " + describe(y) +
                  " (" + std::to_string(Y.cols) + " elements)");
    check_activation("bias_act", act);
    switch (act) {
      case TSR_ACT_NONE:
        bias_map(Y.p, B.p, Y.rows, Y.cols, Identity{});
        break;
      case TSR_ACT_RELU:
        bias_map(Y.p, B.p, Y.rows, Y.cols, Relu{});
        break;
      case TSR_ACT_GELU:
        bias_map(Y.p, B.p, Y.rows, Y.cols, Gelu{});
        break;
      case TSR_ACT_TANH:
        bias_map(Y.p, B.p, Y.rows, Y.cols, Tanh{});
        break;
    }
  });
}

void add_col_sums(const Mat<float> &D, const Mat<float> &G, double scale) {
  // Column sums in double, a block of columns at a time: the accumulators
  // live on the stack (no allocation), each row contributes a contiguous
  // run of the block, and the j loop vectorizes since the lanes are
  // independent. Summing rows in double keeps B*T-long sums accurate.
  // scale = 1 multiplies exactly, so bias_grad and matmul_bias_grad agree.
  // The blocks go to the pool: each column is still summed by one thread
  // in row order, so the bits do not depend on the threads.
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (D.cols + kBlock - 1) / kBlock;
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, D.rows * kBlock));
  parallel_for(blocks, grain, [&](int64_t b0, int64_t b1) {
    double acc[kBlock];
    for (int64_t c0 = b0 * kBlock; c0 < std::min(D.cols, b1 * kBlock); c0 += kBlock) {
      const int64_t w = D.cols - c0 < kBlock ? D.cols - c0 : kBlock;
      for (int64_t j = 0; j < w; j++) acc[j] = 0.0;
      for (int64_t r = 0; r < D.rows; r++) {
        const float *dr = D.p + r * D.cols + c0;
        for (int64_t j = 0; j < w; j++) acc[j] += dr[j];
      }
      for (int64_t j = 0; j < w; j++) G.p[c0 + j] += static_cast<float>(scale * acc[j]);
    }
  });
}

tsr_status bias_grad(tsr_host_ctx *ctx, const DLTensor *dy, DLTensor *dbias) noexcept {
  return guarded(ctx, [&] {
    const Mat<float> D = f32("bias_grad", "dy", dy, 1), G = f32("bias_grad", "dbias", dbias, 1);
    TSR_CHECK(G.numel() == D.cols, TSR_ERR_INVALID,
              "bias_grad: dbias " + describe(dbias) + " must have the last dim of dy " +
                  describe(dy) + " (" + std::to_string(D.cols) + " elements)");
    add_col_sums(D, G, 1.0);
  });
}

tsr_status act_forward(tsr_host_ctx *ctx, tsr_activation act, const DLTensor *x,
                       DLTensor *y) noexcept {
  return guarded(ctx, [&] {
    check_same_numel("act_forward", "x", x, "y", y);
    check_activation("act_forward", act);
    const Mat<float> X = f32("act_forward", "x", x), Y = f32("act_forward", "y", y);
    const int64_t n = X.numel();
    switch (act) {
      case TSR_ACT_NONE:
        map(X.p, Y.p, n, Identity{});
        break;
      case TSR_ACT_RELU:
        map(X.p, Y.p, n, Relu{});
        break;
      case TSR_ACT_GELU:
        map(X.p, Y.p, n, Gelu{});
        break;
      case TSR_ACT_TANH:
        map(X.p, Y.p, n, Tanh{});
        break;
    }
  });
}

// dx[i] = dy[i] * g(x[i]); reads both inputs before writing, so dx may be dy.
template <typename G>
TSR_OPS_CLONES static void grad_span(const float *x, const float *dy, float *dx, int64_t n) {
  const G g{};
  for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * g(x[i]);
}
template <typename G>
static void grad_map(const float *x, const float *dy, float *dx, int64_t n, G) {
  parallel_for(n, kGrain,
               [&](int64_t b, int64_t e) { grad_span<G>(x + b, dy + b, dx + b, e - b); });
}
struct One {
  float operator()(float) const { return 1.0f; }
};
struct ReluGrad {
  // relu(x) > 0 exactly when x > 0, so input and output give one rule.
  float operator()(float v) const { return v > 0.0f ? 1.0f : 0.0f; }
};
struct TanhGradFromOutput {
  float operator()(float t) const { return 1.0f - t * t; }
};

tsr_status act_backward(tsr_host_ctx *ctx, tsr_activation act, const DLTensor *x,
                        int32_t from_output, const DLTensor *dy, DLTensor *dx) noexcept {
  return guarded(ctx, [&] {
    check_same_numel("act_backward", "x", x, "dy", dy);
    check_same_numel("act_backward", "dy", dy, "dx", dx);
    check_activation("act_backward", act);
    TSR_CHECK(from_output == 0 || from_output == 1, TSR_ERR_INVALID,
              "act_backward: from_output must be 0 or 1, got " + std::to_string(from_output));
    // GELU is not invertible from its output (it is not monotonic below
    // about -0.75), so its gradient needs the input.
    TSR_CHECK(!(act == TSR_ACT_GELU && from_output), TSR_ERR_INVALID,
              "act_backward: gelu needs its input (from_output must be 0)");
    const Mat<float> X = f32("act_backward", "x", x), DY = f32("act_backward", "dy", dy),
                     DX = f32("act_backward", "dx", dx);
    const int64_t n = X.numel();
    switch (act) {
      case TSR_ACT_NONE:
        grad_map(X.p, DY.p, DX.p, n, One{});
        break;
      case TSR_ACT_RELU:
        grad_map(X.p, DY.p, DX.p, n, ReluGrad{});
        break;
      case TSR_ACT_GELU:
        grad_map(X.p, DY.p, DX.p, n, GeluGrad{});
        break;
      case TSR_ACT_TANH:
        if (from_output)
          grad_map(X.p, DY.p, DX.p, n, TanhGradFromOutput{});
        else
          grad_map(X.p, DY.p, DX.p, n, TanhGrad{});
        break;
    }
  });
}

// ---------------------------------------------------------------------------
// Softmax cross-entropy

constexpr int64_t kRowBlock = 32;
struct CeSums {
  double loss = 0.0;
  int64_t counted = 0, hits = 0;
};

// Rows [r0, r1): loss, count and hits of those rows, and their gradient
// when d is given.
TSR_OPS_CLONES static CeSums ce_rows(const float *logits, const int32_t *targets, float *dlogits,
                                     int64_t r0, int64_t r1, int64_t cols, int64_t V,
                                     float grad_scale) {
  CeSums s;
  for (int64_t r = r0; r < r1; r++) {
    const float *x = logits + r * cols;
    float *d = dlogits ? dlogits + r * cols : nullptr;
    const int32_t t = targets[r];
    if (t < 0) {  // ignored row: no loss, zero gradient
      if (d)
        for (int64_t j = 0; j < cols; j++) d[j] = 0.0f;
      continue;
    }
    const float xt = x[t];  // before d, which may alias x, is written
    // Stable log-softmax: subtract the row max before exp. The max in
    // vector lanes, then the argmax as the first element equal to it (the
    // first of tied maxima); a row with a NaN has a NaN loss either way.
    const float maxv = max_lanes16(x, V);
    int64_t arg = 0;
    while (arg < V - 1 && !(x[arg] == maxv)) arg++;
    // The sum of exp(x - max) in eight double lanes: V can be ~10^5 terms,
    // and independent lanes let the loop vectorize in a fixed order. With
    // a gradient to write, the exps go straight into d (each x_j is read
    // before d_j is written, which is all the aliasing d == x needs).
    double z8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    if (d) {
      // The exps first, in a loop that vectorizes, then the same lanes.
      for (int64_t i = 0; i < V; i++) d[i] = exp_v(x[i] - maxv);
      for (; j + 8 <= V; j += 8)
        for (int k = 0; k < 8; k++) z8[k] += d[j + k];
      for (; j < V; j++) z8[0] += d[j];
    } else {
      for (; j + 8 <= V; j += 8)
        for (int k = 0; k < 8; k++) z8[k] += exp_v(x[j + k] - maxv);
      for (; j < V; j++) z8[0] += exp_v(x[j] - maxv);
    }
    const double z = ((z8[0] + z8[1]) + (z8[2] + z8[3])) + ((z8[4] + z8[5]) + (z8[6] + z8[7]));
    const double lse = static_cast<double>(maxv) + std::log(z);
    s.loss += lse - static_cast<double>(xt);
    s.counted++;
    s.hits += arg == t;
    if (d) {
      // softmax_j = exp(x_j - max) / z, not exp(x_j - lse): lse rounded to
      // float would lose digits when the logits are large.
      const float g = static_cast<float>(grad_scale / z);
      for (int64_t i = 0; i < V; i++) d[i] *= g;
      d[t] -= grad_scale;
      for (int64_t i = V; i < cols; i++) d[i] = 0.0f;  // padding columns
    }
  }
  return s;
}

tsr_status cross_entropy(tsr_host_ctx *ctx, const DLTensor *logits, const DLTensor *targets,
                         int64_t valid_classes, float grad_scale, DLTensor *dlogits,
                         double *loss_sum, int64_t *count, int64_t *correct) noexcept {
  return guarded(ctx, [&] {
    const Mat<float> L = f32("cross_entropy", "logits", logits, 1);
    const Mat<int32_t> T = i32("cross_entropy", "targets", targets);
    TSR_CHECK(T.numel() == L.rows, TSR_ERR_INVALID,
              "cross_entropy: targets " + describe(targets) + " must have one entry per row of " +
                  "logits " + describe(logits) + " (" + std::to_string(L.rows) + " rows)");
    TSR_CHECK(valid_classes <= L.cols, TSR_ERR_INVALID,
              "cross_entropy: valid_classes " + std::to_string(valid_classes) +
                  " exceeds the last dim of logits " + describe(logits));
    TSR_CHECK(loss_sum != nullptr && count != nullptr, TSR_ERR_INVALID,
              "cross_entropy: loss_sum and count must not be NULL");
    Mat<float> DL{nullptr, 0, 0};
    if (dlogits) {
      DL = f32("cross_entropy", "dlogits", dlogits, 1);
      TSR_CHECK(
          DL.rows == L.rows && DL.cols == L.cols, TSR_ERR_INVALID,
          "cross_entropy: dlogits " + describe(dlogits) + " must match logits " + describe(logits));
    }
    const int64_t rows = L.rows, cols = L.cols;
    const int64_t V = valid_classes > 0 ? valid_classes : cols;  // columns in the softmax

    // Check every target before writing anything: dlogits may alias logits,
    // and a half-overwritten batch would be worse than no result.
    for (int64_t r = 0; r < rows; r++) {
      TSR_CHECK(T.p[r] < V, TSR_ERR_INVALID,
                "cross_entropy: row " + std::to_string(r) + " has target " +
                    std::to_string(T.p[r]) + " but only " + std::to_string(V) +
                    " valid classes (logits " + describe(logits) + ")");
    }

    // Rows in fixed blocks, each block's sums kept apart and added in block
    // order at the end: the loss does not depend on how many threads ran.
    const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
    thread_local std::vector<CeSums> sums;  // grow-only: no allocation per step
    if (sums.size() < static_cast<size_t>(blocks)) sums.resize(static_cast<size_t>(blocks));
    CeSums *part = sums.data();  // this thread's: a worker naming `sums` would get its own
    parallel_for(blocks, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1) / kRowBlock),
                 [&](int64_t b0, int64_t b1) {
                   for (int64_t blk = b0; blk < b1; blk++) {
                     const int64_t r0 = blk * kRowBlock, r1 = std::min(rows, r0 + kRowBlock);
                     part[blk] = ce_rows(L.p, T.p, DL.p, r0, r1, cols, V, grad_scale);
                   }
                 });
    double loss = 0.0;
    int64_t counted = 0, hits = 0;
    for (int64_t blk = 0; blk < blocks; blk++) {
      loss += part[blk].loss;
      counted += part[blk].counted;
      hits += part[blk].hits;
    }
    *loss_sum = loss;
    *count = counted;
    if (correct) *correct = hits;
  });
}

}  // namespace tessera::cpu
