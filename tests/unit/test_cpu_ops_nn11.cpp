// The CPU ops added in ABI 1.1 (linear, layernorm, embedding), against
// references written out independently here: linear against the matmul +
// bias_act it stands for, layernorm against a double-precision forward and
// central differences of it, embedding against plain loops. Cast (and copy
// of any dtype) is in test_cpu_ops_nn11_cast.cpp; attention has its own
// tests.
#include <tessera/ops.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu_ops_nn11_support.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_cpu_ops_nn11 {

using Catch::Matchers::Contains;
using namespace tessera::test::cpu_ops_nn11_support;

TEST_CASE("cpu ops table has every ABI 1.1 entry", "[ops]") {
  const tsr_ops &o = ops();
  CHECK(TSR_HAS_FIELD(&o, tsr_ops, attention_backward));
  CHECK(o.cast);
  CHECK(o.linear);
  CHECK(o.layernorm_forward);
  CHECK(o.layernorm_backward);
  CHECK(o.embedding_forward);
  CHECK(o.embedding_backward);
  CHECK(o.attention_forward);
  CHECK(o.attention_backward);
}

// ---------------------------------------------------------------------------
// linear

namespace {

bool close(double got, double want, double tol) {
  return std::fabs(got - want) <= tol * (1.0 + std::fabs(want));
}

double ref_act(tsr_activation act, double x) {
  switch (act) {
    case TSR_ACT_RELU:
      return x > 0 ? x : 0;
    case TSR_ACT_TANH:
      return std::tanh(x);
    case TSR_ACT_GELU:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    default:
      return x;
  }
}

void check_linear(int64_t m, int64_t n, int64_t k, int ta, int tb, bool with_bias,
                  tsr_activation act, bool with_pre, uint32_t seed) {
  INFO("m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb
            << " bias=" << with_bias << " act=" << act << " pre=" << with_pre);
  // a as [2, m/2, k] (or its transpose) to exercise the N-D view of a and c.
  const std::vector<int64_t> ashape =
      ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{2, m / 2, k};
  F32 a(ashape), b(tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}), bias({n});
  F32 c({2, m / 2, n}, 7.0f), pre({m, n}, 7.0f);  // stale values: must be overwritten
  randomize(a.v, seed);
  randomize(b.v, seed + 1);
  randomize(bias.v, seed + 2);
  REQUIRE(ops().linear(nullptr, a.dl(), ta, b.dl(), tb, with_bias ? bias.dl() : nullptr, act,
                       c.dl(), with_pre ? pre.dl() : nullptr) == TSR_OK);

  // What linear stands for: matmul, then bias_act (a zero bias when none).
  F32 z({m, n}), zero({n});
  REQUIRE(ops().matmul(nullptr, a.dl(), ta, b.dl(), tb, z.dl(), 1.0f, 0.0f) == TSR_OK);
  F32 zpre = z;
  REQUIRE(ops().bias_act(nullptr, zpre.dl(), with_bias ? bias.dl() : zero.dl(), TSR_ACT_NONE) ==
          TSR_OK);
  REQUIRE(ops().bias_act(nullptr, z.dl(), with_bias ? bias.dl() : zero.dl(), act) == TSR_OK);
  for (size_t i = 0; i < z.v.size(); i++) {
    INFO("element " << i);
    REQUIRE(c.v[i] == Approx(z.v[i]).epsilon(1e-6).margin(1e-6));
    if (with_pre) REQUIRE(pre.v[i] == zpre.v[i]);
  }
  if (!with_pre) {
    for (float e : pre.v) REQUIRE(e == 7.0f);  // untouched
  }

