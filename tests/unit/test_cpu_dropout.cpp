// ABI 1.9's dropout op on the CPU. The generator against Random123's
// published known-answer vectors for Philox4x32-10; the op against the
// layout sdk ops.h promises (element i keeps iff the top 24 bits of word
// i % 4 of block i / 4, over 2^24, are >= p), its scale and beta, the
// share it keeps, that streams and seeds differ, that the pool's split
// does not change the mask, and its refusals. ABI 1.10's lowrank_dropout
// against the test's own float32 sums put through the dropout op.
#include <tessera/ops.h>

#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_ops.hpp"
#include "unit/cpu_ops_nn11_support.hpp"
#include "util/philox.hpp"

namespace unit_test_cpu_dropout {

using namespace tessera::test::cpu_ops_nn11_support;
namespace philox = tessera::philox;

TEST_CASE("Philox4x32-10 gives Random123's known answers", "[cpu][ops][dropout]") {
  struct Kat {
    uint32_t c[4], k[2], out[4];
  };
  // Random123 tests/kat_vectors, "philox4x32 10" lines.
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat &k : kats) {
    const philox::Block b = philox::philox4x32_10(k.c[0], k.c[1], k.c[2], k.c[3], k.k[0], k.k[1]);
    for (int i = 0; i < 4; i++) CHECK(b.w[i] == k.out[i]);
  }
}

// The op's mask by its documented layout, from the generator alone.
bool kept(uint64_t seed, uint64_t stream, uint64_t i, float p) {
  const philox::Block b =
      philox::philox4x32_10(static_cast<uint32_t>(i / 4), static_cast<uint32_t>((i / 4) >> 32),
                            static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32),
                            static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return static_cast<double>(b.w[i % 4] >> 8) / 16777216.0 >= static_cast<double>(p);
}

TEST_CASE("dropout keeps by the documented Philox layout and scales by 1 / (1 - p)",
          "[cpu][ops][dropout]") {
  // 1003 elements: the last block is partial. A stream and seed that use
  // both halves of the counter and key words.
  const uint64_t seed = 0x0123456789abcdefULL, stream = 0xfedcba9876543210ULL;
  const float p = 0.3f;
  F32 x({17, 59}), y({17, 59});
  randomize(x.v, 7);
  REQUIRE(ops().dropout(nullptr, x.dl(), p, seed, stream, 0.0f, y.dl()) == TSR_OK);
  const float scale = static_cast<float>(1.0 / (1.0 - 0.3f));
  int64_t n_kept = 0;
  for (size_t i = 0; i < x.v.size(); i++) {
    INFO("element " << i);
    const bool k = kept(seed, stream, i, p);
    n_kept += k;
    CHECK(y.v[i] == (k ? x.v[i] * scale : 0.0f));
  }
  CHECK(n_kept > 0);
  CHECK(n_kept < static_cast<int64_t>(x.v.size()));

  // beta = 1 adds into y; in place (y = x) gives the same values.
  F32 acc({17, 59}, 0.5f);
  REQUIRE(ops().dropout(nullptr, x.dl(), p, seed, stream, 1.0f, acc.dl()) == TSR_OK);
  for (size_t i = 0; i < x.v.size(); i++) CHECK(acc.v[i] == 0.5f + y.v[i]);
  F32 same = x;
  REQUIRE(ops().dropout(nullptr, same.dl(), p, seed, stream, 0.0f, same.dl()) == TSR_OK);
  CHECK(same.v == y.v);

  // beta = 0 does not read y: NaN there changes nothing.
  F32 nan({17, 59}, std::numeric_limits<float>::quiet_NaN());
  REQUIRE(ops().dropout(nullptr, x.dl(), p, seed, stream, 0.0f, nan.dl()) == TSR_OK);
  CHECK(nan.v == y.v);

  // p = 0 keeps every element, unscaled.
  F32 all({17, 59});
  REQUIRE(ops().dropout(nullptr, x.dl(), 0.0f, seed, stream, 0.0f, all.dl()) == TSR_OK);
  CHECK(all.v == x.v);
}

