// The CUDA ops of ABI 1.6's decoder blocks against the CPU ops on the same
// (rounded) values (cuda_ops_support.hpp says how dtypes are compared):
// RMSNorm and its residual-add form, SwiGLU (compact and as the halves of
// one [rows, 2F] buffer), rotary embedding (default and llama3, q and k as
// views into a fused qkv buffer), grouped-query attention (GQA and MQA;
// bf16 through cuDNN where it takes the call). Tolerances: float32 1e-4
// relative; bfloat16 and float16 the bars gpt2's GPU tests hold a step to,
// 1e-2 for forward values and 5e-2 for gradients.
#include <tessera/ops.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_ops_support.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace gpu_test_cuda_decoder {

using namespace cuda_ops_test;

namespace {

double fwd_tol(Dt d) {
  return d == Dt::F32 ? 1e-4 : 1e-2;
}
double grad_tol(Dt d) {
  return d == Dt::F32 ? 1e-4 : 5e-2;
}

bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A DLTensor header over t's memory with its own shape, strides and offset
// (in elements).
struct ViewOf {
  std::vector<int64_t> shape, strides;
  DLTensor t{};
  ViewOf(Tensor &base, std::vector<int64_t> s, std::vector<int64_t> st, int64_t offset)
      : shape(std::move(s)), strides(std::move(st)) {
    t = *base.dl();
    t.ndim = static_cast<int>(shape.size());
    t.shape = shape.data();
    t.strides = strides.data();
    t.byte_offset = static_cast<uint64_t>(offset) * size_of(base.dt);
  }
  DLTensor *dl() { return &t; }
};

tsr_rope_params rope(int32_t type) {
  tsr_rope_params p{};
  p.struct_size = tsr_rope_params_STRUCT_SIZE;
  p.type = type;
  p.theta = type == TSR_ROPE_LLAMA3 ? 500000.0 : 10000.0;
  p.factor = 32.0;
  p.low_freq_factor = 1.0;
  p.high_freq_factor = 4.0;
  p.original_max_position_embeddings = 8192;
  return p;
}

}  // namespace

TEST_CASE("cuda ops table has every ABI 1.6 entry", "[cuda][ops][decoder]") {
  CHECK(TSR_HAS_FIELD(&gpu(), tsr_ops, attention_gqa_backward));
  CHECK(gpu().rmsnorm_forward);
  CHECK(gpu().rmsnorm_backward);
  CHECK(gpu().add_rmsnorm_forward);
  CHECK(gpu().rope_forward);
  CHECK(gpu().rope_backward);
  CHECK(gpu().swiglu_forward);
  CHECK(gpu().swiglu_backward);
  CHECK(gpu().attention_gqa_forward);
  CHECK(gpu().attention_gqa_backward);
}

TEST_CASE("cuda rmsnorm forward and backward match the CPU", "[cuda][ops][decoder]") {
  for (Dt d : kFloatDts) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{64, 2048}, {3, 5, 40}, {7, 37}}) {
      const int64_t C = shape.back(), n = numel_of(shape), rows = n / C;
      const std::string what = case_name("rmsnorm", d, shape);
      INFO(what);
      Gpu x(shape, d, randn(n, 81, -3, 3)), w({C}, d, randn(C, 82, 0.5f, 1.5f));
      Gpu dy(shape, d, randn(n, 83)), dx(shape, d, randn(n, 84)), dw({C}, d, randn(C, 85));
      Tensor y(shape, d), rstd({rows}, Dt::F32);
      REQUIRE_OK(gpu().rmsnorm_forward(ctx(), x.dl(), w.dl(), 1e-5f, y.dl(), rstd.dl()));
      Cpu cx(shape, x.vals), cw({C}, w.vals), cy(shape, std::vector<float>(n));
      Cpu cr({rows}, std::vector<float>(rows)), cdy(shape, dy.vals), cdx(shape, dx.vals),
          cdw({C}, dw.vals);
      REQUIRE_OK(cpu().rmsnorm_forward(ctx(), cx.dl(), cw.dl(), 1e-5f, cy.dl(), cr.dl()));
      expect_close(what + " y", y.get(), cy.get(), fwd_tol(d));
      expect_close(what + " rstd", rstd.get(), cr.get(), 1e-4);
      REQUIRE_OK(
          gpu().rmsnorm_backward(ctx(), dy.dl(), x.dl(), w.dl(), rstd.dl(), dx.dl(), dw.dl()));
      REQUIRE_OK(
          cpu().rmsnorm_backward(ctx(), cdy.dl(), cx.dl(), cw.dl(), cr.dl(), cdx.dl(), cdw.dl()));
      expect_close(what + " dx", dx.get(), cdx.get(), grad_tol(d));
      expect_close(what + " dweight", dw.get(), cdw.get(), grad_tol(d));
      // ABI 1.11: no dweight (a frozen weight), the same dx bits.
      Gpu dx2(shape, d, randn(n, 84));
      REQUIRE_OK(
          gpu().rmsnorm_backward(ctx(), dy.dl(), x.dl(), w.dl(), rstd.dl(), dx2.dl(), nullptr));
      CHECK(dx2.get() == dx.get());
    }
  }
}