  // And a double-precision spot check of the math itself.
  for (int64_t i = 0; i < m; i += 3) {
    for (int64_t j = 0; j < n; j += 2) {
      double s = with_bias ? bias.v[static_cast<size_t>(j)] : 0.0;
      for (int64_t p = 0; p < k; p++)
        s += double(ta ? a.v[p * m + i] : a.v[i * k + p]) * (tb ? b.v[j * k + p] : b.v[p * n + j]);
      REQUIRE(close(c.v[i * n + j], ref_act(act, s), 1e-5));
    }
  }
}

}  // namespace

TEST_CASE("linear equals matmul then bias_act, for each activation and transpose", "[ops]") {
  uint32_t seed = 100;
  for (tsr_activation act : {TSR_ACT_NONE, TSR_ACT_RELU, TSR_ACT_GELU, TSR_ACT_TANH}) {
    for (int ta = 0; ta < 2; ta++) {
      for (int tb = 0; tb < 2; tb++) {
        check_linear(6, 5, 7, ta, tb, true, act, false, seed++);
        check_linear(6, 5, 7, ta, tb, true, act, true, seed++);
        check_linear(6, 5, 7, ta, tb, false, act, false, seed++);
        check_linear(6, 5, 7, ta, tb, false, act, true, seed++);
      }
    }
    check_linear(34, 65, 130, 0, 1, true, act, true, seed++);
  }
}

TEST_CASE("linear: pre may be c itself", "[ops]") {
  F32 a({3, 4}), b({4, 5}), bias({5}), c({3, 5}), want({3, 5}), want_pre({3, 5});
  randomize(a.v, 1);
  randomize(b.v, 2);
  randomize(bias.v, 3);
  REQUIRE(ops().linear(nullptr, a.dl(), 0, b.dl(), 0, bias.dl(), TSR_ACT_GELU, want.dl(),
                       want_pre.dl()) == TSR_OK);
  REQUIRE(ops().linear(nullptr, a.dl(), 0, b.dl(), 0, bias.dl(), TSR_ACT_GELU, c.dl(), c.dl()) ==
          TSR_OK);
  CHECK(c.v == want.v);  // the activation wins: it is written last
}

TEST_CASE("linear rejects bad arguments, naming linear", "[ops]") {
  Msgs m;
  F32 a({4, 3}), b({3, 5}), bias({5}), c({4, 5}), pre({4, 5});
  SECTION("inner dims differ") {
    CHECK(ops().linear(m.ctx(), a.dl(), 1, b.dl(), 0, bias.dl(), 0, c.dl(), nullptr) ==
          TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("linear: inner dimensions differ"));
  }
  SECTION("bias of the wrong size") {
    F32 bias4({4});
    CHECK(ops().linear(m.ctx(), a.dl(), 0, b.dl(), 0, bias4.dl(), 0, c.dl(), nullptr) ==
          TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("linear: bias float32[4] must have the last dim of c"));
  }
  SECTION("pre of the wrong shape") {
    F32 pre2({5, 4});
    CHECK(ops().linear(m.ctx(), a.dl(), 0, b.dl(), 0, bias.dl(), 0, c.dl(), pre2.dl()) ==
          TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("linear: pre float32[5,4] must have the shape of c"));
  }
  SECTION("unknown activation") {
    CHECK(ops().linear(m.ctx(), a.dl(), 0, b.dl(), 0, bias.dl(), 9, c.dl(), nullptr) ==
          TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("linear: unknown activation 9"));
  }
  SECTION("c has the wrong shape: nothing written") {
    F32 c2({5, 4}, 3.0f);
    CHECK(ops().linear(m.ctx(), a.dl(), 0, b.dl(), 0, nullptr, 0, c2.dl(), nullptr) ==
          TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("linear: c must be 4x5"));
    for (float e : c2.v) CHECK(e == 3.0f);
  }
  SECTION("bfloat16 operands are the CUDA ops' business") {
    DLTensor *ad = a.dl();
    ad->dtype = kBF16;
    CHECK(ops().linear(m.ctx(), ad, 0, b.dl(), 0, bias.dl(), 0, c.dl(), nullptr) ==
          TSR_ERR_UNSUPPORTED);
    CHECK_THAT(m.last(), Contains("linear: a must be float32"));
  }
}