TEST_CASE("dropout keeps 1 - p of the elements; streams and seeds draw other masks",
          "[cpu][ops][dropout]") {
  const int64_t n = 1 << 20;
  F32 ones({n}, 1.0f), a({n}), b({n}), c({n});
  for (float p : {0.1f, 0.5f}) {
    INFO("p " << p);
    REQUIRE(ops().dropout(nullptr, ones.dl(), p, 42, 7, 0.0f, a.dl()) == TSR_OK);
    REQUIRE(ops().dropout(nullptr, ones.dl(), p, 42, 8, 0.0f, b.dl()) == TSR_OK);
    REQUIRE(ops().dropout(nullptr, ones.dl(), p, 43, 7, 0.0f, c.dl()) == TSR_OK);
    int64_t ka = 0, same_ab = 0, same_ac = 0;
    for (int64_t i = 0; i < n; i++) {
      ka += a.v[i] != 0.0f;
      same_ab += (a.v[i] != 0.0f) == (b.v[i] != 0.0f);
      same_ac += (a.v[i] != 0.0f) == (c.v[i] != 0.0f);
    }
    // Binomial(n, 1 - p): its standard deviation is at most 512 here; 6
    // of them.
    CHECK(std::fabs(static_cast<double>(ka) - n * (1.0 - p)) < 3100);
    // Independent masks agree on a share p^2 + (1 - p)^2 of the elements.
    const double agree = p * p + (1.0 - p) * (1.0 - p);
    CHECK(std::fabs(static_cast<double>(same_ab) - n * agree) < 3100);
    CHECK(std::fabs(static_cast<double>(same_ac) - n * agree) < 3100);
  }
}

TEST_CASE("dropout's mask does not depend on the pool's threads", "[cpu][ops][dropout]") {
  F32 x({300001}), one({300001}), two({300001});
  randomize(x.v, 3);
  tessera::cpu_ops_set_threads(1);
  REQUIRE(ops().dropout(nullptr, x.dl(), 0.25f, 9, 1, 0.0f, one.dl()) == TSR_OK);
  tessera::cpu_ops_set_threads(2);
  REQUIRE(ops().dropout(nullptr, x.dl(), 0.25f, 9, 1, 0.0f, two.dl()) == TSR_OK);
  tessera::cpu_ops_set_threads(0);
  CHECK(one.v == two.v);
}

TEST_CASE("dropout refuses p outside [0, 1), a non-finite beta and mismatched sizes",
          "[cpu][ops][dropout]") {
  Msgs m;
  F32 x({4, 3}), y({4, 3}), small({5});
  for (float p : {1.0f, -0.1f, std::numeric_limits<float>::quiet_NaN()}) {
    CHECK(ops().dropout(m.ctx(), x.dl(), p, 1, 1, 0.0f, y.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Catch::Contains("p must lie in [0, 1)"));
  }
  CHECK(ops().dropout(m.ctx(), x.dl(), 0.1f, 1, 1, std::numeric_limits<float>::infinity(),
                      y.dl()) == TSR_ERR_INVALID);
  CHECK_THAT(m.last(), Catch::Contains("beta must be finite"));
  CHECK(ops().dropout(m.ctx(), x.dl(), 0.1f, 1, 1, 0.0f, small.dl()) != TSR_OK);
  CHECK_THAT(m.last(), Catch::Contains("dropout"));
}

// a @ b as lowrank_dropout documents its sums (ops.h): one fused
// multiply-add a term, k rising, from 0 in float32. The test's own loop.
std::vector<float> fma_product(const F32 &a, const F32 &b, int64_t M, int64_t r, int64_t N) {
  std::vector<float> s(static_cast<size_t>(M * N), 0.0f);
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++)
      for (int64_t k = 0; k < r; k++)
        s[m * N + n] = std::fma(a.v[m * r + k], b.v[k * N + n], s[m * N + n]);
  return s;
}

