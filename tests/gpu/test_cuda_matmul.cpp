// The CUDA matmul and linear against the CPU matmul and against a reference
// in double (cuda_ops_support.hpp says how dtypes are compared), and a
// benchmark of an MLP step built from them, not run by default.
#include <tessera/ops.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda_ops_support.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace gpu_test_cuda_matmul {

using namespace cuda_ops_test;

// ===========================================================================
// matmul

TEST_CASE("cuda matmul matches the CPU for every dtype and transpose", "[cuda][ops]") {
  struct Shape {
    int64_t m, k, n;
  };
  for (Dt d : kFloatDts) {
    for (Shape sh : {Shape{64, 96, 80}, Shape{33, 17, 45}, Shape{1, 8, 1}}) {
      for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
          for (float beta : {0.0f, 1.0f}) {
            const std::vector<int64_t> as =
                ta ? std::vector<int64_t>{sh.k, sh.m} : std::vector<int64_t>{sh.m, sh.k};
            const std::vector<int64_t> bs =
                tb ? std::vector<int64_t>{sh.n, sh.k} : std::vector<int64_t>{sh.k, sh.n};
            Gpu a(as, d, randn(sh.m * sh.k, 1)), b(bs, d, randn(sh.k * sh.n, 2));
            Gpu c({sh.m, sh.n}, d, randn(sh.m * sh.n, 3));
            Cpu ca(as, a.vals), cb(bs, b.vals), cc({sh.m, sh.n}, c.vals);
            REQUIRE_OK(gpu().matmul(ctx(), a.dl(), ta, b.dl(), tb, c.dl(), 0.7f, beta));
            REQUIRE_OK(cpu().matmul(ctx(), ca.dl(), ta, cb.dl(), tb, cc.dl(), 0.7f, beta));
            expect_close(case_name("matmul", d, {sh.m, sh.k, sh.n},
                                   "ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                                       " beta=" + std::to_string(beta)),
                         c.get(), cc.get(), tol(d));
          }
        }
      }
    }
  }
}

TEST_CASE("cuda matmul: a of more dims, float32 c from bf16 inputs, k = 0", "[cuda][ops]") {
  // a [2, 12, 16] is the 24 x 16 matrix.
  Gpu a({2, 12, 16}, Dt::BF16, randn(2 * 12 * 16, 4)), b({16, 8}, Dt::BF16, randn(16 * 8, 5));
  Gpu c({2, 12, 8}, Dt::F32, randn(2 * 12 * 8, 6));
  Cpu ca({24, 16}, a.vals), cb({16, 8}, b.vals), cc({24, 8}, c.vals);
  REQUIRE_OK(gpu().matmul(ctx(), a.dl(), 0, b.dl(), 0, c.dl(), 1.0f, 1.0f));
  REQUIRE_OK(cpu().matmul(ctx(), ca.dl(), 0, cb.dl(), 0, cc.dl(), 1.0f, 1.0f));
  expect_close("matmul bf16 x bf16 -> float32 c, beta=1", c.get(), cc.get(), 1e-5);

  // k = 0: c = beta * c.
  Gpu a0({4, 0}, Dt::F32, {}), b0({0, 5}, Dt::F32, {}), c0({4, 5}, Dt::F32, randn(20, 7));
  REQUIRE_OK(gpu().matmul(ctx(), a0.dl(), 0, b0.dl(), 0, c0.dl(), 1.0f, 0.5f));
  std::vector<double> want;
  for (float v : c0.vals) want.push_back(0.5 * v);
  expect_close("matmul k=0 beta=0.5", c0.get(), want, 1e-6);
  REQUIRE_OK(gpu().matmul(ctx(), a0.dl(), 0, b0.dl(), 0, c0.dl(), 1.0f, 0.0f));
  expect_close("matmul k=0 beta=0", c0.get(), std::vector<double>(20, 0.0), 0);
}

