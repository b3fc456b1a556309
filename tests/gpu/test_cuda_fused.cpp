// The CUDA ops added in ABI 1.3, the fused forms of 1.0/1.1 sequences,
// against the CPU ops on the same (rounded) values and against the CUDA
// ops' own unfused sequence (cuda_ops_support.hpp says how dtypes are
// compared):
//   add_layernorm_forward = axpy then layernorm_forward (bit for bit: one
//                           kernel template computes both)
//   matmul_bias_grad      = matmul then bias_grad
//   matmul_act_backward   = matmul, act_backward, bias_grad
// and, at GPT-2 124M's shapes in bf16, that cuBLASLt really has algorithms
// for the epilogues linear fuses (else the op falls back and the step
// gains nothing).
#include <tessera/ops.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cuda/gemm.hpp"
#include "cuda_ops_support.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace gpu_test_cuda_fused {

using namespace cuda_ops_test;

namespace {

bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("cuda ops table has every ABI 1.3 entry", "[cuda][ops][fused]") {
  CHECK(TSR_HAS_FIELD(&gpu(), tsr_ops, matmul_act_backward));
  CHECK(gpu().add_layernorm_forward);
  CHECK(gpu().matmul_bias_grad);
  CHECK(gpu().matmul_act_backward);
}

TEST_CASE("cuda add_layernorm_forward equals axpy then layernorm_forward", "[cuda][ops][fused]") {
  for (Dt d : kFloatDts) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{64, 768}, {7, 3, 40}, {5, 37}}) {
      const int64_t C = shape.back(), n = numel_of(shape), rows = n / C;
      for (int where = 0; where < 3; where++) {  // r separate, r = y, r = x
        const std::string what = case_name("add_layernorm_forward", d, shape,
                                           where == 0   ? "r separate"
                                           : where == 1 ? "r = y"
                                                        : "r = x");
        INFO(what);
        Gpu x(shape, d, randn(n, 61, -3, 5)), y(shape, d, randn(n, 62));
        Gpu w({C}, d, randn(C, 63)), b({C}, d, randn(C, 64));
        Tensor rr(shape, d), out(shape, d), mean({rows}, Dt::F32), rstd({rows}, Dt::F32);
        Tensor *r = where == 0 ? static_cast<Tensor *>(&rr) : where == 1 ? &y : &x;
        // The unfused sequence on the GPU: r_seq = y + x, then layernorm.
        Gpu r_seq(shape, d, y.vals);
        Tensor out_seq(shape, d), m_seq({rows}, Dt::F32), s_seq({rows}, Dt::F32);
        REQUIRE_OK(gpu().axpy(ctx(), 1.0f, x.dl(), r_seq.dl()));
        REQUIRE_OK(gpu().layernorm_forward(ctx(), r_seq.dl(), w.dl(), b.dl(), 1e-5f, out_seq.dl(),
                                           m_seq.dl(), s_seq.dl()));
        REQUIRE_OK(gpu().add_layernorm_forward(ctx(), x.dl(), y.dl(), w.dl(), b.dl(), 1e-5f,
                                               r->dl(), out.dl(), mean.dl(), rstd.dl()));
        CHECK(same_bits(r->get(), r_seq.get()));
        CHECK(same_bits(out.get(), out_seq.get()));
        CHECK(same_bits(mean.get(), m_seq.get()));
        CHECK(same_bits(rstd.get(), s_seq.get()));

        // And the CPU's fused op on the rounded sum.
        Cpu cx(shape, x.vals), cy(shape, y.vals), cw({C}, w.vals), cb({C}, b.vals);
        Cpu cr(shape, std::vector<float>(n)), co(shape, std::vector<float>(n));
        Cpu cm({rows}, std::vector<float>(rows)), cs({rows}, std::vector<float>(rows));
        REQUIRE_OK(cpu().add_layernorm_forward(ctx(), cx.dl(), cy.dl(), cw.dl(), cb.dl(), 1e-5f,
                                               cr.dl(), co.dl(), cm.dl(), cs.dl()));
        expect_close(what + " r", r_seq.get(), cr.get(), tol(d));
        expect_close(what + " out", out.get(), co.get(), 4 * tol(d));
      }
    }
  }
}