// ---------------------------------------------------------------------------
// layernorm

namespace {

struct LnRef {
  std::vector<double> y, mean, rstd;
};

// Straight from the definition, in double.
LnRef ref_layernorm(const std::vector<double> &x, const std::vector<double> &w,
                    const std::vector<double> &b, int64_t rows, int64_t C, double eps) {
  LnRef r;
  r.y.resize(x.size());
  for (int64_t i = 0; i < rows; i++) {
    double mu = 0;
    for (int64_t j = 0; j < C; j++) mu += x[i * C + j];
    mu /= double(C);
    double var = 0;
    for (int64_t j = 0; j < C; j++) var += (x[i * C + j] - mu) * (x[i * C + j] - mu);
    var /= double(C);
    const double rs = 1 / std::sqrt(var + eps);
    for (int64_t j = 0; j < C; j++) r.y[i * C + j] = (x[i * C + j] - mu) * rs * w[j] + b[j];
    r.mean.push_back(mu);
    r.rstd.push_back(rs);
  }
  return r;
}

std::vector<double> wide(const std::vector<float> &v) {
  return {v.begin(), v.end()};
}

}  // namespace

TEST_CASE("layernorm_forward matches a double-precision reference", "[ops]") {
  const float eps = 1e-5f;
  for (int64_t C : {1, 7, 64, 768}) {
    for (float offset : {0.0f, 300.0f}) {  // a large mean tests the two-pass variance
      INFO("C=" << C << " offset=" << offset);
      const int64_t rows = 6;
      F32 x({2, 3, C}), w({C}), b({C}), y({2, 3, C}), mean({2, 3}), rstd({6});
      randomize(x.v, uint32_t(C), offset - 1.5f, offset + 1.5f);
      randomize(w.v, uint32_t(C) + 1, 0.5f, 1.5f);
      randomize(b.v, uint32_t(C) + 2);
      REQUIRE(ops().layernorm_forward(nullptr, x.dl(), w.dl(), b.dl(), eps, y.dl(), mean.dl(),
                                      rstd.dl()) == TSR_OK);
      const LnRef r = ref_layernorm(wide(x.v), wide(w.v), wide(b.v), rows, C, eps);
      for (int64_t i = 0; i < rows; i++) {
        REQUIRE(close(mean.v[i], r.mean[i], 1e-6));
        REQUIRE(close(rstd.v[i], r.rstd[i], 1e-5));
      }
      for (size_t i = 0; i < y.v.size(); i++) REQUIRE(close(y.v[i], r.y[i], 1e-5));
    }
  }
}

TEST_CASE("layernorm_forward: a constant row normalizes to the bias, in place", "[ops]") {
  F32 x({2, 4}, 3.0f), w({4}, 2.0f), b({4}), y({2, 4}), mean({2}), rstd({2});
  b.v = {1, 2, 3, 4};
  REQUIRE(ops().layernorm_forward(nullptr, x.dl(), w.dl(), b.dl(), 1e-5f, y.dl(), mean.dl(),
                                  rstd.dl()) == TSR_OK);
  CHECK(mean.v[0] == 3.0f);
  CHECK(rstd.v[0] == Approx(1 / std::sqrt(1e-5)).epsilon(1e-6));
  CHECK(y.v == std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4});

  // y may be x.
  F32 x2({3, 5}), y2({3, 5}), w2({5}), b2({5});
  randomize(x2.v, 9);
  randomize(w2.v, 10);
  randomize(b2.v, 11);
  REQUIRE(ops().layernorm_forward(nullptr, x2.dl(), w2.dl(), b2.dl(), 1e-5f, y2.dl(), mean.dl(),
                                  rstd.dl()) != TSR_OK);  // mean/rstd of 2 for 3 rows: refused
  F32 m3({3}), r3({3});
  REQUIRE(ops().layernorm_forward(nullptr, x2.dl(), w2.dl(), b2.dl(), 1e-5f, y2.dl(), m3.dl(),
                                  r3.dl()) == TSR_OK);
  REQUIRE(ops().layernorm_forward(nullptr, x2.dl(), w2.dl(), b2.dl(), 1e-5f, x2.dl(), m3.dl(),
                                  r3.dl()) == TSR_OK);
  CHECK(x2.v == y2.v);
}

