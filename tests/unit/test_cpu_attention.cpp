// CPU causal attention against a naive double-precision reference written
// out here (the T x T scores materialised), its analytic gradient, and
// central finite differences of a scalar loss. q, k, v are strided views
// into one fused [B, T, 3, H, D] buffer as GPT-2 lays them out.
#include <tessera/ops.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_ops_internal.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_cpu_attention {

namespace {

struct Shape {
  int64_t B, T, H, D;
  int64_t n() const { return B * T * H * D; }
};

// A DLTensor header with its own shape and strides.
struct View {
  int64_t shape[4];
  int64_t strides[4];
  DLTensor t{};
  View(float *data, int ndim, const int64_t *shp, const int64_t *str, uint64_t byte_offset = 0) {
    for (int i = 0; i < ndim; i++) shape[i] = shp[i], strides[i] = str ? str[i] : 0;
    t.data = data;
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = ndim;
    t.dtype = DLDataType{kDLFloat, 32, 1};
    t.shape = shape;
    t.strides = str ? strides : nullptr;
    t.byte_offset = byte_offset;
  }
  DLTensor *dl() { return &t; }
};

// q (w = 0), k (1), v (2) inside fused [B, T, 3, H, D].
View fused(float *base, const Shape &s, int w) {
  const int64_t shp[4] = {s.B, s.T, s.H, s.D};
  const int64_t str[4] = {s.T * 3 * s.H * s.D, 3 * s.H * s.D, s.D, 1};
  return View(base, 4, shp, str, static_cast<uint64_t>(w * s.H * s.D) * sizeof(float));
}
View compact(float *base, const Shape &s) {
  const int64_t shp[4] = {s.B, s.T, s.H, s.D};
  return View(base, 4, shp, nullptr);
}
View lse_view(float *base, const Shape &s) {
  const int64_t shp[3] = {s.B, s.H, s.T};
  return View(base, 3, shp, nullptr);
}

// Fused index of element (b, t, w, h, d).
size_t fi(const Shape &s, int64_t b, int64_t t, int w, int64_t h, int64_t d) {
  return static_cast<size_t>((((b * s.T + t) * 3 + w) * s.H + h) * s.D + d);
}
// Compact [B, T, H, D] index.
size_t ci(const Shape &s, int64_t b, int64_t t, int64_t h, int64_t d) {
  return static_cast<size_t>(((b * s.T + t) * s.H + h) * s.D + d);
}

// Naive reference in double: full T x T scores, masked, softmax, and the
// textbook backward (dP = dO V^T, dS = P * (dP - rowsum(dP * P)), dQ = dS K
// * scale, dK = dS^T Q * scale, dV = P^T dO).
struct Ref {
  std::vector<double> out, lse, dqkv;  // out compact, lse [B,H,T], dqkv fused
};
Ref reference(const Shape &s, const std::vector<float> &qkv, const std::vector<float> &dout,
              double scale) {
  Ref r;
  r.out.assign(s.n(), 0);
  r.lse.assign(s.B * s.H * s.T, 0);
  r.dqkv.assign(3 * s.n(), 0);
  const int64_t T = s.T;
  std::vector<double> P(T * T), dP(T * T);
  for (int64_t b = 0; b < s.B; b++) {
    for (int64_t h = 0; h < s.H; h++) {
      auto q = [&](int64_t t, int64_t d) { return double(qkv[fi(s, b, t, 0, h, d)]); };
      auto k = [&](int64_t t, int64_t d) { return double(qkv[fi(s, b, t, 1, h, d)]); };
      auto v = [&](int64_t t, int64_t d) { return double(qkv[fi(s, b, t, 2, h, d)]); };
      auto go = [&](int64_t t, int64_t d) { return double(dout[ci(s, b, t, h, d)]); };
      for (int64_t i = 0; i < T; i++) {
        double mx = -INFINITY;
        for (int64_t j = 0; j < T; j++) {
          double x = -INFINITY;
          if (j <= i) {
            x = 0;
            for (int64_t d = 0; d < s.D; d++) x += q(i, d) * k(j, d);
            x *= scale;
          }
          P[i * T + j] = x;
          mx = std::max(mx, x);
        }
        double sum = 0;
        for (int64_t j = 0; j < T; j++) sum += (P[i * T + j] = std::exp(P[i * T + j] - mx));
        for (int64_t j = 0; j < T; j++) P[i * T + j] /= sum;
        r.lse[(b * s.H + h) * T + i] = mx + std::log(sum);
        for (int64_t d = 0; d < s.D; d++) {
          double o = 0;
          for (int64_t j = 0; j < T; j++) o += P[i * T + j] * v(j, d);
          r.out[ci(s, b, i, h, d)] = o;
        }
      }
      for (int64_t i = 0; i < T; i++) {
        double rs = 0;
        for (int64_t j = 0; j < T; j++) {
          double x = 0;
          for (int64_t d = 0; d < s.D; d++) x += go(i, d) * v(j, d);
          dP[i * T + j] = x;
          rs += x * P[i * T + j];
        }
        for (int64_t j = 0; j < T; j++) dP[i * T + j] = P[i * T + j] * (dP[i * T + j] - rs);
      }
      for (int64_t i = 0; i < T; i++) {
        for (int64_t d = 0; d < s.D; d++) {
          double dq = 0, dk = 0, dv = 0;
          for (int64_t j = 0; j < T; j++) {
            dq += dP[i * T + j] * k(j, d);
            dk += dP[j * T + i] * q(j, d);
            dv += P[j * T + i] * go(j, d);
          }
          r.dqkv[fi(s, b, i, 0, h, d)] = dq * scale;
          r.dqkv[fi(s, b, i, 1, h, d)] = dk * scale;
          r.dqkv[fi(s, b, i, 2, h, d)] = dv;
        }
      }
    }
  }
  return r;
}

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float &e : x) e = nd(rng);
  return x;
}

