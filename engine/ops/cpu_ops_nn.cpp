// CPU ops, part 2: the layer pieces: bias + activation, activation forward
// and backward, bias gradient, softmax cross-entropy. float32 throughout, with
// double only where sums run long (bias_grad columns, the softmax normalizer,
// the loss).
#include <cmath>

#include "ops/cpu_ops_internal.hpp"
#include "util/error.hpp"

namespace tessera::cpu {

// ---------------------------------------------------------------------------
// Activations. Each is a small functor so the switch on `act` happens once per
// call and the inner loop is a plain map the compiler can inline.

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
  float operator()(float x) const { return std::tanh(x); }
};
struct Gelu {
  float operator()(float x) const {
    const float u = kGeluS * (x + kGeluC * x * x * x);
    return 0.5f * x * (1.0f + std::tanh(u));
  }
};

// d/dx of the GELU above, exactly:
//   0.5 (1 + t) + 0.5 x (1 - t^2) s (1 + 3 c x^2),  t = tanh(s (x + c x^3)).
static inline float gelu_grad(float x) {
  // Past |x| = 10 tanh is +-1 in float, so the slope is exactly 1 or 0; the
  // branch also keeps x^2 from overflowing into 0 * inf = NaN for huge x.
  if (std::fabs(x) > 10.0f) return x > 0.0f ? 1.0f : 0.0f;
  const float x2 = x * x;
  const float t = std::tanh(kGeluS * (x + kGeluC * x2 * x));
  const float du = kGeluS * (1.0f + 3.0f * kGeluC * x2);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

template <typename F>
static void map(const float *x, float *y, int64_t n, F f) {
  for (int64_t i = 0; i < n; i++) y[i] = f(x[i]);
}

// y[r, :] = f(y[r, :] + bias[:]), one pass over y.
template <typename F>
static void bias_map(float *y, const float *bias, int64_t rows, int64_t cols, F f) {
  for (int64_t r = 0; r < rows; r++) {
    float *yr = y + r * cols;
    for (int64_t j = 0; j < cols; j++) yr[j] = f(yr[j] + bias[j]);
  }
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

tsr_status bias_grad(tsr_host_ctx *ctx, const DLTensor *dy, DLTensor *dbias) noexcept {
  return guarded(ctx, [&] {
    const Mat<float> D = f32("bias_grad", "dy", dy, 1), G = f32("bias_grad", "dbias", dbias, 1);
    TSR_CHECK(G.numel() == D.cols, TSR_ERR_INVALID,
              "bias_grad: dbias " + describe(dbias) + " must have the last dim of dy " +
                  describe(dy) + " (" + std::to_string(D.cols) + " elements)");
    // Column sums in double, a block of columns at a time: the accumulators
    // live on the stack (no allocation), each row contributes a contiguous
    // run of the block, and the j loop vectorizes since the lanes are
    // independent. Summing rows in double keeps B*T-long sums accurate.
    constexpr int64_t kBlock = 256;
    double acc[kBlock];
    for (int64_t c0 = 0; c0 < D.cols; c0 += kBlock) {
      const int64_t w = D.cols - c0 < kBlock ? D.cols - c0 : kBlock;
      for (int64_t j = 0; j < w; j++) acc[j] = 0.0;
      for (int64_t r = 0; r < D.rows; r++) {
        const float *dr = D.p + r * D.cols + c0;
        for (int64_t j = 0; j < w; j++) acc[j] += dr[j];
      }
      for (int64_t j = 0; j < w; j++) G.p[c0 + j] += static_cast<float>(acc[j]);
    }
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
static void grad_map(const float *x, const float *dy, float *dx, int64_t n, G g) {
  for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * g(x[i]);
}

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
        grad_map(X.p, DY.p, DX.p, n, [](float) { return 1.0f; });
        break;
      case TSR_ACT_RELU:
        // relu(x) > 0 exactly when x > 0, so input and output give one rule.
        grad_map(X.p, DY.p, DX.p, n, [](float v) { return v > 0.0f ? 1.0f : 0.0f; });
        break;
      case TSR_ACT_GELU:
        grad_map(X.p, DY.p, DX.p, n, gelu_grad);
        break;
      case TSR_ACT_TANH:
        if (from_output) {
          grad_map(X.p, DY.p, DX.p, n, [](float t) { return 1.0f - t * t; });
        } else {
          grad_map(X.p, DY.p, DX.p, n, [](float v) {
            const float t = std::tanh(v);
            return 1.0f - t * t;
          });
        }
        break;
    }
  });
}

// ---------------------------------------------------------------------------
// Softmax cross-entropy

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

    double loss = 0.0;
    int64_t counted = 0, hits = 0;
    for (int64_t r = 0; r < rows; r++) {
      const float *x = L.p + r * cols;
      float *d = DL.p ? DL.p + r * cols : nullptr;
      const int32_t t = T.p[r];
      if (t < 0) {  // ignored row: no loss, zero gradient
        if (d)
          for (int64_t j = 0; j < cols; j++) d[j] = 0.0f;
        continue;
      }
      // Stable log-softmax: subtract the row max before exp. The argmax falls
      // out of the same pass; `>` keeps the first of tied maxima.
      float maxv = x[0];
      int64_t arg = 0;
      for (int64_t j = 1; j < V; j++) {
        if (x[j] > maxv) {
          maxv = x[j];
          arg = j;
        }
      }
      double z = 0.0;  // sum of exp(x - max) in double: V can be ~10^5 terms
      for (int64_t j = 0; j < V; j++) z += std::exp(x[j] - maxv);
      const double lse = static_cast<double>(maxv) + std::log(z);
      loss += lse - static_cast<double>(x[t]);
      counted++;
      hits += arg == t;
      if (d) {
        // softmax_j = exp(x_j - max) / z, not exp(x_j - lse): lse rounded to
        // float would lose digits when the logits are large. Each x_j is read
        // before d_j is written, which is all the aliasing case needs.
        const float g = static_cast<float>(grad_scale / z);
        for (int64_t j = 0; j < V; j++) d[j] = g * std::exp(x[j] - maxv);
        d[t] -= grad_scale;
        for (int64_t j = V; j < cols; j++) d[j] = 0.0f;  // padding columns
      }
    }
    *loss_sum = loss;
    *count = counted;
    if (correct) *correct = hits;
  });
}

}  // namespace tessera::cpu
