// The CPU ops of ABI 1.6's decoder blocks (RMSNorm, the residual add with
// RMSNorm, SwiGLU, rotary embedding) against float64 references written out
// here with plain loops, and every backward against central finite
// differences of a scalar loss over those references. The rope frequencies
// of type llama3 are checked against values computed here from the
// formula of Hugging Face's _compute_llama3_parameters.
#include <tessera/ops.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <numbers>
#include <vector>

#include "unit/cpu_ops_nn11_support.hpp"
#include "util/dltensor.hpp"

namespace unit_test_cpu_ops_decoder {

using namespace tessera::test::cpu_ops_nn11_support;
using Vec = std::vector<double>;

Vec to_d(const std::vector<float> &v) {
  return Vec(v.begin(), v.end());
}

// d/dx_i of f at x by central differences (f is smooth; h = 1e-6).
Vec numeric_grad(const Vec &x, const std::function<double(const Vec &)> &f) {
  Vec g(x.size());
  Vec p = x;
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

// ---------------------------------------------------------------- RMSNorm

Vec rmsnorm_ref(const Vec &x, const Vec &w, int64_t rows, int64_t C, double eps) {
  Vec y(x.size());
  for (int64_t r = 0; r < rows; r++) {
    double ss = 0;
    for (int64_t j = 0; j < C; j++) ss += x[r * C + j] * x[r * C + j];
    const double inv = 1.0 / std::sqrt(ss / C + eps);
    for (int64_t j = 0; j < C; j++) y[r * C + j] = x[r * C + j] * inv * w[j];
  }
  return y;
}

TEST_CASE("rmsnorm_forward matches the float64 reference", "[cpu_ops][decoder]") {
  const int64_t rows = 5, C = 13;
  const float eps = 1e-5f;
  F32 x({rows, C}), w({C}), y({rows, C}), rstd({rows});
  randomize(x.v, 1);
  randomize(w.v, 2, 0.5f, 1.5f);
  REQUIRE(ops().rmsnorm_forward(nullptr, x.dl(), w.dl(), eps, y.dl(), rstd.dl()) == TSR_OK);
  const Vec want = rmsnorm_ref(to_d(x.v), to_d(w.v), rows, C, eps);
  for (size_t i = 0; i < want.size(); i++) CHECK(y.v[i] == Approx(want[i]).epsilon(1e-6));
  for (int64_t r = 0; r < rows; r++) {
    double ss = 0;
    for (int64_t j = 0; j < C; j++) ss += double(x.v[r * C + j]) * x.v[r * C + j];
    CHECK(rstd.v[r] == Approx(1.0 / std::sqrt(ss / C + eps)).epsilon(1e-6));
  }
  // y may alias x.
  F32 x2 = x;
  REQUIRE(ops().rmsnorm_forward(nullptr, x2.dl(), w.dl(), eps, x2.dl(), rstd.dl()) == TSR_OK);
  CHECK(x2.v == y.v);
}

TEST_CASE("rmsnorm_backward matches finite differences and accumulates", "[cpu_ops][decoder]") {
  const int64_t rows = 4, C = 9;
  const double eps = 1e-5;
  F32 x({rows, C}), w({C}), y({rows, C}), rstd({rows}), dy({rows, C}), dx({rows, C}, 0.25f),
      dw({C}, -0.5f);
  randomize(x.v, 3);
  randomize(w.v, 4, 0.5f, 1.5f);
  randomize(dy.v, 5);
  REQUIRE(ops().rmsnorm_forward(nullptr, x.dl(), w.dl(), float(eps), y.dl(), rstd.dl()) == TSR_OK);
  REQUIRE(ops().rmsnorm_backward(nullptr, dy.dl(), x.dl(), w.dl(), rstd.dl(), dx.dl(), dw.dl()) ==
          TSR_OK);
  const Vec X = to_d(x.v), W = to_d(w.v), G = to_d(dy.v);
  const Vec gx =
      numeric_grad(X, [&](const Vec &v) { return dot(rmsnorm_ref(v, W, rows, C, eps), G); });
  const Vec gw =
      numeric_grad(W, [&](const Vec &v) { return dot(rmsnorm_ref(X, v, rows, C, eps), G); });
  for (size_t i = 0; i < gx.size(); i++) CHECK(dx.v[i] - 0.25 == Approx(gx[i]).margin(1e-4));
  for (size_t i = 0; i < gw.size(); i++) CHECK(dw.v[i] + 0.5 == Approx(gw[i]).margin(1e-4));
}

TEST_CASE("rmsnorm_backward without dweight gives the same dx (ABI 1.11)", "[cpu_ops][decoder]") {
  const int64_t rows = 70, C = 33;  // more than one block of rows for the column sums
  F32 x({rows, C}), w({C}), y({rows, C}), rstd({rows}), dy({rows, C}), dx({rows, C}, 0.25f),
      dx2({rows, C}, 0.25f), dw({C}, 0.0f);
  randomize(x.v, 6);
  randomize(w.v, 7, 0.5f, 1.5f);
  randomize(dy.v, 8);
  REQUIRE(ops().rmsnorm_forward(nullptr, x.dl(), w.dl(), 1e-5f, y.dl(), rstd.dl()) == TSR_OK);
  REQUIRE(ops().rmsnorm_backward(nullptr, dy.dl(), x.dl(), w.dl(), rstd.dl(), dx.dl(), dw.dl()) ==
          TSR_OK);
  REQUIRE(ops().rmsnorm_backward(nullptr, dy.dl(), x.dl(), w.dl(), rstd.dl(), dx2.dl(), nullptr) ==
          TSR_OK);
  CHECK(dx2.v == dx.v);
  // dx aliasing dy, as the llama plugin calls it.
  F32 g = dy;
  REQUIRE(ops().rmsnorm_backward(nullptr, g.dl(), x.dl(), w.dl(), rstd.dl(), g.dl(), nullptr) ==
          TSR_OK);
  for (size_t i = 0; i < g.v.size(); i++)
    CHECK(g.v[i] == Approx(dx.v[i] - 0.25f + dy.v[i]).margin(1e-5));
}

TEST_CASE("add_rmsnorm_forward is the add, then rmsnorm_forward", "[cpu_ops][decoder]") {
  const int64_t rows = 3, C = 16;
  F32 x({rows, C}), y({rows, C}), w({C}), r({rows, C}), out({rows, C}), rstd({rows});
  F32 out2({rows, C}), rstd2({rows});
  randomize(x.v, 6);
  randomize(y.v, 7);
  randomize(w.v, 8);
  REQUIRE(ops().add_rmsnorm_forward(nullptr, x.dl(), y.dl(), w.dl(), 1e-6f, r.dl(), out.dl(),
                                    rstd.dl()) == TSR_OK);
  for (size_t i = 0; i < r.v.size(); i++) CHECK(r.v[i] == x.v[i] + y.v[i]);
  REQUIRE(ops().rmsnorm_forward(nullptr, r.dl(), w.dl(), 1e-6f, out2.dl(), rstd2.dl()) == TSR_OK);
  CHECK(out.v == out2.v);
  CHECK(rstd.v == rstd2.v);
  // r may be x (the residual stream updated in place); out may not.
  F32 xs = x;
  REQUIRE(ops().add_rmsnorm_forward(nullptr, xs.dl(), y.dl(), w.dl(), 1e-6f, xs.dl(), out2.dl(),
                                    rstd2.dl()) == TSR_OK);
  CHECK(xs.v == r.v);
  CHECK(out2.v == out.v);
  Msgs m;
  CHECK(ops().add_rmsnorm_forward(m.ctx(), x.dl(), y.dl(), w.dl(), 1e-6f, r.dl(), x.dl(),
                                  rstd.dl()) == TSR_ERR_INVALID);
  CHECK_THAT(m.last(), Catch::Contains("out must not alias"));
}

// ---------------------------------------------------------------- SwiGLU

double silu(double g) {
  return g / (1.0 + std::exp(-g));
}

// Half `which` (0: the first F columns, 1: the last F) of b's [rows, 2F]
// buffer as a [rows, F] view with row stride 2F, over the caller's shape
// {rows, F} and strides {2F, 1}.
DLTensor half_of(Buf<float> &b, int64_t (&shape)[2], int64_t (&strides)[2], int which) {
  DLTensor t = *b.dl();
  t.shape = shape;
  t.strides = strides;
  t.byte_offset = static_cast<uint64_t>(which * shape[1]) * sizeof(float);
  return t;
}

TEST_CASE("swiglu forward and backward on the halves of one [rows, 2F] buffer",
          "[cpu_ops][decoder]") {
  const int64_t rows = 3, F = 5;
  F32 gu({rows, 2 * F}), out({rows, F}), dout({rows, F}), dgu({rows, 2 * F});
  randomize(gu.v, 9, -4.0f, 4.0f);
  randomize(dout.v, 10);
  // gate = columns [0, F), up = [F, 2F): views with row stride 2F.
  int64_t shape[2] = {rows, F}, strides[2] = {2 * F, 1};
  auto half = [&](Buf<float> &b, int which) { return half_of(b, shape, strides, which); };
  DLTensor gate = half(gu, 0), up = half(gu, 1), dgate = half(dgu, 0), dup = half(dgu, 1);
  REQUIRE(ops().swiglu_forward(nullptr, &gate, &up, out.dl()) == TSR_OK);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < F; j++) {
      const double g = gu.v[r * 2 * F + j], u = gu.v[r * 2 * F + F + j];
      CHECK(out.v[r * F + j] == Approx(silu(g) * u).epsilon(1e-6).margin(1e-7));
    }
  REQUIRE(ops().swiglu_backward(nullptr, &gate, &up, dout.dl(), &dgate, &dup) == TSR_OK);
  const Vec GU = to_d(gu.v), D = to_d(dout.v);
  const Vec num = numeric_grad(GU, [&](const Vec &v) {
    double s = 0;
    for (int64_t r = 0; r < rows; r++)
      for (int64_t j = 0; j < F; j++)
        s += silu(v[r * 2 * F + j]) * v[r * 2 * F + F + j] * D[r * F + j];
    return s;
  });
  for (size_t i = 0; i < num.size(); i++) CHECK(dgu.v[i] == Approx(num[i]).margin(1e-5));
  // In place: dgate over gate, dup over up.
  F32 g2({rows, F}), u2({rows, F});
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < F; j++) {
      g2.v[r * F + j] = gu.v[r * 2 * F + j];
      u2.v[r * F + j] = gu.v[r * 2 * F + F + j];
    }
  REQUIRE(ops().swiglu_backward(nullptr, g2.dl(), u2.dl(), dout.dl(), g2.dl(), u2.dl()) == TSR_OK);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < F; j++) {
      CHECK(g2.v[r * F + j] == dgu.v[r * 2 * F + j]);
      CHECK(u2.v[r * F + j] == dgu.v[r * 2 * F + F + j]);
    }
}

