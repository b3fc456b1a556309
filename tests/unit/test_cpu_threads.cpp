// The CPU ops' vector math (cpu_math.hpp) against libm in double, and the
// ops that run on the thread pool: the same bits with 1 thread as with 3,
// on sizes large enough to be split (the other op tests use small tensors
// that stay on the calling thread).
#include <tessera/ops.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_math.hpp"
#include "backend/cpu/cpu_ops.hpp"
#include "backend/cpu/cpu_pool.hpp"
#include "util/error.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_cpu_threads {

namespace {

const tsr_ops &ops() {
  return *tessera::cpu_ops();
}

struct T {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DLTensor t{};
  T(void *data, std::vector<int64_t> shp, DLDataType dt = {kDLFloat, 32, 1},
    std::vector<int64_t> str = {}, uint64_t byte_offset = 0)
      : shape(std::move(shp)), strides(std::move(str)) {
    t.data = data;
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = dt;
    t.shape = shape.data();
    t.strides = strides.empty() ? nullptr : strides.data();
    t.byte_offset = byte_offset;
  }
  DLTensor *dl() { return &t; }
};

std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto &x : v) x = d(g);
  return v;
}

bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs f with the ops on `threads` threads, then puts the default back.
template <typename F>
auto with_threads(int threads, F f) {
  tessera::cpu_ops_set_threads(threads);
  auto r = f();
  tessera::cpu_ops_set_threads(1);
  return r;
}

}  // namespace

TEST_CASE("cpu math: exp_v and tanh_v against libm in double", "[ops]") {
  double worst_exp = 0, worst_tanh = 0;
  for (int i = -870000; i <= 880000; i++) {
    const float x = static_cast<float>(i) * 1e-4f;
    const double e = std::exp(static_cast<double>(x));
    worst_exp = std::max(worst_exp, std::fabs(tessera::cpu::exp_v(x) - e) / e);
  }
  for (int i = -200000; i <= 200000; i++) {
    const float x = static_cast<float>(i) * 1e-4f;
    const double t = std::tanh(static_cast<double>(x));
    const double err = std::fabs(tessera::cpu::tanh_v(x) - t);
    // Relative near 0 (where tanh x ~ x), absolute where |tanh| nears 1.
    worst_tanh = std::max(worst_tanh, err / std::max(std::fabs(t), 1e-30) * (std::fabs(t) < 0.5) +
                                          err * (std::fabs(t) >= 0.5));
  }
  INFO("exp: worst relative error " << worst_exp << "; tanh: " << worst_tanh);
  CHECK(worst_exp < 4e-7);
  CHECK(worst_tanh < 1e-6);
  // The edges: no inf, no NaN from finite input; NaN stays NaN.
  CHECK(std::isfinite(tessera::cpu::exp_v(1000.0f)));
  CHECK(tessera::cpu::exp_v(-1000.0f) >= 0.0f);
  CHECK(tessera::cpu::exp_v(-1000.0f) < 1e-37f);
  CHECK(tessera::cpu::tanh_v(1e30f) == 1.0f);
  CHECK(tessera::cpu::tanh_v(-1e30f) == -1.0f);
  CHECK(tessera::cpu::tanh_v(0.0f) == 0.0f);
  CHECK(std::isnan(tessera::cpu::exp_v(NAN)));
  CHECK(std::isnan(tessera::cpu::tanh_v(NAN)));
}

TEST_CASE("cpu ops pool: parallel_for covers every item once, at any size", "[ops]") {
  tessera::cpu_ops_set_threads(3);
  for (int64_t n : {0, 1, 2, 5, 100, 100003}) {
    std::vector<int> hits(static_cast<size_t>(n), 0);
    tessera::cpu::parallel_for(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; i++) hits[static_cast<size_t>(i)]++;
    });
    bool once = true;
    for (int h : hits) once &= h == 1;
    CHECK(once);
  }
  CHECK(tessera::cpu::pool_threads() == 3);
  tessera::cpu_ops_set_threads(1);
  CHECK(tessera::cpu::pool_threads() == 1);
}

