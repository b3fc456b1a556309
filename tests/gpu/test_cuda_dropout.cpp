// The CUDA dropout (ABI 1.9) against the CPU op, which
// tests/unit/test_cpu_dropout.cpp holds to Random123's known answers and
// the documented layout: the same seed and stream keep the same elements
// on both sides (float32 values bit for bit; bfloat16 and float16 the CPU's
// value rounded once to the dtype), beta accumulates, and host tensors go
// through the CPU op. ABI 1.10's lowrank_dropout the same way: its sums are
// one fmaf a term on both sides, so float32 agrees bit for bit.
#include <tessera/ops.h>

#include <array>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "cuda_ops_support.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace gpu_test_cuda_dropout {

using namespace cuda_ops_test;

TEST_CASE("cuda ops table has the ABI 1.9 dropout and 1.10 lowrank_dropout",
          "[cuda][ops][dropout]") {
  CHECK(TSR_HAS_FIELD(&gpu(), tsr_ops, dropout));
  CHECK(gpu().dropout);
  CHECK(TSR_HAS_FIELD(&gpu(), tsr_ops, lowrank_dropout));
  CHECK(gpu().lowrank_dropout);
}

TEST_CASE("cuda dropout keeps the CPU's elements, with its values", "[cuda][ops][dropout]") {
  // An odd count (the last Philox block is partial: the element-wise
  // kernel) and a multiple of four (a quad per access).
  const uint64_t seed = 0x0123456789abcdefULL, stream = 0xfedcba9876543210ULL;
  for (const int64_t n : {int64_t{3 * 1000 * 1000 + 7}, int64_t{3 * 1000 * 1000}})
    for (Dt d : kFloatDts)
      for (const float beta : {0.0f, 1.0f}) {
        const std::string what = case_name("dropout", d, {n}) + (beta != 0 ? " beta 1" : "");
        INFO(what);
        Gpu x({n}, d, randn(static_cast<size_t>(n), 5)),
            y({n}, d, randn(static_cast<size_t>(n), 6));
        Cpu cx({n}, x.vals), cy({n}, y.vals);
        REQUIRE_OK(gpu().dropout(ctx(), x.dl(), 0.3f, seed, stream, beta, y.dl()));
        REQUIRE_OK(cpu().dropout(ctx(), cx.dl(), 0.3f, seed, stream, beta, cy.dl()));
        const std::vector<float> got = y.get(), want = rounded(d, cy.get());
        size_t zeros_got = 0, zeros_want = 0, differ = 0;
        for (size_t i = 0; i < got.size(); i++) {
          zeros_got += got[i] == 0.0f;
          zeros_want += want[i] == 0.0f;
          differ += got[i] != want[i];
        }
        CHECK(zeros_got == zeros_want);
        // The CPU's float32 result rounded once to d is what the kernel stores.
        CHECK(differ == 0);
      }
}

TEST_CASE("cuda dropout in place, and p = 0 keeps every element", "[cuda][ops][dropout]") {
  const int64_t n = 100003;
  for (const int64_t count : {n, n - 3}) {  // element-wise, then by quads
    Gpu x({count}, Dt::F32, randn(static_cast<size_t>(count), 7));
    Cpu cx({count}, x.vals);
    REQUIRE_OK(gpu().dropout(ctx(), x.dl(), 0.5f, 11, 12, 0.0f, x.dl()));
    REQUIRE_OK(cpu().dropout(ctx(), cx.dl(), 0.5f, 11, 12, 0.0f, cx.dl()));
    CHECK(x.get() == cx.get());
  }
  Gpu y({n}, Dt::F32, randn(static_cast<size_t>(n), 8));
  REQUIRE_OK(gpu().dropout(ctx(), y.dl(), 0.0f, 11, 12, 0.0f, y.dl()));
  CHECK(y.get() == y.vals);
}

TEST_CASE("cuda dropout takes host tensors through the CPU op", "[cuda][ops][dropout]") {
  Cpu x({1000}, randn(1000, 1)), a({1000}, std::vector<float>(1000)),
      b({1000}, std::vector<float>(1000));
  REQUIRE_OK(gpu().dropout(ctx(), x.dl(), 0.5f, 3, 4, 0.0f, a.dl()));
  REQUIRE_OK(cpu().dropout(ctx(), x.dl(), 0.5f, 3, 4, 0.0f, b.dl()));
  CHECK(a.get() == b.get());
}

TEST_CASE("cuda lowrank_dropout gives the CPU's bits", "[cuda][ops][dropout]") {
  const uint64_t seed = 0x0123456789abcdefULL, stream = 0xfedcba9876543210ULL;
  // LoRA's backward shape (rows, rank 16, width) by tiles of 8 rows with a
  // last partial one; partial column tiles, ranks that end in chunks of 8,
  // 4 and 1; the largest rank the op takes; N % 4 != 0 (the
  // element-wise kernel); rank 1.
  for (const auto &[M, r, N] : {std::array<int64_t, 3>{4099, 16, 2048},
                                {13, 11, 600},
                                {9, 20, 8},
                                {5, 256, 12},
                                {37, 8, 70},
                                {6, 1, 5}})
    for (Dt d : kFloatDts)
      for (const float beta : {0.0f, 1.0f}) {
        const std::string what =
            case_name("lowrank_dropout", d, {M, r, N}) + (beta != 0 ? " beta 1" : "");
        INFO(what);
        Gpu a({M, r}, d, randn(static_cast<size_t>(M * r), 1)),
            b({r, N}, d, randn(static_cast<size_t>(r * N), 2)),
            y({M, N}, d, randn(static_cast<size_t>(M * N), 3));
        Cpu ca({M, r}, a.vals), cb({r, N}, b.vals), cy({M, N}, y.vals);
        REQUIRE_OK(gpu().lowrank_dropout(ctx(), a.dl(), b.dl(), 0.1f, seed, stream, beta, y.dl()));
        REQUIRE_OK(
            cpu().lowrank_dropout(ctx(), ca.dl(), cb.dl(), 0.1f, seed, stream, beta, cy.dl()));
        const std::vector<float> got = y.get(), want = rounded(d, cy.get());
        size_t differ = 0;
        for (size_t i = 0; i < got.size(); i++) differ += got[i] != want[i];
        CHECK(differ == 0);
      }
}

}  // namespace gpu_test_cuda_dropout