TEST_CASE("cuda matmul rejects bad arguments with a message", "[cuda][ops][errors]") {
  Gpu a({4, 8}, Dt::BF16, randn(32, 1)), b({8, 3}, Dt::BF16, randn(24, 2)),
      c({4, 3}, Dt::BF16, randn(12, 3));
  Tensor ha({4, 8}, Dt::BF16, kDLCPU);
  host().clear_error();
  CHECK(gpu().matmul(ctx(), ha.dl(), 0, b.dl(), 0, c.dl(), 1, 0) == TSR_ERR_INVALID);
  CHECK_THAT(last_error(), Catch::Contains("matmul: a bfloat16[4,8] is on device type 1, "
                                           "expected CUDA"));
  Gpu bad_c({4, 4}, Dt::BF16, randn(16, 3));
  CHECK(gpu().matmul(ctx(), a.dl(), 0, b.dl(), 0, bad_c.dl(), 1, 0) == TSR_ERR_INVALID);
  CHECK_THAT(last_error(), Catch::Contains("matmul: c must be 4x3"));
  CHECK(gpu().matmul(ctx(), a.dl(), 1, b.dl(), 0, c.dl(), 1, 0) == TSR_ERR_INVALID);
  CHECK_THAT(last_error(), Catch::Contains("inner dimensions differ"));
  Gpu f16_b({8, 3}, Dt::F16, randn(24, 2));
  CHECK(gpu().matmul(ctx(), a.dl(), 0, f16_b.dl(), 0, c.dl(), 1, 0) == TSR_ERR_UNSUPPORTED);
  CHECK_THAT(last_error(), Catch::Contains("same dtype"));
  Tensor ia({4, 8}, Dt::I32);
  CHECK(gpu().matmul(ctx(), ia.dl(), 0, b.dl(), 0, c.dl(), 1, 0) == TSR_ERR_UNSUPPORTED);
  CHECK_THAT(last_error(), Catch::Contains("matmul: a must be float32, bfloat16 or float16"));
  CHECK(gpu().matmul(ctx(), nullptr, 0, b.dl(), 0, c.dl(), 1, 0) == TSR_ERR_INVALID);
  CHECK_THAT(last_error(), Catch::Contains("matmul: a is NULL"));
  CHECK(gpu().matmul(ctx(), a.dl(), 0, b.dl(), 0, a.dl(), 1, 0) != TSR_OK);
}

// ===========================================================================
// linear: against a double reference (the CPU table may lack linear)

TEST_CASE("cuda linear: every activation, with and without bias and pre", "[cuda][ops]") {
  struct Shape {
    int64_t m, k, n;
  };
  // n % 8 == 0 takes cuBLASLt's GELU_AUX for pre; 35 takes the fallback.
  for (Dt d : kFloatDts) {
    for (Shape sh : {Shape{48, 64, 72}, Shape{20, 30, 35}}) {
      for (int tb = 0; tb < 2; tb++) {
        for (tsr_activation act : kActs) {
          for (int with_bias = 0; with_bias < 2; with_bias++) {
            for (int with_pre = 0; with_pre < 2; with_pre++) {
              const std::vector<int64_t> bs =
                  tb ? std::vector<int64_t>{sh.n, sh.k} : std::vector<int64_t>{sh.k, sh.n};
              Gpu a({sh.m, sh.k}, d, randn(sh.m * sh.k, 11)),
                  b(bs, d, randn(sh.k * sh.n, 12, -0.5f, 0.5f));
              Gpu bias({sh.n}, d, randn(sh.n, 13));
              Tensor c({sh.m, sh.n}, d), pre({sh.m, sh.n}, d);
              const std::string what = case_name(
                  "linear", d, {sh.m, sh.k, sh.n},
                  std::string("act=") + act_name(act) + " tb=" + std::to_string(tb) +
                      " bias=" + std::to_string(with_bias) + " pre=" + std::to_string(with_pre));
              INFO(what);
              REQUIRE_OK(gpu().linear(ctx(), a.dl(), 0, b.dl(), tb, with_bias ? bias.dl() : nullptr,
                                      act, c.dl(), with_pre ? pre.dl() : nullptr));
              std::vector<double> want_pre(sh.m * sh.n), want(sh.m * sh.n);
              for (int64_t i = 0; i < sh.m; i++) {
                for (int64_t j = 0; j < sh.n; j++) {
                  double s = with_bias ? bias.vals[j] : 0.0;
                  for (int64_t p = 0; p < sh.k; p++)
                    s += double(a.vals[i * sh.k + p]) * b.vals[tb ? j * sh.k + p : p * sh.n + j];
                  want_pre[i * sh.n + j] = s;
                  // The GPU rounds pre to the dtype before the activation
                  // only on some paths; either is within the tolerance.
                  want[i * sh.n + j] = ref_act(act, s);
                }
              }
              expect_close(what + " c", c.get(), want, tol(d));
              if (with_pre) expect_close(what + " pre", pre.get(), want_pre, tol(d));
            }
          }
        }
      }
    }
  }
}