TEST_CASE("cpu ops pool: a parallel_for inside a chunk runs on that chunk's thread", "[ops]") {
  tessera::cpu_ops_set_threads(3);
  const int64_t outer = 6, inner = 1000;
  std::vector<int> hits(static_cast<size_t>(outer * inner), 0);
  std::vector<int> threads_seen(static_cast<size_t>(outer), 0),
      stayed(static_cast<size_t>(outer), 0);
  tessera::cpu::parallel_for(outer, 1, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; o++) {
      // Inside a chunk (the caller's or a worker's) the pool is busy: the
      // nested call and pool_threads answer on this thread.
      threads_seen[static_cast<size_t>(o)] = tessera::cpu::pool_threads();
      const auto me = std::this_thread::get_id();
      bool here = true;
      tessera::cpu::parallel_for(inner, 1, [&](int64_t ib, int64_t ie) {
        here &= std::this_thread::get_id() == me;
        for (int64_t i = ib; i < ie; i++) hits[static_cast<size_t>(o * inner + i)]++;
      });
      stayed[static_cast<size_t>(o)] = here;  // Catch2 checks on the test's thread only
    }
  });
  bool once = true;
  for (int h : hits) once &= h == 1;
  CHECK(once);
  CHECK(threads_seen == std::vector<int>(static_cast<size_t>(outer), 1));
  CHECK(stayed == std::vector<int>(static_cast<size_t>(outer), 1));
  CHECK(tessera::cpu::pool_threads() == 3);  // and outside, the pool again
  tessera::cpu_ops_set_threads(1);
}

TEST_CASE("cpu ops pool: a thread count set inside a chunk is refused, the pool unchanged",
          "[ops]") {
  tessera::cpu_ops_set_threads(3);
  std::vector<int> refused(4, 0);
  tessera::cpu::parallel_for(4, 1, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; o++) {
      try {
        tessera::cpu_ops_set_threads(2);
      } catch (const tessera::Error &err) {
        refused[static_cast<size_t>(o)] =
            err.code() == TSR_ERR_INVALID &&
            std::string(err.what()).find("inside a parallel_for") != std::string::npos;
      }
    }
  });
  CHECK(refused == std::vector<int>(4, 1));
  CHECK(tessera::cpu::pool_threads() == 3);
  tessera::cpu_ops_set_threads(1);
}

TEST_CASE("cpu ops pool: back-to-back calls and calls after the workers sleep, spinning or not",
          "[ops]") {
  // Many short calls in a row (the workers catch each while spinning), then
  // calls after a pause longer than the spin (the workers are asleep and
  // must be woken), with spinning on and off: every item once, every time.
  const long spin = tessera::cpu::pool_spin_us();
  tessera::cpu_ops_set_threads(3);
  for (long us : {100L, 0L, 2000L}) {
    tessera::cpu::pool_set_spin_us(us);
    CHECK(tessera::cpu::pool_spin_us() == us);
    std::vector<int> hits(64, 0);
    bool once = true;
    for (int call = 0; call < 2000; call++) {
      if (call % 500 == 499) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      // n = 2 leaves the third thread out: it must sit that call out and
      // still take its part of the next.
      const int64_t n = call % 3 == 0 ? 2 : 64;
      std::fill(hits.begin(), hits.end(), 0);
      tessera::cpu::parallel_for(n, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; i++) hits[static_cast<size_t>(i)]++;
      });
      for (int64_t i = 0; i < 64; i++) once &= hits[static_cast<size_t>(i)] == (i < n ? 1 : 0);
    }
    CHECK(once);
  }
  // TESSERA_CPU_SPIN_US as the pool reads it: a bad value is an error
  // naming the variable, not a silent default.
  CHECK(tessera::cpu::spin_us_from(nullptr) == 100);
  CHECK(tessera::cpu::spin_us_from("") == 100);
  CHECK(tessera::cpu::spin_us_from("0") == 0);
  CHECK(tessera::cpu::spin_us_from("250") == 250);
  for (const char *bad : {"abc", "-3", "10us", "5000000", "99999999999999999999"})
    CHECK_THROWS_WITH(tessera::cpu::spin_us_from(bad),
                      Catch::Contains("TESSERA_CPU_SPIN_US=") && Catch::Contains(bad));
  tessera::cpu::pool_set_spin_us(-5);  // clamped, not a wait of -5 us
  CHECK(tessera::cpu::pool_spin_us() == 0);
  tessera::cpu::pool_set_spin_us(spin);
  tessera::cpu_ops_set_threads(1);
}