TEST_CASE("cuda add_rmsnorm_forward equals the add, then rmsnorm_forward", "[cuda][ops][decoder]") {
  for (Dt d : kFloatDts) {
    const std::vector<int64_t> shape{33, 256};
    const int64_t C = 256, n = numel_of(shape), rows = 33;
    INFO(case_name("add_rmsnorm_forward", d, shape));
    Gpu x(shape, d, randn(n, 91)), y(shape, d, randn(n, 92)), w({C}, d, randn(C, 93));
    Tensor r(shape, d), out(shape, d), rstd({rows}, Dt::F32);
    REQUIRE_OK(gpu().add_rmsnorm_forward(ctx(), x.dl(), y.dl(), w.dl(), 1e-6f, r.dl(), out.dl(),
                                         rstd.dl()));
    Gpu r_seq(shape, d, y.vals);
    Tensor out_seq(shape, d), rstd_seq({rows}, Dt::F32);
    REQUIRE_OK(gpu().axpy(ctx(), 1.0f, x.dl(), r_seq.dl()));
    REQUIRE_OK(
        gpu().rmsnorm_forward(ctx(), r_seq.dl(), w.dl(), 1e-6f, out_seq.dl(), rstd_seq.dl()));
    CHECK(same_bits(r.get(), r_seq.get()));
    CHECK(same_bits(out.get(), out_seq.get()));
    CHECK(same_bits(rstd.get(), rstd_seq.get()));
  }
}

TEST_CASE("cuda swiglu matches the CPU, compact and on halves of one buffer",
          "[cuda][ops][decoder]") {
  for (Dt d : kFloatDts) {
    for (const int64_t F : {int64_t(64), int64_t(37)}) {
      const int64_t rows = 19;
      const std::string what = case_name("swiglu", d, {rows, F});
      INFO(what);
      Gpu gu({rows, 2 * F}, d, randn(rows * 2 * F, 101, -5, 5));
      Gpu dout({rows, F}, d, randn(rows * F, 102));
      Tensor out({rows, F}, d), dgu({rows, 2 * F}, d);
      ViewOf gate(gu, {rows, F}, {2 * F, 1}, 0), up(gu, {rows, F}, {2 * F, 1}, F);
      ViewOf dgate(dgu, {rows, F}, {2 * F, 1}, 0), dup(dgu, {rows, F}, {2 * F, 1}, F);
      REQUIRE_OK(gpu().swiglu_forward(ctx(), gate.dl(), up.dl(), out.dl()));
      REQUIRE_OK(gpu().swiglu_backward(ctx(), gate.dl(), up.dl(), dout.dl(), dgate.dl(), dup.dl()));
      std::vector<float> g(rows * F), u(rows * F);
      for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < F; j++) {
          g[r * F + j] = gu.vals[r * 2 * F + j];
          u[r * F + j] = gu.vals[r * 2 * F + F + j];
        }
      Cpu cg({rows, F}, g), cu({rows, F}, u), cd({rows, F}, dout.vals);
      Cpu co({rows, F}, std::vector<float>(rows * F)), cdg({rows, F}, std::vector<float>(rows * F)),
          cdu({rows, F}, std::vector<float>(rows * F));
      REQUIRE_OK(cpu().swiglu_forward(ctx(), cg.dl(), cu.dl(), co.dl()));
      REQUIRE_OK(cpu().swiglu_backward(ctx(), cg.dl(), cu.dl(), cd.dl(), cdg.dl(), cdu.dl()));
      expect_close(what + " out", out.get(), co.get(), fwd_tol(d));
      const std::vector<float> got = dgu.get();
      std::vector<float> got_g(rows * F), got_u(rows * F);
      for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < F; j++) {
          got_g[r * F + j] = got[r * 2 * F + j];
          got_u[r * F + j] = got[r * 2 * F + F + j];
        }
      expect_close(what + " dgate", got_g, cdg.get(), grad_tol(d));
      expect_close(what + " dup", got_u, cdu.get(), grad_tol(d));
      // Compact and in place: out over up.
      Gpu g2({rows, F}, d, g), u2({rows, F}, d, u);
      REQUIRE_OK(gpu().swiglu_forward(ctx(), g2.dl(), u2.dl(), u2.dl()));
      CHECK(same_bits(u2.get(), out.get()));
    }
  }
}