TEST_CASE("layernorm_backward matches finite differences, and accumulates", "[ops]") {
  // Loss L = sum(y * g) for a fixed random g, so dL/dy = g. The reference
  // gradients are central differences of the double-precision forward.
  const int64_t rows = 4, C = 9;
  const double eps = 1e-5;
  F32 x({2, 2, C}), w({C}), b({C}), y({rows, C}), mean({rows}), rstd({rows}), g({rows, C});
  randomize(x.v, 21);
  randomize(w.v, 22, 0.5f, 1.5f);
  randomize(b.v, 23);
  randomize(g.v, 24);
  REQUIRE(ops().layernorm_forward(nullptr, x.dl(), w.dl(), b.dl(), float(eps), y.dl(), mean.dl(),
                                  rstd.dl()) == TSR_OK);
  // Gradients land on top of what is there.
  F32 dx({rows, C}, 0.25f), dw({C}, -1.0f), db({C}, 2.0f);
  REQUIRE(ops().layernorm_backward(nullptr, g.dl(), x.dl(), w.dl(), mean.dl(), rstd.dl(), dx.dl(),
                                   dw.dl(), db.dl()) == TSR_OK);

  std::vector<double> xd = wide(x.v), wd = wide(w.v), bd = wide(b.v);
  auto loss = [&] {
    const LnRef r = ref_layernorm(xd, wd, bd, rows, C, eps);
    double s = 0;
    for (size_t i = 0; i < r.y.size(); i++) s += r.y[i] * g.v[i];
    return s;
  };
  auto numeric = [&](double &v) {
    const double h = 1e-5, v0 = v;
    v = v0 + h;
    const double up = loss();
    v = v0 - h;
    const double down = loss();
    v = v0;
    return (up - down) / (2 * h);
  };
  for (size_t i = 0; i < xd.size(); i++) {
    INFO("dx[" << i << "]");
    REQUIRE(close(dx.v[i] - 0.25, numeric(xd[i]), 2e-4));
  }
  for (size_t j = 0; j < size_t(C); j++) {
    INFO("dweight/dbias[" << j << "]");
    REQUIRE(close(dw.v[j] + 1.0, numeric(wd[j]), 2e-4));
    REQUIRE(close(db.v[j] - 2.0, numeric(bd[j]), 2e-4));
  }
}

TEST_CASE("layernorm_backward sums the parameter gradients over rows in double", "[ops]") {
  // 50000 rows of dy = 0.1f: a float running sum drifts by far more than the
  // bound below; a double one is exact to float precision.
  const int64_t rows = 50000, C = 3;
  F32 x({rows, C}), w({C}, 1.0f), b({C}), y({rows, C}), mean({rows}), rstd({rows});
  for (int64_t i = 0; i < rows; i++) {
    x.v[size_t(i * C)] = -1.0f;
    x.v[size_t(i * C + 1)] = 0.0f;
    x.v[size_t(i * C + 2)] = 1.0f;
  }
  REQUIRE(ops().layernorm_forward(nullptr, x.dl(), w.dl(), b.dl(), 0.0f, y.dl(), mean.dl(),
                                  rstd.dl()) == TSR_OK);
  F32 dy({rows, C}, 0.1f), dx({rows, C}), dw({C}), db({C});
  REQUIRE(ops().layernorm_backward(nullptr, dy.dl(), x.dl(), w.dl(), mean.dl(), rstd.dl(), dx.dl(),
                                   dw.dl(), db.dl()) == TSR_OK);
  const double want_db = rows * double(0.1f);
  for (int64_t j = 0; j < C; j++) CHECK(std::fabs(db.v[size_t(j)] - want_db) <= 1e-6 * want_db);
  // n = (-sqrt(1.5), 0, sqrt(1.5)) in every row.
  CHECK(dw.v[0] == Approx(-want_db * std::sqrt(1.5)).epsilon(1e-6));
  CHECK(dw.v[1] == Approx(0.0).margin(1e-3));
  // A constant dy has no component the normalization lets through: dx = 0.
  for (float e : dx.v) REQUIRE(std::fabs(e) < 1e-6f);
}