TEST_CASE("cuda matmul_bias_grad matches the CPU and the unfused sequence", "[cuda][ops][fused]") {
  // (k rows of x and dy, m inputs, n outputs): GPT-2's c_attn and c_fc
  // weight gradients at a few hundred tokens, and odd sizes.
  for (Dt d : kFloatDts) {
    for (const auto &[k, m, n] :
         {std::tuple{512, 64, 192}, std::tuple{300, 48, 200}, std::tuple{33, 17, 45}}) {
      for (const auto &[alpha, beta] :
           {std::pair{1.0f, 1.0f}, std::pair{1.0f, 0.0f}, std::pair{0.5f, 1.0f}}) {
        const std::string what =
            case_name("matmul_bias_grad", d, {k, m, n},
                      "alpha=" + std::to_string(alpha) + " beta=" + std::to_string(beta));
        INFO(what);
        Gpu a({k, m}, d, randn(k * m, 71)), b({k, n}, d, randn(k * n, 72));
        Gpu c({m, n}, d, randn(m * n, 73)), db({n}, d, randn(n, 74));
        Gpu c_seq({m, n}, d, c.vals), db_seq({n}, d, db.vals);
        Cpu ca({k, m}, a.vals), cb({k, n}, b.vals), cc({m, n}, c.vals), cdb({n}, db.vals);
        REQUIRE_OK(
            gpu().matmul_bias_grad(ctx(), a.dl(), 1, b.dl(), 0, c.dl(), alpha, beta, db.dl()));
        REQUIRE_OK(
            cpu().matmul_bias_grad(ctx(), ca.dl(), 1, cb.dl(), 0, cc.dl(), alpha, beta, cdb.dl()));
        expect_close(what + " c", c.get(), cc.get(), tol(d));
        expect_close(what + " dbias", db.get(), cdb.get(), 2 * tol(d));
        // The CUDA unfused sequence (alpha = 1: bias_grad has no scale).
        if (alpha == 1.0f) {
          REQUIRE_OK(gpu().matmul(ctx(), a.dl(), 1, b.dl(), 0, c_seq.dl(), alpha, beta));
          REQUIRE_OK(gpu().bias_grad(ctx(), b.dl(), db_seq.dl()));
          expect_close(what + " c vs unfused", c.get(), c_seq.get(), tol(d));
          expect_close(what + " dbias vs unfused", db.get(), db_seq.get(), 2 * tol(d));
        }
        // Repeats bit for bit.
        const std::vector<float> c1 = c.get(), db1 = db.get();
        c.set(c.vals);
        db.set(db.vals);
        REQUIRE_OK(
            gpu().matmul_bias_grad(ctx(), a.dl(), 1, b.dl(), 0, c.dl(), alpha, beta, db.dl()));
        CHECK(same_bits(c.get(), c1));
        CHECK(same_bits(db.get(), db1));
      }
    }
  }
}