TEST_CASE("lowrank_dropout is the dropout op over the float32 product, without its scratch",
          "[cpu][ops][dropout]") {
  const uint64_t seed = 0x0123456789abcdefULL, stream = 0xfedcba9876543210ULL;
  // N = 6: the mask's blocks of four straddle rows; N = 64: they do not.
  for (const auto &[M, r, N] : {std::array<int64_t, 3>{37, 16, 64}, {9, 3, 6}, {5, 1, 1}}) {
    INFO("M " << M << " r " << r << " N " << N);
    F32 a({M, r}), b({r, N}), scratch({M, N});
    randomize(a.v, 11);
    randomize(b.v, 12);
    scratch.v = fma_product(a, b, M, r, N);
    for (float beta : {0.0f, 1.0f, 0.5f}) {
      INFO("beta " << beta);
      F32 want({M, N}), got({M, N});
      randomize(want.v, 13);
      got.v = want.v;
      REQUIRE(ops().dropout(nullptr, scratch.dl(), 0.2f, seed, stream, beta, want.dl()) == TSR_OK);
      REQUIRE(ops().lowrank_dropout(nullptr, a.dl(), b.dl(), 0.2f, seed, stream, beta, got.dl()) ==
              TSR_OK);
      CHECK(got.v == want.v);
    }
  }
}

TEST_CASE("lowrank_dropout at p = 0 adds the product; beta = 0 does not read y",
          "[cpu][ops][dropout]") {
  const int64_t M = 23, r = 8, N = 40;
  F32 a({M, r}), b({r, N}), y({M, N}, 0.25f);
  randomize(a.v, 21);
  randomize(b.v, 22);
  REQUIRE(ops().lowrank_dropout(nullptr, a.dl(), b.dl(), 0.0f, 5, 6, 1.0f, y.dl()) == TSR_OK);
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      double s = 0.25;
      for (int64_t k = 0; k < r; k++) s += double(a.v[m * r + k]) * double(b.v[k * N + n]);
      CHECK(y.v[m * N + n] == Approx(s).epsilon(1e-5).margin(1e-5));
    }
  F32 nan({M, N}, std::numeric_limits<float>::quiet_NaN()), zero({M, N}, 0.0f);
  REQUIRE(ops().lowrank_dropout(nullptr, a.dl(), b.dl(), 0.3f, 5, 6, 0.0f, nan.dl()) == TSR_OK);
  REQUIRE(ops().lowrank_dropout(nullptr, a.dl(), b.dl(), 0.3f, 5, 6, 0.0f, zero.dl()) == TSR_OK);
  CHECK(nan.v == zero.v);
}

TEST_CASE("lowrank_dropout refuses shapes that do not chain, a rank over 256 and bad p",
          "[cpu][ops][dropout]") {
  Msgs m;
  F32 a({4, 3}), b({3, 5}), y({4, 5}), b_wrong({2, 5}), y_wrong({4, 6}), flat({20});
  CHECK(ops().lowrank_dropout(m.ctx(), a.dl(), b_wrong.dl(), 0.1f, 1, 1, 0.0f, y.dl()) ==
        TSR_ERR_INVALID);
  CHECK_THAT(m.last(), Catch::Contains("lowrank_dropout") && Catch::Contains("b [r, N]"));
  CHECK(ops().lowrank_dropout(m.ctx(), a.dl(), b.dl(), 0.1f, 1, 1, 0.0f, y_wrong.dl()) ==
        TSR_ERR_INVALID);
  CHECK(ops().lowrank_dropout(m.ctx(), a.dl(), b.dl(), 0.1f, 1, 1, 0.0f, flat.dl()) ==
        TSR_ERR_INVALID);
  CHECK_THAT(m.last(), Catch::Contains("2-D"));
  F32 wide_a({2, 257}), wide_b({257, 4}), wide_y({2, 4});
  CHECK(ops().lowrank_dropout(m.ctx(), wide_a.dl(), wide_b.dl(), 0.1f, 1, 1, 0.0f, wide_y.dl()) ==
        TSR_ERR_INVALID);
  CHECK_THAT(m.last(), Catch::Contains("[1, 256]"));
  CHECK(ops().lowrank_dropout(m.ctx(), a.dl(), b.dl(), 1.0f, 1, 1, 0.0f, y.dl()) ==
        TSR_ERR_INVALID);
  CHECK_THAT(m.last(), Catch::Contains("p must lie in [0, 1)"));
}

}  // namespace unit_test_cpu_dropout