TEST_CASE("cuda swiglu_backward_out gives swiglu_forward's and swiglu_backward's bits (ABI 1.12)",
          "[cuda][ops][decoder]") {
  REQUIRE(TSR_HAS_FIELD(&gpu(), tsr_ops, swiglu_backward_out));
  REQUIRE(gpu().swiglu_backward_out);
  for (Dt d : kFloatDts) {
    for (const int64_t F : {int64_t(64), int64_t(37)}) {  // 8-element packs, and single elements
      const int64_t rows = 19;
      const std::string what = case_name("swiglu_backward_out", d, {rows, F});
      INFO(what);
      Gpu gu({rows, 2 * F}, d, randn(rows * 2 * F, 111, -5, 5));
      Gpu dout({rows, F}, d, randn(rows * F, 112));
      Tensor out_ref({rows, F}, d), out({rows, F}, d), dgu_ref({rows, 2 * F}, d),
          dgu({rows, 2 * F}, d);
      ViewOf gate(gu, {rows, F}, {2 * F, 1}, 0), up(gu, {rows, F}, {2 * F, 1}, F);
      ViewOf dgate_ref(dgu_ref, {rows, F}, {2 * F, 1}, 0),
          dup_ref(dgu_ref, {rows, F}, {2 * F, 1}, F);
      ViewOf dgate(dgu, {rows, F}, {2 * F, 1}, 0), dup(dgu, {rows, F}, {2 * F, 1}, F);
      REQUIRE_OK(gpu().swiglu_forward(ctx(), gate.dl(), up.dl(), out_ref.dl()));
      REQUIRE_OK(gpu().swiglu_backward(ctx(), gate.dl(), up.dl(), dout.dl(), dgate_ref.dl(),
                                       dup_ref.dl()));
      REQUIRE_OK(gpu().swiglu_backward_out(ctx(), gate.dl(), up.dl(), dout.dl(), dgate.dl(),
                                           dup.dl(), out.dl()));
      CHECK(same_bits(out.get(), out_ref.get()));
      CHECK(same_bits(dgu.get(), dgu_ref.get()));
      // out over up's half of the buffer: refused, gate and up untouched.
      const std::vector<float> before = gu.get();
      CHECK(gpu().swiglu_backward_out(ctx(), gate.dl(), up.dl(), dout.dl(), dgate.dl(), dup.dl(),
                                      up.dl()) == TSR_ERR_INVALID);
      CHECK(same_bits(gu.get(), before));
    }
  }
}

TEST_CASE("cuda rope matches the CPU on views into a fused qkv buffer", "[cuda][ops][decoder]") {
  const int64_t B = 2, T = 33, Hq = 8, Hk = 2, D = 64, W = (Hq + 2 * Hk) * D;
  std::vector<int32_t> pos(B * T);
  for (int64_t i = 0; i < B * T; i++) pos[i] = static_cast<int32_t>(i < T ? i : (i - T) % 5);
  pos.back() = 100000;
  for (Dt d : kFloatDts) {
    for (const int32_t type : {TSR_ROPE_DEFAULT, TSR_ROPE_LLAMA3}) {
      const std::string what =
          case_name("rope", d, {B, T, Hq, Hk, D}, "type " + std::to_string(type));
      INFO(what);
      const tsr_rope_params p = rope(type);
      Gpu qkv({B, T, W}, d, randn(B * T * W, 111));
      Tensor positions({B, T}, Dt::I32);
      positions.set_i32(pos);
      ViewOf q(qkv, {B, T, Hq, D}, {T * W, W, D, 1}, 0);
      ViewOf k(qkv, {B, T, Hk, D}, {T * W, W, D, 1}, Hq * D);
      Cpu cqkv({B, T, W}, qkv.vals);
      Tensor cpos({B, T}, Dt::I32, kDLCPU);
      cpos.set_i32(pos);
      ViewOf cq(cqkv, {B, T, Hq, D}, {T * W, W, D, 1}, 0);
      ViewOf ck(cqkv, {B, T, Hk, D}, {T * W, W, D, 1}, Hq * D);
      REQUIRE_OK(gpu().rope_forward(ctx(), &p, positions.dl(), q.dl(), k.dl()));
      REQUIRE_OK(cpu().rope_forward(ctx(), &p, cpos.dl(), cq.dl(), ck.dl()));
      expect_close(what + " forward", qkv.get(), cqkv.get(), fwd_tol(d));
      // Backward in place on the same views (v untouched throughout).
      REQUIRE_OK(gpu().rope_backward(ctx(), &p, positions.dl(), q.dl(), k.dl()));
      REQUIRE_OK(cpu().rope_backward(ctx(), &p, cpos.dl(), cq.dl(), ck.dl()));
      expect_close(what + " backward", qkv.get(), cqkv.get(), grad_tol(d));
      // The rotation's transpose undoes it.
      expect_close(what + " round trip", qkv.get(), qkv.vals, grad_tol(d));
    }
  }
}

