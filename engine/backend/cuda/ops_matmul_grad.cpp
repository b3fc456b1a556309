// CUDA ops, ABI 1.3: the backward matmuls of a linear layer with their
// bias gradient and activation backward.
//
// matmul_bias_grad: dW = x^T dy, then the bias gradient (the column sums
// of dy) by bias_grad's deterministic two passes, which add into dbias.
// cuBLASLt's CUBLASLT_EPILOGUE_BGRADA does not fuse the sum into the GEMM
// on sm_90 (CUDA 13.0): it runs a separate kernel (BgradAB) that writes a
// vector one more axpy must add, and it was the slower of the two at
// GPT-2's shapes on the H200 (bench/results/gpt2_gpu-2026-12-02-third.md:
// 33.7 us for [16384, 2304], 14.5 us for [16384, 768] against our 10.6).
//
// matmul_act_backward: d pre = act'(pre) * (dy @ W^T) and the bias
// gradient, as the product, then the activation's backward in place with
// the column sums in the same pass: cuBLASLt's DGELU epilogues were
// measured slower on sm_90 (see the op).
#include "backend/cpu/cpu_ops.hpp"
#include "backend/cuda/cuda_ops_internal.hpp"
#include "backend/cuda/gemm.hpp"

namespace tessera::cuda {

namespace {

// Checks dbias: floating, one element per column of the product.
View check_dbias(const char *op, const DLTensor *dbias, const DLTensor *c, int64_t n) {
  const View v = floating(op, "dbias", dbias, 1);
  TSR_CHECK(v.numel() == n, TSR_ERR_INVALID,
            std::string(op) + ": dbias " + describe(dbias) + " must have the last dim of c " +
                describe(c) + " (" + std::to_string(n) + " elements)");
  return v;
}

}  // namespace

tsr_status matmul_bias_grad(tsr_host_ctx *ctx, const DLTensor *a, int32_t trans_a,
                            const DLTensor *b, int32_t trans_b, DLTensor *c, float alpha,
                            float beta, DLTensor *dbias) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "matmul_bias_grad";
    if (side_of(op, {{"a", a}, {"b", b}, {"c", c}, {"dbias", dbias}}) == Side::Host) {
      AsCpu ha(a), hb(b), hc(c), hd(dbias);
      host_result(need_cpu(cpu_ops()->matmul_bias_grad, op)(ctx, ha.p, trans_a, hb.p, trans_b,
                                                            hc.mut(), alpha, beta, hd.mut()));
      return;
    }
    const Gemm g = check_gemm(op, a, trans_a, b, trans_b, c);
    View vd{};
    if (dbias) {
      TSR_CHECK(trans_b == 0, TSR_ERR_INVALID,
                std::string(op) + ": the bias gradient sums the rows of b, which needs " +
                    "trans_b = 0, got " + std::to_string(trans_b));
      vd = check_dbias(op, dbias, c, g.n);
      TSR_CHECK(!overlaps(vd, g.b) && !overlaps(vd, g.c), TSR_ERR_INVALID,
                std::string(op) + ": dbias overlaps b or c in memory");
    }
    if (g.m == 0 || g.n == 0) return;
    plain_gemm(op, g, g.c, alpha, beta);
    if (dbias && g.k > 0) launch_bias_grad(g.b, vd, alpha);
  });
}

tsr_status matmul_act_backward(tsr_host_ctx *ctx, const DLTensor *a, int32_t trans_a,
                               const DLTensor *b, int32_t trans_b, tsr_activation act,
                               const DLTensor *pre, DLTensor *c, DLTensor *dbias) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "matmul_act_backward";
    if (side_of(op, {{"a", a}, {"b", b}, {"pre", pre}, {"c", c}, {"dbias", dbias}}) == Side::Host) {
      AsCpu ha(a), hb(b), hp(pre), hc(c), hd(dbias);
      host_result(need_cpu(cpu_ops()->matmul_act_backward, op)(ctx, ha.p, trans_a, hb.p, trans_b,
                                                               act, hp.p, hc.mut(), hd.mut()));
      return;
    }
    const Gemm g = check_gemm(op, a, trans_a, b, trans_b, c);
    check_activation(op, act);
    View vp{}, vd{};
    if (act != TSR_ACT_NONE || pre) {
      TSR_CHECK(pre != nullptr, TSR_ERR_INVALID,
                std::string(op) + ": the activation's backward needs pre");
      vp = floating(op, "pre", pre, 1);
      TSR_CHECK(vp.rows == g.c.rows && vp.cols == g.c.cols && vp.dt == g.c.dt, TSR_ERR_INVALID,
                std::string(op) + ": pre " + describe(pre) + " must match c " + describe(c));
      TSR_CHECK(!overlaps(vp, g.c), TSR_ERR_INVALID,
                std::string(op) + ": c " + describe(c) + " overlaps pre " + describe(pre));
    }
    if (dbias) {
      vd = check_dbias(op, dbias, c, g.n);
      TSR_CHECK(!overlaps(vd, g.c), TSR_ERR_INVALID, std::string(op) + ": dbias overlaps c");
    }
    if (g.m == 0 || g.n == 0) return;

    // No DGELU epilogue: on the H200 (cuBLASLt of CUDA 13.0) DGELU and
    // DGELU_BGRAD run as a separate epilogue kernel after the GEMM, 0.33 ms
    // for GPT-2 small's [16384, 3072], where the activation's own backward
    // pass and the column sums take ~0.1 ms; GPT-2 124M trained at 531K
    // tokens/s with it and 567K without (bench/results/gpt2_gpu-2026-12-02.md).
    plain_gemm(op, g, g.c, 1.0f, 0.0f);
    if (act != TSR_ACT_NONE && dbias) {
      launch_act_backward_bias_grad(act, vp, g.c, g.c, vd);
    } else if (act != TSR_ACT_NONE) {
      launch_act_backward(act, 0, vp, g.c, g.c);
    } else if (dbias) {
      launch_bias_grad(g.c, vd, 1.0f);
    }
  });
}

}  // namespace tessera::cuda