// ---------------------------------------------------------------- RoPE

tsr_rope_params rope_default(double theta) {
  tsr_rope_params p{};
  p.struct_size = tsr_rope_params_STRUCT_SIZE;
  p.type = TSR_ROPE_DEFAULT;
  p.theta = theta;
  return p;
}

tsr_rope_params rope_llama3() {
  tsr_rope_params p = rope_default(500000.0);
  p.type = TSR_ROPE_LLAMA3;
  p.factor = 32.0;
  p.low_freq_factor = 1.0;
  p.high_freq_factor = 4.0;
  p.original_max_position_embeddings = 8192;
  return p;
}

// Llama 3's frequencies from the formula (HF's _compute_llama3_parameters):
// the band of each wavelength decides between keep, divide and blend.
Vec llama3_freqs_here(double theta, int64_t D, double factor, double lo, double hi, double ctx) {
  Vec out;
  for (int64_t i = 0; i < D; i += 2) {
    const double base = std::pow(theta, -double(i) / double(D));
    const double wavelen = 2 * std::numbers::pi / base;
    double v;
    if (wavelen < ctx / hi) {
      v = base;
    } else if (wavelen > ctx / lo) {
      v = base / factor;
    } else {
      const double smooth = (ctx / wavelen - lo) / (hi - lo);
      v = (1 - smooth) * base / factor + smooth * base;
    }
    out.push_back(v);
  }
  return out;
}

