// CPU ops, linear: c = act(op(a) @ op(b) + bias), optionally keeping the
// pre-activation in `pre`. On CUDA this is one cuBLASLt call with a fused
// epilogue; here it is the matmul (OpenBLAS sgemm) followed by the bias +
// activation pass of cpu_ops_nn.cpp. The epilogue is O(m n) against the
// product's O(m n k), so fusing it on the CPU would buy little.
#include "ops/cpu_ops_internal.hpp"
#include "util/error.hpp"

namespace tessera::cpu {

// The entries linear reuses return a status and have already recorded their
// message; pass it on unchanged.
static void ok_or_throw(tsr_status s) {
  if (s != TSR_OK) throw ReportedError(s);
}

tsr_status linear(tsr_host_ctx *ctx, const DLTensor *a, int32_t trans_a, const DLTensor *b,
                  int32_t trans_b, const DLTensor *bias, tsr_activation act, DLTensor *c,
                  DLTensor *pre) noexcept {
  return guarded(ctx, [&] {
    // Every check up front, under linear's name, so the entries called below
    // cannot fail on an argument and nothing is half written.
    const Mat<float> C = f32("linear", "c", c, 1);
    check_activation("linear", act);
    if (bias) {
      const Mat<float> B = f32("linear", "bias", bias, 1);
      TSR_CHECK(B.numel() == C.cols, TSR_ERR_INVALID,
                "linear: bias " + describe(bias) + " must have the last dim of c " + describe(c) +
                    " (" + std::to_string(C.cols) + " elements)");
    }
    if (pre) {
      const Mat<float> P = f32("linear", "pre", pre, 1);
      TSR_CHECK(P.rows == C.rows && P.cols == C.cols, TSR_ERR_INVALID,
                "linear: pre " + describe(pre) + " must have the shape of c " + describe(c) +
                    " viewed as (rows, last dim)");
    }

    // The product goes where the pre-activation is kept: `pre` if asked
    // for, else c itself (gemm checks the shapes and that it overlaps
    // neither a nor b).
    DLTensor *z = pre ? pre : c;
    gemm("linear", a, trans_a, b, trans_b, z, 1.0f, 0.0f);

    if (pre) {
      // pre = z + bias, then c = act(pre). act_forward allows pre == c.
      if (bias) ok_or_throw(bias_act(ctx, pre, bias, TSR_ACT_NONE));
      ok_or_throw(act_forward(ctx, act, pre, c));
    } else if (bias) {
      ok_or_throw(bias_act(ctx, c, bias, act));  // one pass: c = act(c + bias)
    } else if (act != TSR_ACT_NONE) {
      ok_or_throw(act_forward(ctx, act, c, c));
    }
  });
}

}  // namespace tessera::cpu