TEST_CASE(
    "cpu ops on the pool: GELU, tanh, bias + GELU and bias_grad give the same bits on 1 and 3 "
    "threads",
    "[ops]") {
  const size_t n = 300001;  // odd, and several pool chunks
  std::vector<float> x = randn(n, 1, 3.0f), dy = randn(n, 2);
  x[5] = 40.0f, x[6] = -40.0f, x[7] = 1e30f;  // the clamped tails
  auto run = [&] {
    std::vector<float> y(n), dx(n), t(n), dt(n), yb(x.begin(), x.end() - 1);
    std::vector<float> bias = randn(300, 3);
    T X(x.data(), {static_cast<int64_t>(n)}), Y(y.data(), {static_cast<int64_t>(n)}),
        DY(dy.data(), {static_cast<int64_t>(n)}), DX(dx.data(), {static_cast<int64_t>(n)}),
        TT(t.data(), {static_cast<int64_t>(n)}), DT(dt.data(), {static_cast<int64_t>(n)}),
        YB(yb.data(), {1000, 300}), B(bias.data(), {300});
    REQUIRE(ops().act_forward(nullptr, TSR_ACT_GELU, X.dl(), Y.dl()) == TSR_OK);
    REQUIRE(ops().act_backward(nullptr, TSR_ACT_GELU, X.dl(), 0, DY.dl(), DX.dl()) == TSR_OK);
    REQUIRE(ops().act_forward(nullptr, TSR_ACT_TANH, X.dl(), TT.dl()) == TSR_OK);
    REQUIRE(ops().act_backward(nullptr, TSR_ACT_TANH, X.dl(), 0, DY.dl(), DT.dl()) == TSR_OK);
    REQUIRE(ops().bias_act(nullptr, YB.dl(), B.dl(), TSR_ACT_GELU) == TSR_OK);
    // The column sums, over blocks of columns on the pool: 300 columns is
    // four full blocks and a partial one.
    std::vector<float> db(300, 0.5f);
    T DB(db.data(), {300});
    REQUIRE(ops().bias_grad(nullptr, YB.dl(), DB.dl()) == TSR_OK);
    return std::vector<std::vector<float>>{y, dx, t, dt, yb, db};
  };
  const auto one = with_threads(1, run), three = with_threads(3, run);
  for (size_t i = 0; i < one.size(); i++) CHECK(same_bits(one[i], three[i]));
  // And right: GELU against its formula in double, past the clamps too.
  const auto &y = one[0];
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    const double v = x[i], u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
    const double ref = std::fabs(v) > 10 ? (v > 0 ? v : 0.0) : 0.5 * v * (1 + std::tanh(u));
    worst = std::max(worst, std::fabs(y[i] - ref) / std::max(1.0, std::fabs(ref)));
  }
  CHECK(worst < 1e-6);
  CHECK(one[1][7] == dy[7]);  // slope 1 far right
  // bias_grad: 0.5 plus each column's sum, against a double sum.
  double worst_db = 0;
  for (size_t c = 0; c < 300; c++) {
    double ref = 0;
    for (size_t r = 0; r < 1000; r++) ref += one[4][r * 300 + c];
    ref += 0.5;
    worst_db = std::max(worst_db, std::fabs(one[5][c] - ref) / std::max(1.0, std::fabs(ref)));
  }
  CHECK(worst_db < 1e-6);
}