// HF's apply_rotary_pos_emb on one head row: x * cos + rotate_half(x) * sin,
// rotate_half(x) = cat(-x2, x1), cos and sin repeated over both halves.
Vec rope_row_ref(const Vec &x, const Vec &inv, double pos) {
  const size_t D = x.size(), half = D / 2;
  Vec rot(D), cs(D), sn(D), y(D);
  for (size_t i = 0; i < half; i++) {
    rot[i] = -x[i + half];
    rot[i + half] = x[i];
    cs[i] = cs[i + half] = std::cos(pos * inv[i]);
    sn[i] = sn[i + half] = std::sin(pos * inv[i]);
  }
  for (size_t i = 0; i < D; i++) y[i] = x[i] * cs[i] + rot[i] * sn[i];
  return y;
}

// rope over a compact [B, T, H, D] buffer.
Vec rope_ref(const Vec &x, const std::vector<int32_t> &pos, int64_t H, int64_t D, const Vec &inv) {
  Vec y(x.size());
  for (size_t row = 0; row < x.size() / D; row++) {
    const Vec r(x.begin() + row * D, x.begin() + (row + 1) * D);
    const Vec o = rope_row_ref(r, inv, pos[row / H]);
    std::copy(o.begin(), o.end(), y.begin() + row * D);
  }
  return y;
}

