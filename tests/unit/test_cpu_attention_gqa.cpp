// The CPU's grouped-query attention (ABI 1.6's attention_gqa_*): against the
// multi-head op with K and V repeated per query head, against a naive
// float64 reference written out here, and its backward against central
// finite differences of that reference; the gradient of a key/value head is
// the sum over the query heads that share it.
#include <tessera/ops.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <vector>

#include "unit/cpu_ops_nn11_support.hpp"

namespace unit_test_cpu_attention_gqa {

using namespace tessera::test::cpu_ops_nn11_support;
using Vec = std::vector<double>;

struct Dims {
  int64_t B, T, H, Hk, D;
};

// Causal attention in float64 from the definition: q [B,T,H,D], k and v
// [B,T,Hk,D] compact; query head h uses key/value head h / (H / Hk).
Vec attention_ref(const Dims &d, const Vec &q, const Vec &k, const Vec &v, double scale) {
  Vec out(static_cast<size_t>(d.B * d.T * d.H * d.D), 0.0);
  const int64_t g = d.H / d.Hk;
  auto qi = [&](int64_t b, int64_t t, int64_t h, int64_t e) {
    return ((b * d.T + t) * d.H + h) * d.D + e;
  };
  auto ki = [&](int64_t b, int64_t t, int64_t h, int64_t e) {
    return ((b * d.T + t) * d.Hk + h) * d.D + e;
  };
  for (int64_t b = 0; b < d.B; b++)
    for (int64_t h = 0; h < d.H; h++)
      for (int64_t t = 0; t < d.T; t++) {
        std::vector<double> s(static_cast<size_t>(t + 1));
        double mx = -INFINITY;
        for (int64_t j = 0; j <= t; j++) {
          double acc = 0;
          for (int64_t e = 0; e < d.D; e++) acc += q[qi(b, t, h, e)] * k[ki(b, j, h / g, e)];
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (double &x : s) z += (x = std::exp(x - mx));
        for (int64_t j = 0; j <= t; j++)
          for (int64_t e = 0; e < d.D; e++) out[qi(b, t, h, e)] += s[j] / z * v[ki(b, j, h / g, e)];
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

// k [B,T,Hk,D] repeated to [B,T,H,D].
std::vector<float> repeat_heads(const Dims &d, const std::vector<float> &k) {
  std::vector<float> out(static_cast<size_t>(d.B * d.T * d.H * d.D));
  const int64_t g = d.H / d.Hk;
  for (int64_t bt = 0; bt < d.B * d.T; bt++)
    for (int64_t h = 0; h < d.H; h++)
      for (int64_t e = 0; e < d.D; e++)
        out[(bt * d.H + h) * d.D + e] = k[(bt * d.Hk + h / g) * d.D + e];
  return out;
}

TEST_CASE("attention_gqa equals the multi-head op on repeated K and V", "[cpu_ops][decoder]") {
  for (const int64_t Hk : {int64_t(1), int64_t(2), int64_t(4)}) {
    const Dims d{2, 70, 4, Hk, 8};  // T over one 64-row tile
    INFO("Hk = " << Hk);
    const float scale = 0.35f;
    F32 q({d.B, d.T, d.H, d.D}), k({d.B, d.T, Hk, d.D}), v({d.B, d.T, Hk, d.D});
    randomize(q.v, 21);
    randomize(k.v, 22);
    randomize(v.v, 23);
    F32 out({d.B, d.T, d.H, d.D}), lse({d.B, d.H, d.T});
    REQUIRE(ops().attention_gqa_forward(nullptr, q.dl(), k.dl(), v.dl(), scale, out.dl(),
                                        lse.dl()) == TSR_OK);
    F32 kr({d.B, d.T, d.H, d.D}), vr({d.B, d.T, d.H, d.D});
    kr.v = repeat_heads(d, k.v);
    vr.v = repeat_heads(d, v.v);
    F32 out_m({d.B, d.T, d.H, d.D}), lse_m({d.B, d.H, d.T});
    REQUIRE(ops().attention_forward(nullptr, q.dl(), kr.dl(), vr.dl(), scale, out_m.dl(),
                                    lse_m.dl()) == TSR_OK);
    CHECK(out.v == out_m.v);
    CHECK(lse.v == lse_m.v);

    F32 dout({d.B, d.T, d.H, d.D});
    randomize(dout.v, 24);
    F32 dq({d.B, d.T, d.H, d.D}), dk({d.B, d.T, Hk, d.D}), dv({d.B, d.T, Hk, d.D});
    REQUIRE(ops().attention_gqa_backward(nullptr, q.dl(), k.dl(), v.dl(), out.dl(), dout.dl(),
                                         lse.dl(), scale, dq.dl(), dk.dl(), dv.dl()) == TSR_OK);
    F32 dq_m({d.B, d.T, d.H, d.D}), dk_m({d.B, d.T, d.H, d.D}), dv_m({d.B, d.T, d.H, d.D});
    REQUIRE(ops().attention_backward(nullptr, q.dl(), kr.dl(), vr.dl(), out_m.dl(), dout.dl(),
                                     lse_m.dl(), scale, dq_m.dl(), dk_m.dl(), dv_m.dl()) == TSR_OK);
    CHECK(dq.v == dq_m.v);
    const int64_t g = d.H / Hk;
    for (int64_t bt = 0; bt < d.B * d.T; bt++)
      for (int64_t hk = 0; hk < Hk; hk++)
        for (int64_t e = 0; e < d.D; e++) {
          double sk = 0, sv = 0;
          for (int64_t j = 0; j < g; j++) {
            sk += dk_m.v[(bt * d.H + hk * g + j) * d.D + e];
            sv += dv_m.v[(bt * d.H + hk * g + j) * d.D + e];
          }
          const size_t i = static_cast<size_t>((bt * Hk + hk) * d.D + e);
          CHECK(dk.v[i] == Approx(sk).margin(1e-5));
          CHECK(dv.v[i] == Approx(sv).margin(1e-5));
        }
  }
}

TEST_CASE("attention_gqa matches a float64 reference and finite differences",
          "[cpu_ops][decoder]") {
  const Dims d{1, 5, 4, 2, 3};
  const double scale = 0.6;
  F32 q({d.B, d.T, d.H, d.D}), k({d.B, d.T, d.Hk, d.D}), v({d.B, d.T, d.Hk, d.D});
  randomize(q.v, 31);
  randomize(k.v, 32);
  randomize(v.v, 33);
  F32 out({d.B, d.T, d.H, d.D}), lse({d.B, d.H, d.T}), g({d.B, d.T, d.H, d.D});
  randomize(g.v, 34);
  REQUIRE(ops().attention_gqa_forward(nullptr, q.dl(), k.dl(), v.dl(), float(scale), out.dl(),
                                      lse.dl()) == TSR_OK);
  const Vec Q = to_d(q.v), K = to_d(k.v), V = to_d(v.v), G = to_d(g.v);
  const Vec want = attention_ref(d, Q, K, V, scale);
  for (size_t i = 0; i < want.size(); i++) CHECK(out.v[i] == Approx(want[i]).margin(1e-6));
  F32 dq({d.B, d.T, d.H, d.D}), dk({d.B, d.T, d.Hk, d.D}), dv({d.B, d.T, d.Hk, d.D});
  REQUIRE(ops().attention_gqa_backward(nullptr, q.dl(), k.dl(), v.dl(), out.dl(), g.dl(), lse.dl(),
                                       float(scale), dq.dl(), dk.dl(), dv.dl()) == TSR_OK);
  const Vec nq =
      numeric_grad(Q, [&](const Vec &x) { return dot(attention_ref(d, x, K, V, scale), G); });
  const Vec nk =
      numeric_grad(K, [&](const Vec &x) { return dot(attention_ref(d, Q, x, V, scale), G); });
  const Vec nv =
      numeric_grad(V, [&](const Vec &x) { return dot(attention_ref(d, Q, K, x, scale), G); });
  for (size_t i = 0; i < nq.size(); i++) CHECK(dq.v[i] == Approx(nq[i]).margin(1e-5));
  for (size_t i = 0; i < nk.size(); i++) CHECK(dk.v[i] == Approx(nk[i]).margin(1e-5));
  for (size_t i = 0; i < nv.size(); i++) CHECK(dv.v[i] == Approx(nv[i]).margin(1e-5));
}

TEST_CASE("attention_gqa refuses head counts that do not divide", "[cpu_ops][decoder]") {
  F32 q({1, 2, 4, 8}), k({1, 2, 3, 8}), v({1, 2, 3, 8}), out({1, 2, 4, 8}), lse({1, 4, 2});
  Msgs m;
  CHECK(ops().attention_gqa_forward(m.ctx(), q.dl(), k.dl(), v.dl(), 1.0f, out.dl(), lse.dl()) ==
        TSR_ERR_INVALID);
  CHECK_THAT(m.last(), Catch::Contains("k float32[1,2,3,8] has 3 heads, which must divide q's 4"));
  // The multi-head entry still wants k shaped like q.
  F32 k2({1, 2, 2, 8}), v2({1, 2, 2, 8});
  CHECK(ops().attention_forward(m.ctx(), q.dl(), k2.dl(), v2.dl(), 1.0f, out.dl(), lse.dl()) ==
        TSR_ERR_INVALID);
  CHECK_THAT(m.last(), Catch::Contains("does not match q's shape"));
}

}  // namespace unit_test_cpu_attention_gqa
