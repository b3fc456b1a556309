// CUDA ops, ABI 1.3: the backward matmuls of a linear layer with their
// element-wise work in cuBLASLt's epilogue.
//
// matmul_bias_grad: dW = x^T dy and the bias gradient (the column sums of
// dy) from one read of dy. In our row-major mapping (gemm.hpp) dy, our b,
// is cuBLASLt's A, untransposed, and its columns run along D's rows: that is
// CUBLASLT_EPILOGUE_BGRADA (llm.c and Transformer Engine, whose dy is
// cuBLASLt's B, use BGRADB for the same sum; cuBLASLt offers BGRADA only
// with A untransposed, which is why the op asks for trans_b = 0).
//
// matmul_act_backward: d pre = act'(pre) * (dy @ W^T) and the bias
// gradient, as the product, then the activation's backward in place with
// the column sums in the same pass: cuBLASLt's DGELU epilogues were
// measured slower on sm_90 (see the op).
//
// cuBLASLt writes a bias gradient (in D's dtype), it does not add to it;
// the ops add into dbias, so the epilogue writes a scratch vector that one
// small axpy adds into dbias (n elements, against the m x n matrix the
// fusion does not read again). Where cuBLASLt has no algorithm for a fused
// epilogue (counted in epilogue_misses), the op runs the unfused sequence
// on the device: the results agree either way to the dtype's rounding.
#include "cuda/cuda_ops_internal.hpp"
#include "cuda/gemm.hpp"
#include "ops/cpu_ops.hpp"

namespace tessera::cuda {

namespace {

// The bias gradient vector cuBLASLt writes: n elements of dt.
View bias_scratch(int64_t n, DType dt) {
  void *p = scratch(Slot::BiasGrad, static_cast<size_t>(n) * dtype_size(dt));
  return View{p, 1, n, dt};
}

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
    // The fused epilogue: alpha = 1 only, since whether cuBLASLt scales
    // the bias gradient by alpha is not documented.
    if (dbias && g.k > 0 && alpha == 1.0f) {
      const View tmp = bias_scratch(g.n, g.c.dt);
      if (run_gemm(g, g.c.p, alpha, beta, CUBLASLT_EPILOGUE_BGRADA, tmp.p, nullptr, 0)) {
        launch_axpy(1.0f, tmp, vd);
        return;
      }
    }
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