TEST_CASE("swiglu_backward_out is swiglu_forward and swiglu_backward in one pass (ABI 1.12)",
          "[cpu_ops][decoder]") {
  // Odd and wide rows (the vector loops and their tails), gate and up the
  // halves of one [rows, 2F] buffer as a fused linear would leave them.
  for (const int64_t F : {int64_t{7}, int64_t{67}}) {
    const int64_t rows = 5;
    F32 gu({rows, 2 * F}), dout({rows, F}), out_ref({rows, F}), out({rows, F});
    F32 dgu_ref({rows, 2 * F}), dgu({rows, 2 * F});
    randomize(gu.v, 21, -6.0f, 6.0f);
    randomize(dout.v, 22);
    int64_t shape[2] = {rows, F}, strides[2] = {2 * F, 1};
    auto half = [&](Buf<float> &b, int which) { return half_of(b, shape, strides, which); };
    DLTensor gate = half(gu, 0), up = half(gu, 1);
    DLTensor dgate_ref = half(dgu_ref, 0), dup_ref = half(dgu_ref, 1);
    DLTensor dgate = half(dgu, 0), dup = half(dgu, 1);
    REQUIRE(ops().swiglu_forward(nullptr, &gate, &up, out_ref.dl()) == TSR_OK);
    REQUIRE(ops().swiglu_backward(nullptr, &gate, &up, dout.dl(), &dgate_ref, &dup_ref) == TSR_OK);
    REQUIRE(ops().swiglu_backward_out(nullptr, &gate, &up, dout.dl(), &dgate, &dup, out.dl()) ==
            TSR_OK);
    INFO("F = " << F);
    CHECK(out.v == out_ref.v);
    CHECK(dgu.v == dgu_ref.v);
    // out over gate's buffer: refused by name, nothing written.
    const std::vector<float> before = gu.v;
    CHECK(ops().swiglu_backward_out(nullptr, &gate, &up, dout.dl(), &dgate, &dup, &gate) ==
          TSR_ERR_INVALID);
    CHECK(gu.v == before);
  }
  // out of another shape: refused.
  F32 g({3, 4}), u({3, 4}), d({3, 4}), dg({3, 4}), du({3, 4}), wrong({3, 5});
  CHECK(ops().swiglu_backward_out(nullptr, g.dl(), u.dl(), d.dl(), dg.dl(), du.dl(), wrong.dl()) ==
        TSR_ERR_INVALID);
}

