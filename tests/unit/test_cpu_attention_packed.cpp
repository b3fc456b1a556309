// The CPU's attention over packed sequences (ABI 1.8 attention_packed_*):
// document masking by positions, query t seeing keys t - positions[b, t]
// .. t. Against a naive float64 reference written out here (the window
// taken from the positions by hand), its backward against central finite
// differences of that reference, each packed example against the same
// example alone through attention_gqa (the rows packing must not change),
// positions 0..T-1 against plain causal attention, and the refusals.
#include <tessera/ops.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <vector>

#include "unit/cpu_ops_nn11_support.hpp"

namespace unit_test_cpu_attention_packed {

using namespace tessera::test::cpu_ops_nn11_support;
using Vec = std::vector<double>;

namespace {

struct Dims {
  int64_t B, T, H, Hk, D;
};

// Positions [B, T] of examples of the given lengths laid end to end in each
// row (0, 1, ... restarting per example), the rest of the row padding at
// position 0.
std::vector<int32_t> positions_of(const Dims &d, const std::vector<std::vector<int64_t>> &rows) {
  std::vector<int32_t> pos(static_cast<size_t>(d.B * d.T), 0);
  for (int64_t b = 0; b < d.B; b++) {
    int64_t t = 0;
    for (int64_t len : rows[static_cast<size_t>(b)])
      for (int64_t j = 0; j < len; j++) pos[static_cast<size_t>(b * d.T + t++)] = int32_t(j);
  }
  return pos;
}

// Attention in float64 from the definition, with query t of row b seeing
// keys t - pos[b, t] .. t; lse too. q [B,T,H,D], k and v [B,T,Hk,D].
Vec packed_ref(const Dims &d, const Vec &q, const Vec &k, const Vec &v,
               const std::vector<int32_t> &pos, double scale, Vec *lse = nullptr) {
  Vec out(static_cast<size_t>(d.B * d.T * d.H * d.D), 0.0);
  if (lse) lse->assign(static_cast<size_t>(d.B * d.H * d.T), 0.0);
  const int64_t g = d.H / d.Hk;
  auto qi = [&](int64_t b, int64_t t, int64_t h, int64_t e) {
    return static_cast<size_t>(((b * d.T + t) * d.H + h) * d.D + e);
  };
  auto ki = [&](int64_t b, int64_t t, int64_t h, int64_t e) {
    return static_cast<size_t>(((b * d.T + t) * d.Hk + h) * d.D + e);
  };
  for (int64_t b = 0; b < d.B; b++)
    for (int64_t h = 0; h < d.H; h++)
      for (int64_t t = 0; t < d.T; t++) {
        const int64_t first = t - pos[static_cast<size_t>(b * d.T + t)];
        std::vector<double> s;
        double mx = -INFINITY;
        for (int64_t j = first; j <= t; j++) {
          double acc = 0;
          for (int64_t e = 0; e < d.D; e++) acc += q[qi(b, t, h, e)] * k[ki(b, j, h / g, e)];
          s.push_back(acc * scale);
          mx = std::max(mx, s.back());
        }
        double z = 0;
        for (double &x : s) z += (x = std::exp(x - mx));
        if (lse) (*lse)[static_cast<size_t>((b * d.H + h) * d.T + t)] = mx + std::log(z);
        for (int64_t j = first; j <= t; j++)
          for (int64_t e = 0; e < d.D; e++)
            out[qi(b, t, h, e)] += s[static_cast<size_t>(j - first)] / z * v[ki(b, j, h / g, e)];
      }
  return out;
}

Vec to_d(const std::vector<float> &v) {
  return Vec(v.begin(), v.end());
}

Vec numeric_grad(const Vec &x, const std::function<double(const Vec &)> &f) {
  Vec g(x.size()), p = x;
  for (size_t i = 0; i < x.size(); i++) {
    const double h = 1e-6;
    p[i] = x[i] + h;
    const double up = f(p);
    p[i] = x[i] - h;
    const double down = f(p);
    p[i] = x[i];
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

double dot(const Vec &a, const Vec &b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

// Rows [from, from + len) of sequence b of x [B, T, H, D] as a [1, len, H, D].
std::vector<float> slice(const std::vector<float> &x, int64_t T, int64_t H, int64_t D, int64_t b,
                         int64_t from, int64_t len) {
  const auto at = x.begin() + (b * T + from) * H * D;
  return std::vector<float>(at, at + len * H * D);
}

}  // namespace

TEST_CASE("attention_packed matches a float64 reference of the document mask",
          "[cpu_ops][decoder][packing]") {
  // Row 0: three examples and padding, one crossing the 64-row tile; row 1:
  // one example of the whole row.
  const Dims d{2, 70, 4, 2, 8};
  const auto pos = positions_of(d, {{10, 45, 12}, {70}});
  const float scale = 0.35f;
  F32 q({d.B, d.T, d.H, d.D}), k({d.B, d.T, d.Hk, d.D}), v({d.B, d.T, d.Hk, d.D});
  randomize(q.v, 41);
  randomize(k.v, 42);
  randomize(v.v, 43);
  I32 p({d.B, d.T});
  p.v = pos;
  F32 out({d.B, d.T, d.H, d.D}), lse({d.B, d.H, d.T});
  REQUIRE(ops().attention_packed_forward(nullptr, q.dl(), k.dl(), v.dl(), p.dl(), scale, out.dl(),
                                         lse.dl()) == TSR_OK);
  Vec want_lse;
  const Vec want = packed_ref(d, to_d(q.v), to_d(k.v), to_d(v.v), pos, scale, &want_lse);
  for (size_t i = 0; i < want.size(); i++) CHECK(out.v[i] == Approx(want[i]).margin(1e-5));
  for (size_t i = 0; i < want_lse.size(); i++) CHECK(lse.v[i] == Approx(want_lse[i]).margin(1e-5));
}

TEST_CASE("attention_packed's backward matches finite differences of the reference",
          "[cpu_ops][decoder][packing]") {
  const Dims d{1, 7, 4, 2, 3};
  const auto pos = positions_of(d, {{3, 2, 1}});  // and one padding token
  const double scale = 0.6;
  F32 q({d.B, d.T, d.H, d.D}), k({d.B, d.T, d.Hk, d.D}), v({d.B, d.T, d.Hk, d.D});
  randomize(q.v, 51);
  randomize(k.v, 52);
  randomize(v.v, 53);
  I32 p({d.B, d.T});
  p.v = pos;
  F32 out({d.B, d.T, d.H, d.D}), lse({d.B, d.H, d.T}), g({d.B, d.T, d.H, d.D});
  randomize(g.v, 54);
  REQUIRE(ops().attention_packed_forward(nullptr, q.dl(), k.dl(), v.dl(), p.dl(), float(scale),
                                         out.dl(), lse.dl()) == TSR_OK);
  F32 dq({d.B, d.T, d.H, d.D}), dk({d.B, d.T, d.Hk, d.D}), dv({d.B, d.T, d.Hk, d.D});
  REQUIRE(ops().attention_packed_backward(nullptr, q.dl(), k.dl(), v.dl(), p.dl(), out.dl(), g.dl(),
                                          lse.dl(), float(scale), dq.dl(), dk.dl(),
                                          dv.dl()) == TSR_OK);
  const Vec Q = to_d(q.v), K = to_d(k.v), V = to_d(v.v), G = to_d(g.v);
  const auto f = [&](const Vec &x, int which) {
    return dot(
        packed_ref(d, which == 0 ? x : Q, which == 1 ? x : K, which == 2 ? x : V, pos, scale), G);
  };
  const Vec nq = numeric_grad(Q, [&](const Vec &x) { return f(x, 0); });
  const Vec nk = numeric_grad(K, [&](const Vec &x) { return f(x, 1); });
  const Vec nv = numeric_grad(V, [&](const Vec &x) { return f(x, 2); });
  for (size_t i = 0; i < nq.size(); i++) CHECK(dq.v[i] == Approx(nq[i]).margin(1e-5));
  for (size_t i = 0; i < nk.size(); i++) CHECK(dk.v[i] == Approx(nk[i]).margin(1e-5));
  for (size_t i = 0; i < nv.size(); i++) CHECK(dv.v[i] == Approx(nv[i]).margin(1e-5));
}

TEST_CASE("each packed example's rows and gradients equal the example run alone",
          "[cpu_ops][decoder][packing]") {
  const Dims d{1, 90, 4, 1, 16};
  const std::vector<int64_t> lens = {20, 50, 17};  // 3 padding tokens after them
  const auto pos = positions_of(d, {lens});
  const float scale = 0.25f;
  F32 q({d.B, d.T, d.H, d.D}), k({d.B, d.T, d.Hk, d.D}), v({d.B, d.T, d.Hk, d.D});
  F32 dout({d.B, d.T, d.H, d.D});
  randomize(q.v, 61);
  randomize(k.v, 62);
  randomize(v.v, 63);
  randomize(dout.v, 64);
  I32 p({d.B, d.T});
  p.v = pos;
  F32 out({d.B, d.T, d.H, d.D}), lse({d.B, d.H, d.T});
  F32 dq({d.B, d.T, d.H, d.D}), dk({d.B, d.T, d.Hk, d.D}), dv({d.B, d.T, d.Hk, d.D});
  REQUIRE(ops().attention_packed_forward(nullptr, q.dl(), k.dl(), v.dl(), p.dl(), scale, out.dl(),
                                         lse.dl()) == TSR_OK);
  REQUIRE(ops().attention_packed_backward(nullptr, q.dl(), k.dl(), v.dl(), p.dl(), out.dl(),
                                          dout.dl(), lse.dl(), scale, dq.dl(), dk.dl(),
                                          dv.dl()) == TSR_OK);
  int64_t from = 0;
  for (const int64_t len : lens) {
    INFO("the example at " << from << " of " << len << " tokens");
    F32 q1({1, len, d.H, d.D}), k1({1, len, d.Hk, d.D}), v1({1, len, d.Hk, d.D});
    F32 do1({1, len, d.H, d.D}), o1({1, len, d.H, d.D}), l1({1, d.H, len});
    q1.v = slice(q.v, d.T, d.H, d.D, 0, from, len);
    k1.v = slice(k.v, d.T, d.Hk, d.D, 0, from, len);
    v1.v = slice(v.v, d.T, d.Hk, d.D, 0, from, len);
    do1.v = slice(dout.v, d.T, d.H, d.D, 0, from, len);
    REQUIRE(ops().attention_gqa_forward(nullptr, q1.dl(), k1.dl(), v1.dl(), scale, o1.dl(),
                                        l1.dl()) == TSR_OK);
    F32 dq1({1, len, d.H, d.D}), dk1({1, len, d.Hk, d.D}), dv1({1, len, d.Hk, d.D});
    REQUIRE(ops().attention_gqa_backward(nullptr, q1.dl(), k1.dl(), v1.dl(), o1.dl(), do1.dl(),
                                         l1.dl(), scale, dq1.dl(), dk1.dl(), dv1.dl()) == TSR_OK);
    const auto close = [](const std::vector<float> &a, const std::vector<float> &b) {
      REQUIRE(a.size() == b.size());
      double worst = 0;
      for (size_t i = 0; i < a.size(); i++)
        worst = std::max(worst, std::fabs(double(a[i]) - b[i]) / (1.0 + std::fabs(b[i])));
      return worst;
    };
    CHECK(close(slice(out.v, d.T, d.H, d.D, 0, from, len), o1.v) <= 1e-6);
    CHECK(close(slice(dq.v, d.T, d.H, d.D, 0, from, len), dq1.v) <= 1e-6);
    CHECK(close(slice(dk.v, d.T, d.Hk, d.D, 0, from, len), dk1.v) <= 1e-6);
    CHECK(close(slice(dv.v, d.T, d.Hk, d.D, 0, from, len), dv1.v) <= 1e-6);
    for (int64_t h = 0; h < d.H; h++)
      for (int64_t t = 0; t < len; t++)
        CHECK(lse.v[static_cast<size_t>(h * d.T + from + t)] ==
              Approx(l1.v[static_cast<size_t>(h * len + t)]).epsilon(1e-6));
    from += len;
  }
}

TEST_CASE("attention_packed with positions 0..T-1 is causal attention", "[cpu_ops][decoder]") {
  const Dims d{2, 70, 4, 2, 8};
  const auto pos = positions_of(d, {{70}, {70}});
  F32 q({d.B, d.T, d.H, d.D}), k({d.B, d.T, d.Hk, d.D}), v({d.B, d.T, d.Hk, d.D});
  randomize(q.v, 71);
  randomize(k.v, 72);
  randomize(v.v, 73);
  I32 p({d.B, d.T});
  p.v = pos;
  F32 out({d.B, d.T, d.H, d.D}), lse({d.B, d.H, d.T});
  F32 out_c({d.B, d.T, d.H, d.D}), lse_c({d.B, d.H, d.T});
  REQUIRE(ops().attention_packed_forward(nullptr, q.dl(), k.dl(), v.dl(), p.dl(), 0.3f, out.dl(),
                                         lse.dl()) == TSR_OK);
  REQUIRE(ops().attention_gqa_forward(nullptr, q.dl(), k.dl(), v.dl(), 0.3f, out_c.dl(),
                                      lse_c.dl()) == TSR_OK);
  CHECK(out.v == out_c.v);
  CHECK(lse.v == lse_c.v);
}

TEST_CASE("attention_packed refuses positions outside each query's sequence",
          "[cpu_ops][decoder][packing]") {
  F32 q({1, 4, 2, 8}), k({1, 4, 2, 8}), v({1, 4, 2, 8}), out({1, 4, 2, 8}), lse({1, 2, 4});
  I32 p({1, 4});
  p.v = {0, 1, 3, 0};  // token 2 cannot be at position 3
  Msgs m;
  CHECK(ops().attention_packed_forward(m.ctx(), q.dl(), k.dl(), v.dl(), p.dl(), 1.0f, out.dl(),
                                       lse.dl()) == TSR_ERR_INVALID);
  CHECK_THAT(m.last(), Catch::Contains("positions[0, 2] = 3 is outside [0, 2]"));
  p.v = {0, -1, 0, 0};
  CHECK(ops().attention_packed_forward(m.ctx(), q.dl(), k.dl(), v.dl(), p.dl(), 1.0f, out.dl(),
                                       lse.dl()) == TSR_ERR_INVALID);
  I32 wrong({1, 3});
  CHECK(ops().attention_packed_forward(m.ctx(), q.dl(), k.dl(), v.dl(), wrong.dl(), 1.0f, out.dl(),
                                       lse.dl()) == TSR_ERR_INVALID);
  CHECK_THAT(m.last(), Catch::Contains("must be [B, T] = [1,4]"));
  CHECK(ops().attention_packed_forward(m.ctx(), q.dl(), k.dl(), v.dl(), nullptr, 1.0f, out.dl(),
                                       lse.dl()) == TSR_ERR_INVALID);
  CHECK_THAT(m.last(), Catch::Contains("positions is NULL"));
}

}  // namespace unit_test_cpu_attention_packed