TEST_CASE("layernorm rejects bad arguments, naming the op and argument", "[ops]") {
  Msgs m;
  F32 x({3, 4}), w({4}), b({4}), y({3, 4}), mean({3}), rstd({3});
  SECTION("forward: weight size") {
    F32 w5({5});
    CHECK(ops().layernorm_forward(m.ctx(), x.dl(), w5.dl(), b.dl(), 1e-5f, y.dl(), mean.dl(),
                                  rstd.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("layernorm_forward: weight float32[5] must have 4 elements"));
  }
  SECTION("forward: y shape") {
    F32 y2({4, 3});
    CHECK(ops().layernorm_forward(m.ctx(), x.dl(), w.dl(), b.dl(), 1e-5f, y2.dl(), mean.dl(),
                                  rstd.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("layernorm_forward: y float32[4,3] must have the shape of x"));
  }
  SECTION("forward: rstd missing") {
    CHECK(ops().layernorm_forward(m.ctx(), x.dl(), w.dl(), b.dl(), 1e-5f, y.dl(), mean.dl(),
                                  nullptr) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("layernorm_forward: rstd is NULL"));
  }
  SECTION("forward: negative eps") {
    CHECK(ops().layernorm_forward(m.ctx(), x.dl(), w.dl(), b.dl(), -1.0f, y.dl(), mean.dl(),
                                  rstd.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("eps"));
  }
  SECTION("backward: mean size") {
    F32 mean4({4}), dx({3, 4}), dw({4}), db({4});
    CHECK(ops().layernorm_backward(m.ctx(), y.dl(), x.dl(), w.dl(), mean4.dl(), rstd.dl(), dx.dl(),
                                   dw.dl(), db.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("layernorm_backward: mean float32[4] must have 3 elements"));
  }
  SECTION("backward: dbias dtype") {
    F32 dx({3, 4}), dw({4});
    U16 db({4}, kBF16);
    CHECK(ops().layernorm_backward(m.ctx(), y.dl(), x.dl(), w.dl(), mean.dl(), rstd.dl(), dx.dl(),
                                   dw.dl(), db.dl()) == TSR_ERR_UNSUPPORTED);
    CHECK_THAT(m.last(), Contains("layernorm_backward: dbias must be float32"));
  }
}

// ---------------------------------------------------------------------------
// embedding

TEST_CASE("embedding_forward gathers rows, or adds them", "[ops]") {
  const int64_t V = 5, C = 3;
  F32 table({V, C});
  randomize(table.v, 31);
  I32 ids({2, 3});
  ids.v = {4, 0, 4, 2, 2, 1};  // repeats on purpose
  F32 out({2, 3, C}, 9.0f);
  REQUIRE(ops().embedding_forward(nullptr, ids.dl(), table.dl(), out.dl(), 0) == TSR_OK);
  for (size_t i = 0; i < 6; i++)
    for (size_t j = 0; j < size_t(C); j++)
      REQUIRE(out.v[i * C + j] == table.v[size_t(ids.v[i]) * C + j]);

  // accumulate = 1: a second table (positions, say) added on top.
  F32 pos({6, C});
  randomize(pos.v, 32);
  I32 pids({6});
  pids.v = {0, 1, 2, 3, 4, 5};
  const std::vector<float> before = out.v;
  REQUIRE(ops().embedding_forward(nullptr, pids.dl(), pos.dl(), out.dl(), 1) == TSR_OK);
  for (size_t i = 0; i < out.v.size(); i++) REQUIRE(out.v[i] == before[i] + pos.v[i]);
}

TEST_CASE("embedding_backward scatter-adds, repeated ids summing", "[ops]") {
  const int64_t V = 4, C = 2;
  I32 ids({5});
  ids.v = {1, 3, 1, 1, 0};
  F32 dout({5, C}), dtable({V, C}, 0.5f);
  dout.v = {1, 2, 3, 4, 10, 20, 100, 200, 1000, 2000};
  REQUIRE(ops().embedding_backward(nullptr, ids.dl(), dout.dl(), dtable.dl()) == TSR_OK);
  // Row 1 gets rows 0, 2 and 3 of dout; row 2 nothing; all on top of 0.5.
  const std::vector<float> want = {1000.5f, 2000.5f, 111.5f, 222.5f, 0.5f, 0.5f, 3.5f, 4.5f};
  CHECK(dtable.v == want);
}

TEST_CASE("embedding rejects ids outside the table, naming the id and its row", "[ops]") {
  Msgs m;
  F32 table({4, 2}), out({3, 2}, 7.0f), dtable({4, 2}, 7.0f);
  I32 ids({3});
  for (int32_t bad : {4, -1, 1 << 30}) {
    ids.v = {0, 3, bad};
    INFO("bad id " << bad);
    CHECK(ops().embedding_forward(m.ctx(), ids.dl(), table.dl(), out.dl(), 0) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("embedding_forward: id " + std::to_string(bad) +
                                  " at row 2 of ids int32[3] is outside [0, 4)"));
    CHECK(ops().embedding_backward(m.ctx(), ids.dl(), out.dl(), dtable.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("embedding_backward: id " + std::to_string(bad) + " at row 2"));
    // Checked before anything is written.
    for (float e : out.v) CHECK(e == 7.0f);
    for (float e : dtable.v) CHECK(e == 7.0f);
  }
}

TEST_CASE("embedding rejects bad shapes and dtypes", "[ops]") {
  Msgs m;
  F32 table({4, 2}), out({3, 2});
  I32 ids({3});
  SECTION("out rows != ids") {
    F32 out4({4, 2});
    CHECK(ops().embedding_forward(m.ctx(), ids.dl(), table.dl(), out4.dl(), 0) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("embedding_forward: out float32[4,2] must have one row per id"));
  }
  SECTION("width differs") {
    F32 out3({3, 3});
    CHECK(ops().embedding_forward(m.ctx(), ids.dl(), table.dl(), out3.dl(), 0) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(),
               Contains("the last dim of out float32[3,3] must be the last dim of table"));
  }
  SECTION("table not 2-D") {
    F32 t3({1, 4, 2});
    CHECK(ops().embedding_forward(m.ctx(), ids.dl(), t3.dl(), out.dl(), 0) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("table must be 2-D"));
  }
  SECTION("ids not int32") {
    Buf<int64_t> ids64({3}, DLDataType{kDLInt, 64, 1});
    CHECK(ops().embedding_forward(m.ctx(), ids64.dl(), table.dl(), out.dl(), 0) ==
          TSR_ERR_UNSUPPORTED);
    CHECK_THAT(m.last(), Contains("embedding_forward: ids must be int32"));
  }
  SECTION("accumulate flag") {
    CHECK(ops().embedding_forward(m.ctx(), ids.dl(), table.dl(), out.dl(), 2) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("accumulate must be 0 or 1"));
  }
}

}  // namespace unit_test_cpu_ops_nn11