TEST_CASE("check_apart finds shared bytes by shape, strides and offset", "[cpu_ops][decoder]") {
  std::vector<float> buf(64);
  int64_t shape[2] = {4, 4}, compact_strides[2] = {4, 1}, wide[2] = {8, 1}, back[2] = {-8, 1};
  auto view = [&](int64_t *st, int64_t offset) {
    DLTensor t{};
    t.data = buf.data();
    t.device = {kDLCPU, 0};
    t.ndim = 2;
    t.dtype = {kDLFloat, 32, 1};
    t.shape = shape;
    t.strides = st;
    t.byte_offset = static_cast<uint64_t>(offset) * sizeof(float);
    return t;
  };
  const DLTensor a = view(compact_strides, 0), b = view(compact_strides, 16);
  const DLTensor left = view(wide, 0), right = view(wide, 4);  // interleaved rows
  DLTensor out = view(nullptr, 16);                            // compact by shape: b's bytes
  CHECK_NOTHROW(tessera::check_apart("t", "out", &a, {{"b", &b}, {"none", nullptr}}));
  CHECK_THROWS_WITH(tessera::check_apart("t", "out", &out, {{"a", &a}, {"b", &b}}),
                    Catch::Contains("t: out") && Catch::Contains("overlaps b"));
  // Rows 0, 2, 4, 6 of 8 against rows 1, 3, 5, 7: their spans interleave,
  // and the check (by span, not element) refuses it.
  CHECK_THROWS(tessera::check_apart("t", "out", &left, {{"right", &right}}));
  // A negative row stride reaches back: rows at 56, 48, 40, 32 overlap
  // nothing below 32 and do overlap what starts there.
  const DLTensor up = view(back, 56), low = view(compact_strides, 0),
                 mid = view(compact_strides, 32);
  CHECK_NOTHROW(tessera::check_apart("t", "out", &up, {{"low", &low}}));
  CHECK_THROWS(tessera::check_apart("t", "out", &up, {{"mid", &mid}}));
  // An empty tensor shares nothing.
  int64_t none[2] = {0, 4};
  DLTensor empty = a;
  empty.shape = none;
  CHECK_NOTHROW(tessera::check_apart("t", "out", &empty, {{"a", &a}}));
}

TEST_CASE("rope llama3 frequencies follow Hugging Face's formula", "[cpu_ops][decoder]") {
  const tsr_rope_params p = rope_llama3();
  const std::vector<double> got = tessera::rope_inv_freq("test", &p, 64);
  const Vec want = llama3_freqs_here(500000.0, 64, 32.0, 1.0, 4.0, 8192.0);
  REQUIRE(got.size() == 32);
  for (size_t i = 0; i < got.size(); i++) CHECK(got[i] == Approx(want[i]).epsilon(1e-13));
  // The three bands all occur at this shape: kept, blended, divided.
  CHECK(got[0] == 1.0);
  CHECK(got[31] == Approx(std::pow(500000.0, -62.0 / 64) / 32.0).epsilon(1e-13));
  int blended = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double base = std::pow(500000.0, -2.0 * i / 64);
    if (got[i] != base && std::abs(got[i] - base / 32.0) > 1e-15 * base) blended++;
  }
  CHECK(blended > 0);
  const tsr_rope_params d = rope_default(10000.0);
  const std::vector<double> def = tessera::rope_inv_freq("test", &d, 8);
  for (int i = 0; i < 4; i++)
    CHECK(def[i] == Approx(std::pow(10000.0, -2.0 * i / 8)).epsilon(1e-15));
}

