// The CPU ops added in ABI 1.3, the fused forms of 1.0/1.1 sequences: each
// must give exactly (bit for bit) what its sequence gives, since the gpt2
// model runs one or the other depending on the host's table, and the
// argument checks must name the fused op.
//   add_layernorm_forward = axpy(1, x, y -> r), layernorm_forward(r)
//   matmul_bias_grad      = matmul, bias_grad (scaled by alpha)
//   matmul_act_backward   = matmul, act_backward (from the input), bias_grad
//   layernorm_backward_sum (1.4) = layernorm_backward, bias_grad(dx)
#include <tessera/ops.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "cpu_ops_nn11_support.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_cpu_ops_fused {

using namespace tessera::test::cpu_ops_nn11_support;

namespace {

// Bitwise equality of two float vectors (== would let -0.0 match 0.0 and
// fail on equal NaNs). Empty vectors compare equal without memcmp, whose
// pointers must not be null even for zero bytes (UBSan says so).
bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

constexpr tsr_activation kActs[] = {TSR_ACT_NONE, TSR_ACT_RELU, TSR_ACT_GELU, TSR_ACT_TANH};

}  // namespace

TEST_CASE("cpu ops table has every ABI 1.3 entry", "[ops]") {
  const tsr_ops &o = ops();
  CHECK(TSR_HAS_FIELD(&o, tsr_ops, matmul_act_backward));
  CHECK(o.add_layernorm_forward);
  CHECK(o.matmul_bias_grad);
  CHECK(o.matmul_act_backward);
  CHECK(TSR_HAS_FIELD(&o, tsr_ops, layernorm_backward_sum));
  CHECK(o.layernorm_backward_sum);
}

// ---------------------------------------------------------------------------
// add_layernorm_forward

TEST_CASE("add_layernorm_forward equals axpy then layernorm_forward, bit for bit", "[ops]") {
  uint32_t seed = 300;
  // C = 0 gives the statistics' conventions; odd widths the loops' tails.
  for (const std::vector<int64_t> &shape :
       {std::vector<int64_t>{5, 64}, {2, 3, 37}, {1, 1}, {700, 24}, {3, 0}}) {
    const int64_t C = shape.back();
    int64_t nrows = 1;
    for (size_t i = 0; i + 1 < shape.size(); i++) nrows *= shape[i];
    INFO("shape [" << shape[0] << ", ..., " << C << "]");
    F32 x(shape), y(shape), w({C}), b({C});
    randomize(x.v, seed++, -3.0f, 5.0f);  // a mean away from zero
    randomize(y.v, seed++);
    randomize(w.v, seed++);
    randomize(b.v, seed++);
    // The sequence: r = x + y (axpy into a copy of y), then its layernorm.
    F32 r_seq = y, out_seq(shape), m_seq({nrows}), s_seq({nrows});
    REQUIRE(ops().axpy(nullptr, 1.0f, x.dl(), r_seq.dl()) == TSR_OK);
    REQUIRE(ops().layernorm_forward(nullptr, r_seq.dl(), w.dl(), b.dl(), 1e-5f, out_seq.dl(),
                                    m_seq.dl(), s_seq.dl()) == TSR_OK);

    // r separate, r over y (the residual stream updated in place), r over x.
    for (int where = 0; where < 3; where++) {
      INFO("r is " << (where == 0 ? "separate" : where == 1 ? "y" : "x"));
      F32 xx = x, yy = y, rr(shape, 9.0f), out(shape, 9.0f), m({nrows}), s({nrows});
      F32 &r = where == 0 ? rr : where == 1 ? yy : xx;
      REQUIRE(ops().add_layernorm_forward(nullptr, xx.dl(), yy.dl(), w.dl(), b.dl(), 1e-5f, r.dl(),
                                          out.dl(), m.dl(), s.dl()) == TSR_OK);
      CHECK(same_bits(r.v, r_seq.v));
      CHECK(same_bits(out.v, out_seq.v));
      CHECK(same_bits(m.v, m_seq.v));
      CHECK(same_bits(s.v, s_seq.v));
    }
  }
}

