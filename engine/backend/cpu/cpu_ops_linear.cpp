// CPU ops, linear: c = act(op(a) @ op(b) + bias), optionally keeping the
// pre-activation in `pre`, and its two fused backward pieces (ABI 1.3):
// matmul_bias_grad (a weight gradient and its bias gradient) and
// matmul_act_backward (an input gradient through the activation). On CUDA
// each is one cuBLASLt call with a fused epilogue; here each is the matmul
// (OpenBLAS sgemm) followed by the element-wise passes of cpu_ops_nn.cpp,
// the very calls the unfused sequence makes, so the results are the same
// bits. The epilogue is O(m n) against the product's O(m n k), so fusing
// it on the CPU would buy little.
#include <string>

#include "backend/cpu/cpu_ops_internal.hpp"
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

// Throws unless dbias has one element per column of the product, n.
static void check_dbias(const char *op, const DLTensor *dbias, const DLTensor *c,
                        const Mat<float> &C) {
  const Mat<float> G = f32(op, "dbias", dbias, 1);
  TSR_CHECK(G.numel() == C.cols, TSR_ERR_INVALID,
            std::string(op) + ": dbias " + describe(dbias) + " must have the last dim of c " +
                describe(c) + " (" + std::to_string(C.cols) + " elements)");
}

tsr_status matmul_bias_grad(tsr_host_ctx *ctx, const DLTensor *a, int32_t trans_a,
                            const DLTensor *b, int32_t trans_b, DLTensor *c, float alpha,
                            float beta, DLTensor *dbias) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "matmul_bias_grad";
    const Mat<float> C = f32(op, "c", c, 1);
    if (dbias) {
      TSR_CHECK(trans_b == 0, TSR_ERR_INVALID,
                std::string(op) + ": the bias gradient sums the rows of b, which needs " +
                    "trans_b = 0, got " + std::to_string(trans_b));
      check_dbias(op, dbias, c, C);
    }
    gemm(op, a, trans_a, b, trans_b, c, alpha, beta);
    // b is [k, n] here (gemm checked it against c): its column sums.
    if (dbias) add_col_sums(f32(op, "b", b, 2), f32(op, "dbias", dbias, 1), alpha);
  });
}

tsr_status matmul_act_backward(tsr_host_ctx *ctx, const DLTensor *a, int32_t trans_a,
                               const DLTensor *b, int32_t trans_b, tsr_activation act,
                               const DLTensor *pre, DLTensor *c, DLTensor *dbias) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "matmul_act_backward";
    const Mat<float> C = f32(op, "c", c, 1);
    check_activation(op, act);
    if (act != TSR_ACT_NONE || pre) {
      TSR_CHECK(pre != nullptr, TSR_ERR_INVALID,
                std::string(op) + ": the activation's backward needs pre");
      const Mat<float> P = f32(op, "pre", pre, 1);
      TSR_CHECK(P.rows == C.rows && P.cols == C.cols, TSR_ERR_INVALID,
                std::string(op) + ": pre " + describe(pre) + " must have the shape of c " +
                    describe(c) + " viewed as (rows, last dim)");
      TSR_CHECK(C.numel() == 0 || P.p + P.numel() <= C.p || C.p + C.numel() <= P.p, TSR_ERR_INVALID,
                std::string(op) + ": c " + describe(c) + " overlaps pre " + describe(pre));
    }
    if (dbias) check_dbias(op, dbias, c, C);
    gemm(op, a, trans_a, b, trans_b, c, 1.0f, 0.0f);
    if (act != TSR_ACT_NONE) ok_or_throw(act_backward(ctx, act, pre, 0, c, c));
    if (dbias) ok_or_throw(bias_grad(ctx, c, dbias));
  });
}

}  // namespace tessera::cpu