TEST_CASE("rope forward and backward on q and k with restarting positions", "[cpu_ops][decoder]") {
  const int64_t B = 2, T = 3, Hq = 4, Hk = 2, D = 8;
  for (const tsr_rope_params p : {rope_default(10000.0), rope_llama3()}) {
    INFO("rope type " << p.type);
    F32 q({B, T, Hq, D}), k({B, T, Hk, D});
    I32 pos({B, T});
    pos.v = {0, 1, 2, 0, 1, 9000};  // a packed second sequence, then a far position
    randomize(q.v, 11);
    randomize(k.v, 12);
    const Vec Q = to_d(q.v), K = to_d(k.v);
    Vec inv;
    if (p.type == TSR_ROPE_DEFAULT) {
      for (int64_t i = 0; i < D; i += 2) inv.push_back(std::pow(10000.0, -double(i) / D));
    } else {
      inv = llama3_freqs_here(500000.0, D, 32.0, 1.0, 4.0, 8192.0);
    }
    REQUIRE(ops().rope_forward(nullptr, &p, pos.dl(), q.dl(), k.dl()) == TSR_OK);
    const Vec wq = rope_ref(Q, pos.v, Hq, D, inv), wk = rope_ref(K, pos.v, Hk, D, inv);
    for (size_t i = 0; i < wq.size(); i++) CHECK(q.v[i] == Approx(wq[i]).margin(2e-6));
    for (size_t i = 0; i < wk.size(); i++) CHECK(k.v[i] == Approx(wk[i]).margin(2e-6));
    // Backward: the gradient of sum(rope(q) * g) with respect to q.
    F32 g({B, T, Hq, D});
    randomize(g.v, 13);
    const Vec G = to_d(g.v);
    REQUIRE(ops().rope_backward(nullptr, &p, pos.dl(), g.dl(), nullptr) == TSR_OK);
    const Vec num =
        numeric_grad(Q, [&](const Vec &v) { return dot(rope_ref(v, pos.v, Hq, D, inv), G); });
    for (size_t i = 0; i < num.size(); i++) CHECK(g.v[i] == Approx(num[i]).margin(1e-5));
  }
}

TEST_CASE("rope refuses unknown types, odd head dims and bad positions", "[cpu_ops][decoder]") {
  F32 q({1, 2, 1, 4}), odd({1, 2, 1, 3});
  I32 pos({1, 2}), wrong({2, 1});
  Msgs m;
  tsr_rope_params p = rope_default(10000.0);
  p.type = 7;
  CHECK(ops().rope_forward(m.ctx(), &p, pos.dl(), q.dl(), nullptr) == TSR_ERR_INVALID);
  CHECK_THAT(m.last(), Catch::Contains("unknown rope type 7"));
  p = rope_default(10000.0);
  CHECK(ops().rope_forward(m.ctx(), &p, pos.dl(), odd.dl(), nullptr) == TSR_ERR_INVALID);
  CHECK_THAT(m.last(), Catch::Contains("must be even"));
  CHECK(ops().rope_forward(m.ctx(), &p, wrong.dl(), q.dl(), nullptr) == TSR_ERR_INVALID);
  CHECK_THAT(m.last(), Catch::Contains("positions"));
  p = rope_llama3();
  p.high_freq_factor = 0.5;
  CHECK(ops().rope_forward(m.ctx(), &p, pos.dl(), q.dl(), nullptr) == TSR_ERR_INVALID);
  CHECK_THAT(m.last(), Catch::Contains("low_freq_factor < high_freq_factor"));
  CHECK(ops().rope_forward(m.ctx(), nullptr, pos.dl(), q.dl(), nullptr) == TSR_ERR_INVALID);
}

}  // namespace unit_test_cpu_ops_decoder