struct Run {
  std::vector<float> out, lse, dqkv;
};
// The op under test: forward into compact out/lse, backward into views of a
// fused gradient buffer (poisoned first, so unwritten elements show).
Run run_cpu(const Shape &s, std::vector<float> &qkv, std::vector<float> &dout, float scale,
            bool backward = true) {
  Run r;
  r.out.assign(s.n(), NAN);
  r.lse.assign(s.B * s.H * s.T, NAN);
  r.dqkv.assign(3 * s.n(), NAN);
  View q = fused(qkv.data(), s, 0), k = fused(qkv.data(), s, 1), v = fused(qkv.data(), s, 2);
  View o = compact(r.out.data(), s), l = lse_view(r.lse.data(), s);
  REQUIRE(tessera::cpu::attention_forward(nullptr, q.dl(), k.dl(), v.dl(), scale, o.dl(), l.dl()) ==
          TSR_OK);
  if (backward) {
    View go = compact(dout.data(), s);
    View dq = fused(r.dqkv.data(), s, 0), dk = fused(r.dqkv.data(), s, 1),
         dv = fused(r.dqkv.data(), s, 2);
    REQUIRE(tessera::cpu::attention_backward(nullptr, q.dl(), k.dl(), v.dl(), o.dl(), go.dl(),
                                             l.dl(), scale, dq.dl(), dk.dl(), dv.dl()) == TSR_OK);
  }
  return r;
}

template <typename A, typename B>
double max_rel(const std::vector<A> &got, const std::vector<B> &want) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double d =
        std::fabs(double(got[i]) - double(want[i])) / (1.0 + std::fabs(double(want[i])));
    if (!(d <= worst)) worst = d;  // NaN propagates
  }
  return worst;
}

}  // namespace

TEST_CASE("cpu attention: forward matches the naive reference", "[attention]") {
  for (const Shape s : {Shape{2, 7, 3, 8}, Shape{1, 33, 2, 16}, Shape{1, 1, 1, 4}}) {
    std::vector<float> qkv = randn(3 * s.n(), 1), dout = randn(s.n(), 2);
    const float scale = 1.0f / std::sqrt(float(s.D));
    const Run got = run_cpu(s, qkv, dout, scale, false);
    const Ref want = reference(s, qkv, dout, scale);
    INFO("B=" << s.B << " T=" << s.T << " H=" << s.H << " D=" << s.D);
    CHECK(max_rel(got.out, want.out) < 1e-5);
    CHECK(max_rel(got.lse, want.lse) < 1e-5);
  }
}

TEST_CASE("cpu attention: backward matches the analytic gradient", "[attention]") {
  for (const Shape s : {Shape{2, 7, 3, 8}, Shape{1, 33, 2, 16}}) {
    std::vector<float> qkv = randn(3 * s.n(), 3), dout = randn(s.n(), 4);
    const float scale = 0.3f;
    const Run got = run_cpu(s, qkv, dout, scale);
    const Ref want = reference(s, qkv, dout, scale);
    INFO("B=" << s.B << " T=" << s.T << " H=" << s.H << " D=" << s.D);
    CHECK(max_rel(got.dqkv, want.dqkv) < 2e-5);
  }
}

TEST_CASE("cpu attention: backward matches finite differences", "[attention]") {
  // loss = sum(out * dout) so d loss / d qkv is exactly what backward returns.
  const Shape s{1, 5, 2, 4};
  std::vector<float> qkv = randn(3 * s.n(), 5), dout = randn(s.n(), 6);
  const float scale = 0.5f;
  const Run got = run_cpu(s, qkv, dout, scale);
  auto loss = [&](const std::vector<float> &x) {
    // The reference forward in double, so the differences are clean.
    const Ref r = reference(s, x, dout, scale);
    double l = 0;
    for (int64_t i = 0; i < s.n(); i++) l += r.out[i] * dout[i];
    return l;
  };
  const double eps = 1e-3;
  for (size_t i = 0; i < qkv.size(); i++) {
    std::vector<float> xp = qkv, xm = qkv;
    xp[i] += float(eps);
    xm[i] -= float(eps);
    const double h = double(xp[i]) - double(xm[i]);  // the step the floats really took
    const double fd = (loss(xp) - loss(xm)) / h;
    INFO("fused element " << i);
    CHECK(std::fabs(got.dqkv[i] - fd) <= 1e-3 * (1.0 + std::fabs(fd)));
  }
}

