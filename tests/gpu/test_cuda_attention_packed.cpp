// The CUDA attention over packed sequences (ABI 1.8 attention_packed_*,
// the engine's kernels: tensor cores for bf16/fp16, CUDA cores for fp32)
// against the CPU op on the same (rounded) values; the CPU op is held to a
// naive float64 reference of the document mask in
// tests/unit/test_cpu_attention_packed.cpp. Rows of several examples that
// cross the kernels' 64-row blocks, a one-token example, padding at
// position 0, MHA and GQA, head dims 64 and 128. Tolerances as the other
// decoder ops (test_cuda_decoder.cpp): float32 1e-4; bfloat16 and float16
// 1e-2 for forward values and 5e-2 for gradients.
#include <tessera/ops.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "cuda_ops_support.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace gpu_test_cuda_attention_packed {

using namespace cuda_ops_test;

namespace {

double fwd_tol(Dt d) {
  return d == Dt::F32 ? 1e-4 : 1e-2;
}
double grad_tol(Dt d) {
  return d == Dt::F32 ? 1e-4 : 5e-2;
}

// Positions [B, T]: examples of the given lengths end to end in each row
// (0, 1, ... per example), the rest of the row padding at position 0.
std::vector<int32_t> positions_of(int64_t T, const std::vector<std::vector<int64_t>> &rows) {
  std::vector<int32_t> pos(rows.size() * static_cast<size_t>(T), 0);
  for (size_t b = 0; b < rows.size(); b++) {
    int64_t t = 0;
    for (int64_t len : rows[b])
      for (int64_t j = 0; j < len; j++) pos[b * static_cast<size_t>(T) + t++] = int32_t(j);
  }
  return pos;
}

void check_case(Dt d, int64_t Hk, int64_t D) {
  const int64_t B = 2, T = 200, H = 8;
  const float scale = 0.125f;
  const std::string what = case_name("attention_packed", d, {B, T, H, Hk, D});
  INFO(what);
  const std::vector<int32_t> pos = positions_of(T, {{30, 100, 50}, {1, 64, 135}});
  Gpu q({B, T, H, D}, d, randn(B * T * H * D, 221)),
      k({B, T, Hk, D}, d, randn(B * T * Hk * D, 222));
  Gpu v({B, T, Hk, D}, d, randn(B * T * Hk * D, 223)),
      dout({B, T, H, D}, d, randn(B * T * H * D, 224));
  Tensor p({B, T}, Dt::I32);
  p.set_i32(pos);
  Tensor out({B, T, H, D}, d), lse({B, H, T}, Dt::F32);
  Tensor dq({B, T, H, D}, d), dk({B, T, Hk, D}, d), dv({B, T, Hk, D}, d);
  REQUIRE_OK(gpu().attention_packed_forward(ctx(), q.dl(), k.dl(), v.dl(), p.dl(), scale, out.dl(),
                                            lse.dl()));
  REQUIRE_OK(gpu().attention_packed_backward(ctx(), q.dl(), k.dl(), v.dl(), p.dl(), out.dl(),
                                             dout.dl(), lse.dl(), scale, dq.dl(), dk.dl(),
                                             dv.dl()));
  Cpu cq({B, T, H, D}, q.vals), ck({B, T, Hk, D}, k.vals), cv({B, T, Hk, D}, v.vals);
  Cpu cdo({B, T, H, D}, dout.vals), co({B, T, H, D}, std::vector<float>(B * T * H * D));
  Cpu cl({B, H, T}, std::vector<float>(B * H * T));
  Cpu cdq({B, T, H, D}, std::vector<float>(B * T * H * D));
  Cpu cdk({B, T, Hk, D}, std::vector<float>(B * T * Hk * D)),
      cdv({B, T, Hk, D}, std::vector<float>(B * T * Hk * D));
  Tensor cp({B, T}, Dt::I32, kDLCPU);
  cp.set_i32(pos);
  REQUIRE_OK(cpu().attention_packed_forward(ctx(), cq.dl(), ck.dl(), cv.dl(), cp.dl(), scale,
                                            co.dl(), cl.dl()));
  REQUIRE_OK(cpu().attention_packed_backward(ctx(), cq.dl(), ck.dl(), cv.dl(), cp.dl(), co.dl(),
                                             cdo.dl(), cl.dl(), scale, cdq.dl(), cdk.dl(),
                                             cdv.dl()));
  expect_close(what + " out", out.get(), co.get(), fwd_tol(d));
  expect_close(what + " lse", lse.get(), cl.get(), 1e-4);
  expect_close(what + " dq", dq.get(), cdq.get(), grad_tol(d));
  expect_close(what + " dk", dk.get(), cdk.get(), grad_tol(d));
  expect_close(what + " dv", dv.get(), cdv.get(), grad_tol(d));
}

}  // namespace

TEST_CASE("cuda ops table has the ABI 1.8 packed attention", "[cuda][ops][decoder][packing]") {
  CHECK(TSR_HAS_FIELD(&gpu(), tsr_ops, attention_packed_backward));
  CHECK(gpu().attention_packed_forward);
  CHECK(gpu().attention_packed_backward);
}

TEST_CASE("cuda attention_packed matches the CPU's document mask (MHA and GQA)",
          "[cuda][ops][decoder][packing]") {
  for (Dt d : kFloatDts)
    for (const int64_t Hk : {int64_t(8), int64_t(2)}) check_case(d, Hk, 64);
  check_case(Dt::BF16, 2, 128);
}

TEST_CASE("cuda attention_packed takes host tensors through the CPU op",
          "[cuda][ops][decoder][packing]") {
  const int64_t B = 1, T = 6, H = 2, D = 8;
  const std::vector<int32_t> pos = positions_of(T, {{2, 4}});
  Cpu q({B, T, H, D}, randn(B * T * H * D, 1)), k({B, T, H, D}, randn(B * T * H * D, 2));
  Cpu v({B, T, H, D}, randn(B * T * H * D, 3));
  Cpu out({B, T, H, D}, std::vector<float>(B * T * H * D)),
      lse({B, H, T}, std::vector<float>(B * H * T));
  Tensor p({B, T}, Dt::I32, kDLCPU);
  p.set_i32(pos);
  REQUIRE_OK(gpu().attention_packed_forward(ctx(), q.dl(), k.dl(), v.dl(), p.dl(), 0.5f, out.dl(),
                                            lse.dl()));
  Cpu out2({B, T, H, D}, std::vector<float>(B * T * H * D)),
      lse2({B, H, T}, std::vector<float>(B * H * T));
  REQUIRE_OK(cpu().attention_packed_forward(ctx(), q.dl(), k.dl(), v.dl(), p.dl(), 0.5f, out2.dl(),
                                            lse2.dl()));
  CHECK(out.get() == out2.get());
}

}  // namespace gpu_test_cuda_attention_packed