TEST_CASE("add_layernorm_forward rejects bad arguments, naming the op", "[ops]") {
  Msgs msgs;
  F32 x({4, 8}), y({4, 8}), r({4, 8}), out({4, 8}), w({8}), b({8}), m({4}), s({4});
  SECTION("y of another shape") {
    F32 y2({4, 7});
    CHECK(ops().add_layernorm_forward(msgs.ctx(), x.dl(), y2.dl(), w.dl(), b.dl(), 1e-5f, r.dl(),
                                      out.dl(), m.dl(), s.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(msgs.last(), Catch::Contains("add_layernorm_forward: y"));
  }
  SECTION("out over an input") {
    CHECK(ops().add_layernorm_forward(msgs.ctx(), x.dl(), y.dl(), w.dl(), b.dl(), 1e-5f, r.dl(),
                                      y.dl(), m.dl(), s.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(msgs.last(), Catch::Contains("overlaps"));
  }
  SECTION("statistics of another length") {
    F32 m2({3});
    CHECK(ops().add_layernorm_forward(msgs.ctx(), x.dl(), y.dl(), w.dl(), b.dl(), 1e-5f, r.dl(),
                                      out.dl(), m2.dl(), s.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(msgs.last(), Catch::Contains("mean"));
  }
  SECTION("a bfloat16 tensor") {
    U16 xb({4, 8}, kBF16);
    CHECK(ops().add_layernorm_forward(msgs.ctx(), xb.dl(), y.dl(), w.dl(), b.dl(), 1e-5f, r.dl(),
                                      out.dl(), m.dl(), s.dl()) == TSR_ERR_UNSUPPORTED);
  }
}

// ---------------------------------------------------------------------------
// matmul_bias_grad

TEST_CASE("matmul_bias_grad equals matmul then bias_grad, bit for bit", "[ops]") {
  uint32_t seed = 400;
  // (k, m, n): the weight gradient of x [k, m] and dy [k, n], a large k the
  // pool splits, and k = 0 (no rows: the bias gradient adds nothing).
  for (const auto &[k, m, n] :
       {std::tuple{7, 5, 6}, std::tuple{300, 33, 65}, std::tuple{0, 4, 3}, std::tuple{1, 1, 1}}) {
    for (const auto &[alpha, beta] : {std::pair{1.0f, 1.0f}, std::pair{1.0f, 0.0f},
                                      std::pair{0.25f, 1.0f}, std::pair{-3.0f, 0.5f}}) {
      INFO("k=" << k << " m=" << m << " n=" << n << " alpha=" << alpha << " beta=" << beta);
      F32 a({k, m}), b({k, n}), c({m, n}), db({n});
      randomize(a.v, seed++);
      randomize(b.v, seed++);
      randomize(c.v, seed++);
      randomize(db.v, seed++);
      F32 c_seq = c, db_seq = db;
      REQUIRE(ops().matmul(nullptr, a.dl(), 1, b.dl(), 0, c_seq.dl(), alpha, beta) == TSR_OK);
      if (alpha != 1.0f) {
        // alpha scales the double column sums before their rounding, so
        // the result is within float rounding of dbias + alpha * bias_grad.
        F32 sums({n}), got_c = c, got_db = db;
        REQUIRE(ops().bias_grad(nullptr, b.dl(), sums.dl()) == TSR_OK);
        REQUIRE(ops().matmul_bias_grad(nullptr, a.dl(), 1, b.dl(), 0, got_c.dl(), alpha, beta,
                                       got_db.dl()) == TSR_OK);
        CHECK(same_bits(got_c.v, c_seq.v));
        for (int64_t j = 0; j < n; j++)
          CHECK(got_db.v[j] == Approx(db.v[j] + alpha * sums.v[j]).epsilon(1e-5).margin(1e-5));
        continue;
      }
      REQUIRE(ops().bias_grad(nullptr, b.dl(), db_seq.dl()) == TSR_OK);
      REQUIRE(ops().matmul_bias_grad(nullptr, a.dl(), 1, b.dl(), 0, c.dl(), alpha, beta, db.dl()) ==
              TSR_OK);
      CHECK(same_bits(c.v, c_seq.v));
      CHECK(same_bits(db.v, db_seq.v));
    }
  }
}

TEST_CASE("matmul_bias_grad without dbias is matmul, any transposes", "[ops]") {
  uint32_t seed = 450;
  for (int ta = 0; ta < 2; ta++) {
    for (int tb = 0; tb < 2; tb++) {
      F32 a(ta ? std::vector<int64_t>{7, 5} : std::vector<int64_t>{5, 7});
      F32 b(tb ? std::vector<int64_t>{6, 7} : std::vector<int64_t>{7, 6}), c({5, 6});
      randomize(a.v, seed++);
      randomize(b.v, seed++);
      randomize(c.v, seed++);
      F32 want = c;
      REQUIRE(ops().matmul(nullptr, a.dl(), ta, b.dl(), tb, want.dl(), 2.0f, 1.0f) == TSR_OK);
      REQUIRE(ops().matmul_bias_grad(nullptr, a.dl(), ta, b.dl(), tb, c.dl(), 2.0f, 1.0f,
                                     nullptr) == TSR_OK);
      CHECK(same_bits(c.v, want.v));
    }
  }
}

TEST_CASE("matmul_bias_grad rejects bad arguments and writes nothing", "[ops]") {
  Msgs msgs;
  F32 a({7, 5}), b({7, 6}), c({5, 6}, 3.0f), db({6}, 4.0f);
  SECTION("a transposed b with a bias gradient") {
    F32 bt({6, 7});
    CHECK(ops().matmul_bias_grad(msgs.ctx(), a.dl(), 1, bt.dl(), 1, c.dl(), 1.0f, 1.0f, db.dl()) ==
          TSR_ERR_INVALID);
    CHECK_THAT(msgs.last(), Catch::Contains("matmul_bias_grad") && Catch::Contains("trans_b"));
  }
  SECTION("dbias of another length") {
    F32 db2({5});
    CHECK(ops().matmul_bias_grad(msgs.ctx(), a.dl(), 1, b.dl(), 0, c.dl(), 1.0f, 1.0f, db2.dl()) ==
          TSR_ERR_INVALID);
    CHECK_THAT(msgs.last(), Catch::Contains("matmul_bias_grad: dbias"));
  }
  SECTION("inner dimensions that differ") {
    F32 a2({6, 5});
    CHECK(ops().matmul_bias_grad(msgs.ctx(), a2.dl(), 1, b.dl(), 0, c.dl(), 1.0f, 1.0f, db.dl()) ==
          TSR_ERR_INVALID);
    CHECK_THAT(msgs.last(), Catch::Contains("matmul_bias_grad: inner dimensions differ"));
  }
  for (float e : c.v) CHECK(e == 3.0f);
  for (float e : db.v) CHECK(e == 4.0f);
}

// ---------------------------------------------------------------------------
// matmul_act_backward

TEST_CASE("matmul_act_backward equals matmul, act_backward and bias_grad, bit for bit", "[ops]") {
  uint32_t seed = 500;
  // dy [m, k] @ W^T ([n, k] stored, trans_b = 1, as linear's input gradient)
  // and the other transposes too.
  for (const auto &[m, n, k] :
       {std::tuple{6, 8, 5}, std::tuple{130, 48, 33}, std::tuple{3, 4, 0}}) {
    for (int tb = 0; tb < 2; tb++) {
      for (tsr_activation act : kActs) {
        for (int with_bias = 0; with_bias < 2; with_bias++) {
          INFO("m=" << m << " n=" << n << " k=" << k << " tb=" << tb << " act=" << act
                    << " bias=" << with_bias);
          F32 a({m, k}), b(tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n});
          F32 pre({m, n}), c({m, n}, 7.0f), db({n});
          randomize(a.v, seed++);
          randomize(b.v, seed++);
          randomize(pre.v, seed++, -4.0f, 4.0f);
          randomize(db.v, seed++);
          F32 c_seq({m, n}), db_seq = db;
          REQUIRE(ops().matmul(nullptr, a.dl(), 0, b.dl(), tb, c_seq.dl(), 1.0f, 0.0f) == TSR_OK);
          REQUIRE(ops().act_backward(nullptr, act, pre.dl(), 0, c_seq.dl(), c_seq.dl()) == TSR_OK);
          if (with_bias) REQUIRE(ops().bias_grad(nullptr, c_seq.dl(), db_seq.dl()) == TSR_OK);
          REQUIRE(ops().matmul_act_backward(nullptr, a.dl(), 0, b.dl(), tb, act, pre.dl(), c.dl(),
                                            with_bias ? db.dl() : nullptr) == TSR_OK);
          CHECK(same_bits(c.v, c_seq.v));
          CHECK(same_bits(db.v, db_seq.v));
        }
      }
    }
  }
}

TEST_CASE("matmul_act_backward: no activation needs no pre", "[ops]") {
  F32 a({4, 3}), b({3, 5}), c({4, 5}), want({4, 5}), db({5}), db_want({5});
  randomize(a.v, 1);
  randomize(b.v, 2);
  REQUIRE(ops().matmul(nullptr, a.dl(), 0, b.dl(), 0, want.dl(), 1.0f, 0.0f) == TSR_OK);
  REQUIRE(ops().bias_grad(nullptr, want.dl(), db_want.dl()) == TSR_OK);
  REQUIRE(ops().matmul_act_backward(nullptr, a.dl(), 0, b.dl(), 0, TSR_ACT_NONE, nullptr, c.dl(),
                                    db.dl()) == TSR_OK);
  CHECK(same_bits(c.v, want.v));
  CHECK(same_bits(db.v, db_want.v));
}

TEST_CASE("matmul_act_backward rejects bad arguments, naming the op", "[ops]") {
  Msgs msgs;
  F32 a({4, 3}), b({5, 3}), pre({4, 5}), c({4, 5}), db({5});
  SECTION("gelu without pre") {
    CHECK(ops().matmul_act_backward(msgs.ctx(), a.dl(), 0, b.dl(), 1, TSR_ACT_GELU, nullptr, c.dl(),
                                    db.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(msgs.last(), Catch::Contains("matmul_act_backward") && Catch::Contains("pre"));
  }
  SECTION("pre of another shape") {
    F32 pre2({4, 4});
    CHECK(ops().matmul_act_backward(msgs.ctx(), a.dl(), 0, b.dl(), 1, TSR_ACT_GELU, pre2.dl(),
                                    c.dl(), db.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(msgs.last(), Catch::Contains("matmul_act_backward: pre"));
  }
  SECTION("c over pre") {
    CHECK(ops().matmul_act_backward(msgs.ctx(), a.dl(), 0, b.dl(), 1, TSR_ACT_GELU, c.dl(), c.dl(),
                                    db.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(msgs.last(), Catch::Contains("overlaps pre"));
  }
  SECTION("an unknown activation") {
    CHECK(ops().matmul_act_backward(msgs.ctx(), a.dl(), 0, b.dl(), 1, 9, pre.dl(), c.dl(),
                                    db.dl()) == TSR_ERR_INVALID);
  }
  SECTION("dbias of another length") {
    F32 db2({4});
    CHECK(ops().matmul_act_backward(msgs.ctx(), a.dl(), 0, b.dl(), 1, TSR_ACT_GELU, pre.dl(),
                                    c.dl(), db2.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(msgs.last(), Catch::Contains("matmul_act_backward: dbias"));
  }
}

// ---------------------------------------------------------------------------
// layernorm_backward_sum (ABI 1.4)

TEST_CASE("layernorm_backward_sum equals layernorm_backward then bias_grad of dx, bit for bit",
          "[ops]") {
  uint32_t seed = 700;
  for (const std::vector<int64_t> &shape :
       {std::vector<int64_t>{5, 64}, {2, 3, 37}, {1, 1}, {300, 24}}) {
    const int64_t C = shape.back();
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < shape.size(); i++) rows *= shape[i];
    for (int alias = 0; alias < 2; alias++) {
      INFO("shape [" << shape[0] << ", ..., " << C << "]" << (alias ? ", dx = dy" : ""));
      F32 x(shape), dy(shape), dx(shape), w({C}), mean({rows}), rstd({rows});
      F32 dw({C}), db({C}), ds({C});
      randomize(x.v, seed++, -3.0f, 5.0f);
      randomize(dy.v, seed++);
      randomize(dx.v, seed++);
      randomize(w.v, seed++);
      randomize(dw.v, seed++);
      randomize(db.v, seed++);
      randomize(ds.v, seed++);  // dsum accumulates into what it holds
      F32 y(shape), b({C});
      REQUIRE(ops().layernorm_forward(nullptr, x.dl(), w.dl(), b.dl(), 1e-5f, y.dl(), mean.dl(),
                                      rstd.dl()) == TSR_OK);
      F32 dy_seq = dy, dx_seq = dx, dw_seq = dw, db_seq = db, ds_seq = ds;
      DLTensor *out_seq = alias ? dy_seq.dl() : dx_seq.dl();
      REQUIRE(ops().layernorm_backward(nullptr, dy_seq.dl(), x.dl(), w.dl(), mean.dl(), rstd.dl(),
                                       out_seq, dw_seq.dl(), db_seq.dl()) == TSR_OK);
      REQUIRE(ops().bias_grad(nullptr, out_seq, ds_seq.dl()) == TSR_OK);
      REQUIRE(ops().layernorm_backward_sum(nullptr, dy.dl(), x.dl(), w.dl(), mean.dl(), rstd.dl(),
                                           alias ? dy.dl() : dx.dl(), dw.dl(), db.dl(),
                                           ds.dl()) == TSR_OK);
      CHECK(same_bits(alias ? dy.v : dx.v, alias ? dy_seq.v : dx_seq.v));
      CHECK(same_bits(dw.v, dw_seq.v));
      CHECK(same_bits(db.v, db_seq.v));
      CHECK(same_bits(ds.v, ds_seq.v));
      // Without dsum it is layernorm_backward itself.
      F32 dx2 = dx, dw2 = dw, db2 = db, dx3 = dx, dw3 = dw, db3 = db;
      if (!alias) {
        REQUIRE(ops().layernorm_backward_sum(nullptr, dy.dl(), x.dl(), w.dl(), mean.dl(), rstd.dl(),
                                             dx2.dl(), dw2.dl(), db2.dl(), nullptr) == TSR_OK);
        REQUIRE(ops().layernorm_backward(nullptr, dy.dl(), x.dl(), w.dl(), mean.dl(), rstd.dl(),
                                         dx3.dl(), dw3.dl(), db3.dl()) == TSR_OK);
        CHECK(same_bits(dx2.v, dx3.v));
        CHECK(same_bits(dw2.v, dw3.v));
        CHECK(same_bits(db2.v, db3.v));
      }
    }
  }
}

TEST_CASE("layernorm_backward_sum rejects a bad dsum, naming the op and leaving dx", "[ops]") {
  Msgs msgs;
  F32 x({4, 6}), dy({4, 6}), dx({4, 6}), w({6}), mean({4}), rstd({4}), dw({6}), db({6});
  randomize(dx.v, 9);
  const std::vector<float> dx0 = dx.v;
  SECTION("dsum of another length") {
    F32 ds({5});
    CHECK(ops().layernorm_backward_sum(msgs.ctx(), dy.dl(), x.dl(), w.dl(), mean.dl(), rstd.dl(),
                                       dx.dl(), dw.dl(), db.dl(), ds.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(msgs.last(), Catch::Contains("layernorm_backward_sum: dsum"));
  }
  SECTION("dsum inside dx") {
    DLTensor ds = *dx.dl();
    int64_t six = 6;
    ds.ndim = 1;
    ds.shape = &six;
    CHECK(ops().layernorm_backward_sum(msgs.ctx(), dy.dl(), x.dl(), w.dl(), mean.dl(), rstd.dl(),
                                       dx.dl(), dw.dl(), db.dl(), &ds) == TSR_ERR_INVALID);
    CHECK_THAT(msgs.last(), Catch::Contains("overlaps dx"));
  }
  CHECK(same_bits(dx.v, dx0));
}

}  // namespace unit_test_cpu_ops_fused