TEST_CASE("cuda matmul_act_backward matches the CPU and the unfused sequence",
          "[cuda][ops][fused]") {
  // dy [m, k] @ W^T, W stored [n, k] (trans_b = 1) as linear's input
  // gradient: GPT-2's MLP is dy [R, C] @ W_proj[4C, C]^T.
  for (Dt d : kFloatDts) {
    for (const auto &[m, n, k] :
         {std::tuple{512, 256, 64}, std::tuple{100, 96, 40}, std::tuple{33, 45, 17}}) {
      for (tsr_activation act : kActs) {
        for (int with_bias = 0; with_bias < 2; with_bias++) {
          const std::string what =
              case_name("matmul_act_backward", d, {m, n, k},
                        std::string(act_name(act)) + (with_bias ? " +dbias" : ""));
          INFO(what);
          Gpu a({m, k}, d, randn(m * k, 81)), b({n, k}, d, randn(n * k, 82));
          Gpu pre({m, n}, d, randn(m * n, 83, -4, 4)), db({n}, d, randn(n, 84));
          Tensor c({m, n}, d);
          Cpu ca({m, k}, a.vals), cb({n, k}, b.vals), cp({m, n}, pre.vals), cdb({n}, db.vals);
          Cpu cc({m, n}, std::vector<float>(m * n));
          REQUIRE_OK(gpu().matmul_act_backward(ctx(), a.dl(), 0, b.dl(), 1, act, pre.dl(), c.dl(),
                                               with_bias ? db.dl() : nullptr));
          REQUIRE_OK(cpu().matmul_act_backward(ctx(), ca.dl(), 0, cb.dl(), 1, act, cp.dl(), cc.dl(),
                                               with_bias ? cdb.dl() : nullptr));
          // The fused epilogue rounds once where the CPU-like sequence of
          // 16-bit ops rounds twice: 2x the dtype's tolerance.
          expect_close(what + " c", c.get(), cc.get(), 2 * tol(d));
          if (with_bias) expect_close(what + " dbias", db.get(), cdb.get(), 4 * tol(d));

          // The unfused CUDA sequence.
          Tensor c_seq({m, n}, d);
          Gpu db_seq({n}, d, db.vals);
          REQUIRE_OK(gpu().matmul(ctx(), a.dl(), 0, b.dl(), 1, c_seq.dl(), 1.0f, 0.0f));
          REQUIRE_OK(gpu().act_backward(ctx(), act, pre.dl(), 0, c_seq.dl(), c_seq.dl()));
          if (with_bias) REQUIRE_OK(gpu().bias_grad(ctx(), c_seq.dl(), db_seq.dl()));
          expect_close(what + " c vs unfused", c.get(), c_seq.get(), 2 * tol(d));
        }
      }
    }
  }
}

TEST_CASE("cuda linear's epilogues have cuBLASLt algorithms at GPT-2 124M's shapes, in bf16",
          "[cuda][ops][fused]") {
  // One micro-batch row block of GPT-2 small (R tokens, C = 768), the four
  // linears of a block as plugins/models/gpt2 calls them: c_attn, attn
  // c_proj and mlp c_proj with BIAS, c_fc with GELU_AUX_BIAS (pre kept).
  constexpr int64_t R = 2048, C = 768;
  const uint64_t before = tessera::cuda::epilogue_misses();
  const Dt d = Dt::BF16;
  for (const auto &[in, out] : {std::pair{C, 3 * C}, std::pair{C, C}, std::pair{4 * C, C}}) {
    Gpu x({R, in}, d, randn(R * in, 91)), w({in, out}, d, randn(in * out, 92));
    Gpu b({out}, d, randn(out, 93));
    Tensor y({R, out}, d);
    REQUIRE_OK(gpu().linear(ctx(), x.dl(), 0, w.dl(), 0, b.dl(), TSR_ACT_NONE, y.dl(), nullptr));
  }
  Gpu x({R, C}, d, randn(R * C, 95)), w({C, 4 * C}, d, randn(4 * C * C, 96));
  Gpu b({4 * C}, d, randn(4 * C, 98));
  Tensor y({R, 4 * C}, d), pre({R, 4 * C}, d);
  REQUIRE_OK(gpu().linear(ctx(), x.dl(), 0, w.dl(), 0, b.dl(), TSR_ACT_GELU, y.dl(), pre.dl()));
  tessera::cuda::synchronize();
  // A miss is no error (the op falls back), but it is the speed-up lost.
  CHECK(tessera::cuda::epilogue_misses() == before);
}

}  // namespace gpu_test_cuda_fused