// Head dim 64 copies K/V per query head and sums their gradients 16 bytes
// at a time; 36 (not a multiple of 8 elements) takes the element-wise copies
// in bf16/fp16.
TEST_CASE("cuda attention_gqa matches the CPU (GQA and MQA)", "[cuda][ops][decoder]") {
  for (Dt d : kFloatDts)
    for (const int64_t D : {int64_t(64), int64_t(36)}) {
      for (const int64_t Hk : {int64_t(2), int64_t(1), int64_t(8)}) {
        const int64_t B = 2, T = 128, H = 8;
        const float scale = 0.125f;
        const std::string what = case_name("attention_gqa", d, {B, T, H, Hk, D});
        INFO(what);
        Gpu q({B, T, H, D}, d, randn(B * T * H * D, 121)),
            k({B, T, Hk, D}, d, randn(B * T * Hk * D, 122));
        Gpu v({B, T, Hk, D}, d, randn(B * T * Hk * D, 123)),
            dout({B, T, H, D}, d, randn(B * T * H * D, 124));
        Tensor out({B, T, H, D}, d), lse({B, H, T}, Dt::F32);
        Tensor dq({B, T, H, D}, d), dk({B, T, Hk, D}, d), dv({B, T, Hk, D}, d);
        REQUIRE_OK(
            gpu().attention_gqa_forward(ctx(), q.dl(), k.dl(), v.dl(), scale, out.dl(), lse.dl()));
        REQUIRE_OK(gpu().attention_gqa_backward(ctx(), q.dl(), k.dl(), v.dl(), out.dl(), dout.dl(),
                                                lse.dl(), scale, dq.dl(), dk.dl(), dv.dl()));
        Cpu cq({B, T, H, D}, q.vals), ck({B, T, Hk, D}, k.vals), cv({B, T, Hk, D}, v.vals);
        Cpu cdo({B, T, H, D}, dout.vals), co({B, T, H, D}, std::vector<float>(B * T * H * D));
        Cpu cl({B, H, T}, std::vector<float>(B * H * T));
        Cpu cdq({B, T, H, D}, std::vector<float>(B * T * H * D));
        Cpu cdk({B, T, Hk, D}, std::vector<float>(B * T * Hk * D)),
            cdv({B, T, Hk, D}, std::vector<float>(B * T * Hk * D));
        REQUIRE_OK(
            cpu().attention_gqa_forward(ctx(), cq.dl(), ck.dl(), cv.dl(), scale, co.dl(), cl.dl()));
        REQUIRE_OK(cpu().attention_gqa_backward(ctx(), cq.dl(), ck.dl(), cv.dl(), co.dl(), cdo.dl(),
                                                cl.dl(), scale, cdq.dl(), cdk.dl(), cdv.dl()));
        expect_close(what + " out", out.get(), co.get(), fwd_tol(d));
        expect_close(what + " lse", lse.get(), cl.get(), 1e-4);
        expect_close(what + " dq", dq.get(), cdq.get(), grad_tol(d));
        expect_close(what + " dk", dk.get(), cdk.get(), grad_tol(d));
        expect_close(what + " dv", dv.get(), cdv.get(), grad_tol(d));
      }
    }
}

TEST_CASE("cuda attention_gqa refuses head counts that do not divide", "[cuda][ops][decoder]") {
  Tensor q({1, 4, 6, 64}, Dt::BF16), k({1, 4, 4, 64}, Dt::BF16), v({1, 4, 4, 64}, Dt::BF16);
  Tensor out({1, 4, 6, 64}, Dt::BF16), lse({1, 6, 4}, Dt::F32);
  CHECK(gpu().attention_gqa_forward(ctx(), q.dl(), k.dl(), v.dl(), 1.0f, out.dl(), lse.dl()) ==
        TSR_ERR_INVALID);
  CHECK_THAT(last_error(), Catch::Contains("must divide q's 6"));
}

}  // namespace gpu_test_cuda_decoder