TEST_CASE("cpu attention: causality and strides", "[attention]") {
  const Shape s{1, 9, 2, 8};
  std::vector<float> qkv = randn(3 * s.n(), 7), dout = randn(s.n(), 8);
  const Run base = run_cpu(s, qkv, dout, 0.35f);
  // Changing the last position's k and v leaves every earlier output alone.
  std::vector<float> other = qkv;
  for (int64_t h = 0; h < s.H; h++)
    for (int64_t d = 0; d < s.D; d++) {
      other[fi(s, 0, s.T - 1, 1, h, d)] += 1.0f;
      other[fi(s, 0, s.T - 1, 2, h, d)] -= 2.0f;
    }
  const Run changed = run_cpu(s, other, dout, 0.35f, false);
  for (int64_t t = 0; t + 1 < s.T; t++)
    for (int64_t h = 0; h < s.H; h++)
      for (int64_t d = 0; d < s.D; d++)
        REQUIRE(changed.out[ci(s, 0, t, h, d)] == base.out[ci(s, 0, t, h, d)]);
  // Row 0 attends only to itself: out = v_0, lse = scale * q_0 . k_0.
  for (int64_t h = 0; h < s.H; h++) {
    double qk = 0;
    for (int64_t d = 0; d < s.D; d++) {
      CHECK(base.out[ci(s, 0, 0, h, d)] == Approx(qkv[fi(s, 0, 0, 2, h, d)]).epsilon(1e-6));
      qk += double(qkv[fi(s, 0, 0, 0, h, d)]) * qkv[fi(s, 0, 0, 1, h, d)];
    }
    CHECK(base.lse[h * s.T] == Approx(0.35 * qk).epsilon(1e-5));
  }
  // Compact copies of q, k, v give the same results as the fused views.
  std::vector<float> q(s.n()), k(s.n()), v(s.n());
  for (int64_t t = 0; t < s.T; t++)
    for (int64_t h = 0; h < s.H; h++)
      for (int64_t d = 0; d < s.D; d++) {
        q[ci(s, 0, t, h, d)] = qkv[fi(s, 0, t, 0, h, d)];
        k[ci(s, 0, t, h, d)] = qkv[fi(s, 0, t, 1, h, d)];
        v[ci(s, 0, t, h, d)] = qkv[fi(s, 0, t, 2, h, d)];
      }
  std::vector<float> out(s.n()), lse(s.H * s.T);
  View vq = compact(q.data(), s), vk = compact(k.data(), s), vv = compact(v.data(), s),
       vo = compact(out.data(), s), vl = lse_view(lse.data(), s);
  REQUIRE(tessera::cpu::attention_forward(nullptr, vq.dl(), vk.dl(), vv.dl(), 0.35f, vo.dl(),
                                          vl.dl()) == TSR_OK);
  CHECK(out == base.out);
  CHECK(lse == base.lse);
}

TEST_CASE("cpu attention: argument errors", "[attention]") {
  const Shape s{1, 4, 1, 8};
  std::vector<float> qkv(3 * s.n(), 0.5f), out(s.n()), lse(s.T);
  View q = fused(qkv.data(), s, 0), k = fused(qkv.data(), s, 1), v = fused(qkv.data(), s, 2);
  View o = compact(out.data(), s), l = lse_view(lse.data(), s);
  // Mismatched shapes.
  const Shape t{1, 3, 1, 8};
  View o3 = compact(out.data(), t);
  CHECK(tessera::cpu::attention_forward(nullptr, q.dl(), k.dl(), v.dl(), 1.0f, o3.dl(), l.dl()) ==
        TSR_ERR_INVALID);
  // lse of the wrong shape.
  const int64_t bad[3] = {1, 1, 3};
  View lb(lse.data(), 3, bad, nullptr);
  CHECK(tessera::cpu::attention_forward(nullptr, q.dl(), k.dl(), v.dl(), 1.0f, o.dl(), lb.dl()) ==
        TSR_ERR_INVALID);
  // Not float32.
  View vb = fused(qkv.data(), s, 2);
  vb.t.dtype = DLDataType{kDLBfloat, 16, 1};
  CHECK(tessera::cpu::attention_forward(nullptr, q.dl(), k.dl(), vb.dl(), 1.0f, o.dl(), l.dl()) ==
        TSR_ERR_UNSUPPORTED);
  // Device memory.
  View od = compact(out.data(), s);
  od.t.device = DLDevice{kDLCUDA, 0};
  CHECK(tessera::cpu::attention_forward(nullptr, q.dl(), k.dl(), v.dl(), 1.0f, od.dl(), l.dl()) ==
        TSR_ERR_UNSUPPORTED);
}

}  // namespace unit_test_cpu_attention