// ===========================================================================
// A benchmark, not run by default ([.]): the MLP of the target, 4 layers of
// 4096, batch 1024, bf16, ReLU as bench/mlp_gpu: forward (linear with the
// fused relu epilogue) and backward (act_backward from the output,
// bias_grad, and two matmuls per layer).

TEST_CASE("cuda mlp step benchmark", "[.][bench]") {
  const int64_t B = 1024, H = 4096, L = 4;
  const Dt d = Dt::BF16;
  std::vector<std::unique_ptr<Tensor>> w, bias, dw, db, act;
  auto make = [&](std::vector<int64_t> s) {
    auto t = std::make_unique<Tensor>(std::move(s), d);
    REQUIRE_OK(gpu().fill(ctx(), t->dl(), 0.01f));
    return t;
  };
  act.push_back(make({B, H}));
  for (int l = 0; l < L; l++) {
    w.push_back(make({H, H}));
    bias.push_back(make({H}));
    dw.push_back(make({H, H}));
    db.push_back(make({H}));
    act.push_back(make({B, H}));
  }
  auto g1 = make({B, H}), g2 = make({B, H});
  auto step = [&] {
    for (int l = 0; l < L; l++)
      REQUIRE_OK(gpu().linear(ctx(), act[l]->dl(), 0, w[l]->dl(), 1, bias[l]->dl(), TSR_ACT_RELU,
                              act[l + 1]->dl(), nullptr));
    for (int l = L - 1; l >= 0; l--) {
      REQUIRE_OK(gpu().act_backward(ctx(), TSR_ACT_RELU, act[l + 1]->dl(), 1, g1->dl(), g1->dl()));
      REQUIRE_OK(gpu().bias_grad(ctx(), g1->dl(), db[l]->dl()));
      REQUIRE_OK(gpu().matmul(ctx(), g1->dl(), 1, act[l]->dl(), 0, dw[l]->dl(), 1.0f, 1.0f));
      REQUIRE_OK(gpu().matmul(ctx(), g1->dl(), 0, w[l]->dl(), 0, g2->dl(), 1.0f, 0.0f));
      std::swap(g1, g2);
    }
  };
  for (int i = 0; i < 3; i++) step();
  tessera::cuda::synchronize();
  const int iters = 20;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; i++) step();
  tessera::cuda::synchronize();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double flops = 3.0 * 2 * B * H * H * L;
  std::printf("mlp fwd+bwd (B=%ld H=%ld L=%ld bf16, relu): %.3f ms, %.1f TFLOP/s\n", long(B),
              long(H), long(L), 1e3 * s / iters, flops * iters / s / 1e12);
}

}  // namespace gpu_test_cuda_matmul