TEST_CASE(
    "cpu cross_entropy on the pool: same loss and gradient bits on 1 and 3 threads, "
    "in place too",
    "[ops]") {
  const int64_t rows = 4099, cols = 300, valid = 290;
  std::vector<float> logits = randn(static_cast<size_t>(rows * cols), 4, 4.0f);
  std::vector<int32_t> targets(static_cast<size_t>(rows));
  std::mt19937 g(5);
  for (auto &t : targets) t = static_cast<int32_t>(g() % valid);
  targets[3] = -1;  // ignored row
  struct Out {
    std::vector<float> grad, inplace;
    double loss, loss_inplace;
    int64_t count, correct;
  };
  auto run = [&] {
    Out o;
    o.grad.resize(logits.size());
    o.inplace = logits;
    T L(logits.data(), {rows, cols}), Tg(targets.data(), {rows}, {kDLInt, 32, 1}),
        D(o.grad.data(), {rows, cols}), I(o.inplace.data(), {rows, cols});
    REQUIRE(ops().cross_entropy(nullptr, L.dl(), Tg.dl(), valid, 0.5f, D.dl(), &o.loss, &o.count,
                                &o.correct) == TSR_OK);
    int64_t c2 = 0;
    REQUIRE(ops().cross_entropy(nullptr, I.dl(), Tg.dl(), valid, 0.5f, I.dl(), &o.loss_inplace, &c2,
                                nullptr) == TSR_OK);
    return o;
  };
  const Out one = with_threads(1, run), three = with_threads(3, run);
  CHECK(one.loss == three.loss);
  CHECK(one.count == rows - 1);
  CHECK(three.correct == one.correct);
  CHECK(same_bits(one.grad, three.grad));
  CHECK(same_bits(one.grad, one.inplace));
  CHECK(one.loss == one.loss_inplace);
  // The loss against a double-precision log-softmax.
  double ref = 0;
  for (int64_t r = 0; r < rows; r++) {
    if (targets[static_cast<size_t>(r)] < 0) continue;
    const float *x = logits.data() + r * cols;
    double mx = x[0], z = 0;
    for (int64_t j = 1; j < valid; j++) mx = std::max(mx, double(x[j]));
    for (int64_t j = 0; j < valid; j++) z += std::exp(x[j] - mx);
    ref += mx + std::log(z) - x[targets[static_cast<size_t>(r)]];
  }
  CHECK(std::fabs(one.loss - ref) / ref < 1e-6);
  // Padding columns and the ignored row get zero gradient.
  CHECK(one.grad[static_cast<size_t>(cols - 1)] == 0.0f);
  CHECK(one.grad[static_cast<size_t>(3 * cols + 7)] == 0.0f);
}

TEST_CASE("cpu attention on the pool: same bits on 1 and 3 threads", "[ops][attention]") {
  const int64_t B = 3, Tn = 40, H = 5, D = 16;
  const int64_t n = B * Tn * H * D;
  std::vector<float> qkv = randn(static_cast<size_t>(3 * n), 6),
                     dout = randn(static_cast<size_t>(n), 7);
  const std::vector<int64_t> shp = {B, Tn, H, D}, fused = {Tn * 3 * H * D, 3 * H * D, D, 1};
  auto run = [&] {
    std::vector<float> out(static_cast<size_t>(n)), lse(static_cast<size_t>(B * H * Tn)),
        dqkv(static_cast<size_t>(3 * n));
    auto view = [&](std::vector<float> &base, int w) {
      return T(base.data(), shp, {kDLFloat, 32, 1}, fused,
               static_cast<uint64_t>(w * H * D) * sizeof(float));
    };
    T q = view(qkv, 0), k = view(qkv, 1), v = view(qkv, 2), dq = view(dqkv, 0), dk = view(dqkv, 1),
      dv = view(dqkv, 2), O(out.data(), shp), dO(dout.data(), shp), L(lse.data(), {B, H, Tn});
    const float scale = 0.25f;
    REQUIRE(ops().attention_forward(nullptr, q.dl(), k.dl(), v.dl(), scale, O.dl(), L.dl()) ==
            TSR_OK);
    REQUIRE(ops().attention_backward(nullptr, q.dl(), k.dl(), v.dl(), O.dl(), dO.dl(), L.dl(),
                                     scale, dq.dl(), dk.dl(), dv.dl()) == TSR_OK);
    return std::vector<std::vector<float>>{out, lse, dqkv};
  };
  const auto one = with_threads(1, run), three = with_threads(3, run);
  for (size_t i = 0; i < one.size(); i++) CHECK(same_bits(one[i], three[i]));
}

}  // namespace unit_test_cpu_threads
