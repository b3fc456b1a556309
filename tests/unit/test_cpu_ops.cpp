// The CPU ops table against references written out independently here: naive
// double-precision loops, closed-form activations in double, and central
// finite differences for the gradients.
#include <tessera/ops.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/cpu_ops.hpp"
#include "backend/cpu/cpu_pool.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_cpu_ops {

namespace {

const tsr_ops &ops() {
  return *tessera::cpu_ops();
}

int64_t numel_of(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// An owning host tensor. dl() rebuilds the DLTensor each time, so a test can
// take it and then break one field (dtype, device, strides) on purpose.
template <typename T>
struct Host {
  std::vector<int64_t> shape;
  std::vector<T> v;
  DLTensor t{};
  explicit Host(std::vector<int64_t> s, T init = T(0))
      : shape(std::move(s)), v(static_cast<size_t>(numel_of(shape)), init) {}
  DLTensor *dl() {
    t.data = v.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = static_cast<int>(shape.size());
    t.dtype = std::is_same_v<T, float> ? DLDataType{kDLFloat, 32, 1} : DLDataType{kDLInt, 32, 1};
    t.shape = shape.data();
    t.strides = nullptr;
    t.byte_offset = 0;
    return &t;
  }
};
using F32 = Host<float>;
using I32 = Host<int32_t>;

void randomize(F32 &x, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (float &e : x.v) e = u(rng);
}

bool close(double got, double want, double tol) {
  return std::fabs(got - want) <= tol * (1.0 + std::fabs(want));
}

// --- independent references, all in double ---

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

struct CeRef {
  double loss = 0;
  int64_t count = 0, correct = 0;
  std::vector<double> grad;  // softmax - onehot, zero for ignored rows / padding
};

// Plain log-sum-exp in long double over the first `valid` columns.
CeRef ref_ce(const std::vector<float> &logits, const std::vector<int32_t> &targets, int64_t rows,
             int64_t cols, int64_t valid) {
  CeRef r;
  r.grad.assign(static_cast<size_t>(rows * cols), 0.0);
  for (int64_t i = 0; i < rows; i++) {
    const int32_t t = targets[i];
    if (t < 0) continue;
    const float *x = &logits[i * cols];
    long double mx = x[0];
    int64_t arg = 0;
    for (int64_t j = 0; j < valid; j++)
      if (x[j] > mx) mx = x[j], arg = j;
    long double z = 0;
    for (int64_t j = 0; j < valid; j++) z += std::exp(static_cast<long double>(x[j]) - mx);
    const long double lse = mx + std::log(z);
    r.loss += static_cast<double>(lse - x[t]);
    r.count++;
    r.correct += arg == t;
    for (int64_t j = 0; j < valid; j++)
      r.grad[i * cols + j] = static_cast<double>(std::exp(x[j] - lse)) - (j == t ? 1.0 : 0.0);
  }
  return r;
}

}  // namespace

TEST_CASE("cpu ops table has every entry", "[cpu_ops]") {
  const tsr_ops &o = ops();
  CHECK(o.struct_size == sizeof(tsr_ops));
  CHECK(o.matmul);
  CHECK(o.bias_act);
  CHECK(o.bias_grad);
  CHECK(o.act_forward);
  CHECK(o.act_backward);
  CHECK(o.cross_entropy);
  CHECK(o.fill);
  CHECK(o.copy);
  CHECK(o.axpy);
  CHECK(o.scale);
  CHECK(o.sum_squares);
  CHECK(tessera::cpu_ops() == &o);
}

// ---------------------------------------------------------------------------
// matmul

namespace {

// c = alpha * op(a) @ op(b) + beta * c0 with a viewed as (rows, last dim).
void check_matmul(int64_t m, int64_t n, int64_t k, int ta, int tb, float alpha, float beta,
                  uint32_t seed) {
  // a is op^-1 of an m x k matrix; give it a leading split dim when possible
  // to exercise the N-D view.
  const int64_t ar = ta ? k : m, ac = ta ? m : k;
  std::vector<int64_t> ashape =
      ar % 2 == 0 && ar > 0 ? std::vector<int64_t>{2, ar / 2, ac} : std::vector<int64_t>{ar, ac};
  std::vector<int64_t> cshape =
      m % 2 == 0 && m > 0 ? std::vector<int64_t>{2, m / 2, n} : std::vector<int64_t>{m, n};
  F32 a(ashape), b(tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}), c(cshape);
  randomize(a, seed);
  randomize(b, seed + 1);
  randomize(c, seed + 2);
  const std::vector<float> c0 = c.v;
  REQUIRE(ops().matmul(nullptr, a.dl(), ta, b.dl(), tb, c.dl(), alpha, beta) == TSR_OK);
  for (int64_t i = 0; i < m; i++) {
    for (int64_t j = 0; j < n; j++) {
      double s = 0;
      for (int64_t p = 0; p < k; p++) {
        const double av = ta ? a.v[p * m + i] : a.v[i * k + p];
        const double bv = tb ? b.v[j * k + p] : b.v[p * n + j];
        s += av * bv;
      }
      const double want = alpha * s + beta * c0[i * n + j];
      INFO("m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb << " at (" << i
                << "," << j << "): got " << c.v[i * n + j] << ", want " << want);
      REQUIRE(close(c.v[i * n + j], want, 1e-5));
    }
  }
}

}  // namespace

TEST_CASE("matmul matches a naive product for every transpose combination", "[cpu_ops]") {
  for (int ta = 0; ta < 2; ta++) {
    for (int tb = 0; tb < 2; tb++) {
      check_matmul(6, 7, 4, ta, tb, 1.0f, 0.0f, 11);
      check_matmul(5, 3, 9, ta, tb, 0.7f, -1.3f, 22);
      check_matmul(34, 65, 130, ta, tb, -0.5f, 1.0f, 33);
      check_matmul(1, 1, 1, ta, tb, 2.0f, 0.5f, 44);
    }
  }
}

TEST_CASE("matmul with beta = 0 does not read c", "[cpu_ops]") {
  F32 a({3, 4}), b({4, 2}), c({3, 2}, std::numeric_limits<float>::quiet_NaN());
  randomize(a, 1);
  randomize(b, 2);
  REQUIRE(ops().matmul(nullptr, a.dl(), 0, b.dl(), 0, c.dl(), 1.0f, 0.0f) == TSR_OK);
  for (float e : c.v) CHECK(std::isfinite(e));
}

TEST_CASE("matmul handles empty dimensions", "[cpu_ops]") {
  SECTION("k = 0 leaves beta * c") {
    F32 a({3, 0}), b({0, 4}), c({3, 4}, 2.0f);
    REQUIRE(ops().matmul(nullptr, a.dl(), 0, b.dl(), 0, c.dl(), 1.0f, 0.5f) == TSR_OK);
    for (float e : c.v) CHECK(e == 1.0f);
    REQUIRE(ops().matmul(nullptr, a.dl(), 0, b.dl(), 0, c.dl(), 1.0f, 0.0f) == TSR_OK);
    for (float e : c.v) CHECK(e == 0.0f);
  }
  SECTION("m = 0 is a no-op") {
    F32 a({0, 3}), b({3, 4}), c({0, 4});
    CHECK(ops().matmul(nullptr, a.dl(), 0, b.dl(), 0, c.dl(), 1.0f, 0.0f) == TSR_OK);
  }
}

TEST_CASE("matmul accepts explicit compact strides", "[cpu_ops]") {
  F32 a({2, 3}), b({3, 2}), c({2, 2});
  randomize(a, 5);
  randomize(b, 6);
  int64_t sa[2] = {3, 1};
  DLTensor *ad = a.dl();
  ad->strides = sa;
  REQUIRE(ops().matmul(nullptr, ad, 0, b.dl(), 0, c.dl(), 1.0f, 0.0f) == TSR_OK);
  const double want = double(a.v[0]) * b.v[0] + double(a.v[1]) * b.v[2] + double(a.v[2]) * b.v[4];
  CHECK(close(c.v[0], want, 1e-6));
}

TEST_CASE("matmul rejects bad arguments", "[cpu_ops]") {
  F32 a({4, 3}), b({3, 5}), c({4, 5});
  SECTION("inner dims differ") {
    CHECK(ops().matmul(nullptr, a.dl(), 1, b.dl(), 0, c.dl(), 1, 0) == TSR_ERR_INVALID);
    CHECK(ops().matmul(nullptr, a.dl(), 0, b.dl(), 1, c.dl(), 1, 0) == TSR_ERR_INVALID);
  }
  SECTION("c has the wrong shape") {
    F32 c2({5, 4});
    CHECK(ops().matmul(nullptr, a.dl(), 0, b.dl(), 0, c2.dl(), 1, 0) == TSR_ERR_INVALID);
  }
  SECTION("b is not 2-D") {
    F32 b3({1, 3, 5});
    CHECK(ops().matmul(nullptr, a.dl(), 0, b3.dl(), 0, c.dl(), 1, 0) == TSR_ERR_INVALID);
  }
  SECTION("trans flag out of range") {
    CHECK(ops().matmul(nullptr, a.dl(), 2, b.dl(), 0, c.dl(), 1, 0) == TSR_ERR_INVALID);
  }
  SECTION("wrong dtype") {
    DLTensor *ad = a.dl();
    ad->dtype = DLDataType{kDLFloat, 16, 1};
    CHECK(ops().matmul(nullptr, ad, 0, b.dl(), 0, c.dl(), 1, 0) == TSR_ERR_UNSUPPORTED);
  }
  SECTION("wrong device") {
    DLTensor *cd = c.dl();
    cd->device = DLDevice{kDLCUDA, 0};
    CHECK(ops().matmul(nullptr, a.dl(), 0, b.dl(), 0, cd, 1, 0) == TSR_ERR_UNSUPPORTED);
  }
  SECTION("non-contiguous") {
    int64_t col_major[2] = {1, 4};
    DLTensor *ad = a.dl();
    ad->strides = col_major;
    CHECK(ops().matmul(nullptr, ad, 0, b.dl(), 0, c.dl(), 1, 0) == TSR_ERR_UNSUPPORTED);
  }
  SECTION("NULL tensor") {
    CHECK(ops().matmul(nullptr, nullptr, 0, b.dl(), 0, c.dl(), 1, 0) == TSR_ERR_INVALID);
  }
  SECTION("c aliases a") {
    F32 sq({3, 3});
    CHECK(ops().matmul(nullptr, sq.dl(), 0, sq.dl(), 0, sq.dl(), 1, 0) == TSR_ERR_INVALID);
  }
}

extern "C" int openblas_get_num_threads(void);

TEST_CASE("matmul split over the pool's threads: every transpose, tall and wide", "[cpu_ops]") {
  const int before = tessera::cpu::pool_threads();
  tessera::cpu_ops_set_threads(3);
  // OpenBLAS stays on one thread; gemm splits the product itself.
  CHECK(openblas_get_num_threads() == 1);
  CHECK(tessera::cpu::pool_threads() == 3);
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      check_matmul(257, 96, 72, ta, tb, 1.0f, 0.0f, 77 + ta * 2 + tb);  // split along m
      check_matmul(64, 301, 80, ta, tb, 0.5f, 1.0f, 91 + ta * 2 + tb);  // split along n
    }
  tessera::cpu_ops_set_threads(0);
  check_matmul(64, 32, 48, 1, 0, 1.0f, 1.0f, 78);
  tessera::cpu_ops_set_threads(before);  // leave the process as we found it
}

// ---------------------------------------------------------------------------
// activations

TEST_CASE("gelu matches the tanh approximation's known values", "[cpu_ops]") {
  F32 x({3});
  x.v = {1.0f, -1.0f, 2.0f};
  F32 y({3});
  REQUIRE(ops().act_forward(nullptr, TSR_ACT_GELU, x.dl(), y.dl()) == TSR_OK);
  CHECK(y.v[0] == Approx(0.8411919906082768).epsilon(1e-6));
  CHECK(y.v[1] == Approx(-0.15880800939172324).epsilon(1e-6));
  CHECK(y.v[2] == Approx(1.954597694087775).epsilon(1e-6));
}

TEST_CASE("act_forward matches the reference, also in place", "[cpu_ops]") {
  for (tsr_activation act : {TSR_ACT_NONE, TSR_ACT_RELU, TSR_ACT_GELU, TSR_ACT_TANH}) {
    F32 x({3, 37}), y({111});  // same count, different shape
    randomize(x, 100 + act, -6.0f, 6.0f);
    const std::vector<float> x0 = x.v;
    REQUIRE(ops().act_forward(nullptr, act, x.dl(), y.dl()) == TSR_OK);
    REQUIRE(ops().act_forward(nullptr, act, x.dl(), x.dl()) == TSR_OK);
    for (size_t i = 0; i < x0.size(); i++) {
      INFO("act " << act << " x " << x0[i]);
      REQUIRE(close(y.v[i], ref_act(act, x0[i]), 1e-6));
      REQUIRE(x.v[i] == y.v[i]);
    }
  }
}

TEST_CASE("act_forward rejects bad arguments", "[cpu_ops]") {
  F32 x({4}), y({5});
  CHECK(ops().act_forward(nullptr, TSR_ACT_RELU, x.dl(), y.dl()) == TSR_ERR_INVALID);
  CHECK(ops().act_forward(nullptr, 42, x.dl(), x.dl()) == TSR_ERR_INVALID);
  I32 xi({4});
  CHECK(ops().act_forward(nullptr, TSR_ACT_RELU, xi.dl(), x.dl()) == TSR_ERR_UNSUPPORTED);
}

TEST_CASE("bias_act adds the bias to every row, then activates", "[cpu_ops]") {
  for (tsr_activation act : {TSR_ACT_NONE, TSR_ACT_RELU, TSR_ACT_GELU, TSR_ACT_TANH}) {
    F32 y({2, 3, 5}), bias({5});
    randomize(y, 200 + act);
    randomize(bias, 300 + act);
    const std::vector<float> y0 = y.v;
    REQUIRE(ops().bias_act(nullptr, y.dl(), bias.dl(), act) == TSR_OK);
    for (size_t i = 0; i < y0.size(); i++) {
      const double pre = double(y0[i]) + double(bias.v[i % 5]);
      INFO("act " << act << " i " << i);
      REQUIRE(close(y.v[i], ref_act(act, pre), 1e-6));
    }
  }
  F32 y({2, 5}), wrong({4});
  CHECK(ops().bias_act(nullptr, y.dl(), wrong.dl(), TSR_ACT_NONE) == TSR_ERR_INVALID);
  F32 bias({5});
  CHECK(ops().bias_act(nullptr, y.dl(), bias.dl(), -1) == TSR_ERR_INVALID);
}

TEST_CASE("bias_grad accumulates column sums", "[cpu_ops]") {
  // 600 columns: more than one block of the implementation's column blocking.
  F32 dy({4, 3, 600}), dbias({600}, 1.5f);
  randomize(dy, 400);
  REQUIRE(ops().bias_grad(nullptr, dy.dl(), dbias.dl()) == TSR_OK);
  for (int64_t j = 0; j < 600; j++) {
    double s = 1.5;
    for (int64_t r = 0; r < 12; r++) s += dy.v[r * 600 + j];
    INFO("column " << j);
    REQUIRE(close(dbias.v[j], s, 1e-6));
  }
  F32 wrong({599});
  CHECK(ops().bias_grad(nullptr, dy.dl(), wrong.dl()) == TSR_ERR_INVALID);
}

TEST_CASE("act_backward matches finite differences of the activation", "[cpu_ops]") {
  for (tsr_activation act : {TSR_ACT_NONE, TSR_ACT_RELU, TSR_ACT_GELU, TSR_ACT_TANH}) {
    F32 x({8, 16}), dy({8, 16}), dx({128});
    randomize(x, 500 + act, -4.0f, 4.0f);
    for (float &e : x.v)
      if (std::fabs(e) < 1e-2f) e = 0.5f;  // keep clear of relu's kink
    randomize(dy, 600 + act);
    REQUIRE(ops().act_backward(nullptr, act, x.dl(), 0, dy.dl(), dx.dl()) == TSR_OK);
    for (size_t i = 0; i < x.v.size(); i++) {
      const double h = 1e-5, xi = x.v[i];
      const double slope = (ref_act(act, xi + h) - ref_act(act, xi - h)) / (2 * h);
      INFO("act " << act << " x " << xi);
      REQUIRE(std::fabs(dx.v[i] - dy.v[i] * slope) <= 1e-5 * (1 + std::fabs(dy.v[i] * slope)));
    }
  }
}

TEST_CASE("act_backward from the output agrees for relu and tanh", "[cpu_ops]") {
  for (tsr_activation act : {TSR_ACT_RELU, TSR_ACT_TANH}) {
    F32 x({100}), y({100}), dy({100}), dx_in({100}), dx_out({100});
    randomize(x, 700 + act, -3.0f, 3.0f);
    randomize(dy, 800 + act);
    REQUIRE(ops().act_forward(nullptr, act, x.dl(), y.dl()) == TSR_OK);
    REQUIRE(ops().act_backward(nullptr, act, x.dl(), 0, dy.dl(), dx_in.dl()) == TSR_OK);
    REQUIRE(ops().act_backward(nullptr, act, y.dl(), 1, dy.dl(), dx_out.dl()) == TSR_OK);
    // dx may alias dy.
    REQUIRE(ops().act_backward(nullptr, act, y.dl(), 1, dy.dl(), dy.dl()) == TSR_OK);
    for (size_t i = 0; i < 100; i++) {
      INFO("act " << act << " x " << x.v[i]);
      REQUIRE(close(dx_out.v[i], dx_in.v[i], 1e-5));
      REQUIRE(dy.v[i] == dx_out.v[i]);
    }
  }
}

TEST_CASE("act_backward edge cases and errors", "[cpu_ops]") {
  F32 x({4}), dy({4}, 1.0f), dx({4});
  x.v = {60.0f, -60.0f, 1e20f, -1e20f};
  REQUIRE(ops().act_backward(nullptr, TSR_ACT_GELU, x.dl(), 0, dy.dl(), dx.dl()) == TSR_OK);
  CHECK(dx.v[0] == 1.0f);
  CHECK(dx.v[1] == 0.0f);
  CHECK(dx.v[2] == 1.0f);
  CHECK(dx.v[3] == 0.0f);
  CHECK(ops().act_backward(nullptr, TSR_ACT_GELU, x.dl(), 1, dy.dl(), dx.dl()) == TSR_ERR_INVALID);
  CHECK(ops().act_backward(nullptr, TSR_ACT_RELU, x.dl(), 2, dy.dl(), dx.dl()) == TSR_ERR_INVALID);
  CHECK(ops().act_backward(nullptr, 9, x.dl(), 0, dy.dl(), dx.dl()) == TSR_ERR_INVALID);
  F32 short_dx({3});
  CHECK(ops().act_backward(nullptr, TSR_ACT_TANH, x.dl(), 0, dy.dl(), short_dx.dl()) ==
        TSR_ERR_INVALID);
}

// ---------------------------------------------------------------------------
// cross_entropy

TEST_CASE("cross_entropy matches the reference, with ignored rows", "[cpu_ops]") {
  const int64_t rows = 7, cols = 10;
  F32 logits({rows, cols}), dlogits({rows, cols}, 123.0f);
  randomize(logits, 900, -3.0f, 3.0f);
  I32 targets({rows});
  targets.v = {3, -1, 0, 9, -100, 5, 5};
  const float gs = 0.25f;
  double loss = -1;
  int64_t count = -1, correct = -1;
  REQUIRE(ops().cross_entropy(nullptr, logits.dl(), targets.dl(), 0, gs, dlogits.dl(), &loss,
                              &count, &correct) == TSR_OK);
  const CeRef ref = ref_ce(logits.v, targets.v, rows, cols, cols);
  CHECK(count == 5);
  CHECK(count == ref.count);
  CHECK(correct == ref.correct);
  CHECK(close(loss, ref.loss, 1e-6));
  for (int64_t i = 0; i < rows * cols; i++) {
    INFO("element " << i);
    REQUIRE(std::fabs(dlogits.v[i] - gs * ref.grad[i]) <= 1e-6);
  }
  for (int64_t j = 0; j < cols; j++) CHECK(dlogits.v[1 * cols + j] == 0.0f);  // ignored row
}

TEST_CASE("cross_entropy gradient matches finite differences of its loss", "[cpu_ops]") {
  const int64_t rows = 3, cols = 6;
  F32 logits({rows, cols}), dlogits({rows, cols});
  randomize(logits, 901);
  I32 targets({rows});
  targets.v = {1, 4, 0};
  double loss;
  int64_t count;
  REQUIRE(ops().cross_entropy(nullptr, logits.dl(), targets.dl(), 0, 1.0f, dlogits.dl(), &loss,
                              &count, nullptr) == TSR_OK);
  auto loss_at = [&](int64_t i, float v) {
    F32 l2 = logits;
    l2.v[i] = v;
    double s;
    int64_t c;
    REQUIRE(ops().cross_entropy(nullptr, l2.dl(), targets.dl(), 0, 1.0f, nullptr, &s, &c,
                                nullptr) == TSR_OK);
    return s;
  };
  for (int64_t i = 0; i < rows * cols; i++) {
    const float x = logits.v[i], xp = x + 1e-2f, xm = x - 1e-2f;
    const double fd = (loss_at(i, xp) - loss_at(i, xm)) / (double(xp) - double(xm));
    INFO("element " << i);
    REQUIRE(std::fabs(dlogits.v[i] - fd) <= 1e-4);
  }
}

TEST_CASE("cross_entropy excludes padding columns", "[cpu_ops]") {
  const int64_t rows = 4, cols = 8, valid = 5;
  F32 logits({2, 2, cols}), dlogits({2, 2, cols}, 123.0f);  // stale values must be overwritten
  randomize(logits, 902);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = valid; j < cols; j++) logits.v[r * cols + j] = 100.0f;  // would win argmax
  I32 targets({2, 2});
  targets.v = {0, 4, 2, -1};
  double loss;
  int64_t count, correct;
  REQUIRE(ops().cross_entropy(nullptr, logits.dl(), targets.dl(), valid, 1.0f, dlogits.dl(), &loss,
                              &count, &correct) == TSR_OK);
  const CeRef ref = ref_ce(logits.v, targets.v, rows, cols, valid);
  CHECK(count == 3);
  CHECK(correct == ref.correct);
  CHECK(close(loss, ref.loss, 1e-6));
  for (int64_t r = 0; r < rows; r++) {
    double row_sum = 0;
    for (int64_t j = 0; j < cols; j++) {
      INFO("row " << r << " col " << j);
      REQUIRE(std::fabs(dlogits.v[r * cols + j] - ref.grad[r * cols + j]) <= 1e-6);
      if (j >= valid) REQUIRE(dlogits.v[r * cols + j] == 0.0f);
      row_sum += dlogits.v[r * cols + j];
    }
    CHECK(std::fabs(row_sum) < 1e-6);  // softmax - onehot sums to zero
  }
}

TEST_CASE("cross_entropy rejects targets past the valid classes", "[cpu_ops]") {
  F32 logits({3, 8});
  randomize(logits, 903);
  const std::vector<float> before = logits.v;
  I32 targets({3});
  double loss;
  int64_t count;
  targets.v = {0, 5, 1};  // 5 is a padding column when valid_classes = 5
  CHECK(ops().cross_entropy(nullptr, logits.dl(), targets.dl(), 5, 1.0f, logits.dl(), &loss, &count,
                            nullptr) == TSR_ERR_INVALID);
  CHECK(logits.v == before);  // nothing written through the alias
  targets.v = {0, 1, 8};
  CHECK(ops().cross_entropy(nullptr, logits.dl(), targets.dl(), 0, 1.0f, nullptr, &loss, &count,
                            nullptr) == TSR_ERR_INVALID);
  targets.v = {0, 1, 2};
  CHECK(ops().cross_entropy(nullptr, logits.dl(), targets.dl(), 9, 1.0f, nullptr, &loss, &count,
                            nullptr) == TSR_ERR_INVALID);
  I32 short_targets({2});
  CHECK(ops().cross_entropy(nullptr, logits.dl(), short_targets.dl(), 0, 1.0f, nullptr, &loss,
                            &count, nullptr) == TSR_ERR_INVALID);
  F32 float_targets({3});
  CHECK(ops().cross_entropy(nullptr, logits.dl(), float_targets.dl(), 0, 1.0f, nullptr, &loss,
                            &count, nullptr) == TSR_ERR_UNSUPPORTED);
  F32 wrong_grad({3, 7});
  CHECK(ops().cross_entropy(nullptr, logits.dl(), targets.dl(), 0, 1.0f, wrong_grad.dl(), &loss,
                            &count, nullptr) == TSR_ERR_INVALID);
  CHECK(ops().cross_entropy(nullptr, logits.dl(), targets.dl(), 0, 1.0f, nullptr, nullptr, &count,
                            nullptr) == TSR_ERR_INVALID);
}

TEST_CASE("cross_entropy in place, with ties and large logits", "[cpu_ops]") {
  F32 logits({4, 4});
  logits.v = {1,    3,    3,   0,       // tie between columns 1 and 2: the first wins,
              1,    3,    3,   0,       // so a target of 2 is not counted correct
              1,    3,    3,   0,       //
              1000, 1001, 999, -1000};  // exp would overflow without the max shift
  I32 targets({4});
  targets.v = {1, 2, 1, 1};
  const CeRef ref = ref_ce(logits.v, targets.v, 4, 4, 4);
  double loss;
  int64_t count, correct;
  REQUIRE(ops().cross_entropy(nullptr, logits.dl(), targets.dl(), 0, 2.0f, logits.dl(), &loss,
                              &count, &correct) == TSR_OK);
  CHECK(std::isfinite(loss));
  CHECK(close(loss, ref.loss, 1e-6));
  CHECK(count == 4);
  CHECK(correct == 3);
  for (int i = 0; i < 16; i++) {
    INFO("element " << i);
    REQUIRE(std::fabs(logits.v[i] - 2.0 * ref.grad[i]) <= 1e-6);
  }
}

// ---------------------------------------------------------------------------
// element-wise helpers

TEST_CASE("fill, copy, axpy and scale", "[cpu_ops]") {
  F32 x({2, 3}), y({6}), s({});  // s is 0-D: one element
  REQUIRE(ops().fill(nullptr, x.dl(), 2.5f) == TSR_OK);
  for (float e : x.v) CHECK(e == 2.5f);
  REQUIRE(ops().fill(nullptr, s.dl(), -1.0f) == TSR_OK);
  CHECK(s.v[0] == -1.0f);

  randomize(x, 1000);
  REQUIRE(ops().copy(nullptr, x.dl(), y.dl()) == TSR_OK);
  CHECK(y.v == x.v);

  const std::vector<float> y0 = y.v;
  REQUIRE(ops().axpy(nullptr, -0.5f, x.dl(), y.dl()) == TSR_OK);
  for (size_t i = 0; i < 6; i++) CHECK(y.v[i] == Approx(0.5 * y0[i]).margin(1e-7));

  REQUIRE(ops().scale(nullptr, 3.0f, y.dl()) == TSR_OK);
  for (size_t i = 0; i < 6; i++) CHECK(y.v[i] == Approx(1.5 * y0[i]).margin(1e-6));

  F32 z({7});
  CHECK(ops().copy(nullptr, x.dl(), z.dl()) == TSR_ERR_INVALID);
  CHECK(ops().axpy(nullptr, 1.0f, x.dl(), z.dl()) == TSR_ERR_INVALID);
  I32 xi({6});
  CHECK(ops().fill(nullptr, xi.dl(), 0.0f) == TSR_ERR_UNSUPPORTED);
  DLTensor *yd = y.dl();
  yd->device = DLDevice{kDLCUDA, 0};
  CHECK(ops().scale(nullptr, 1.0f, yd) == TSR_ERR_UNSUPPORTED);
}

TEST_CASE("sum_squares accumulates in double", "[cpu_ops]") {
  F32 x({100003});
  randomize(x, 1001, -1.0f, 1.0f);
  x.v[7] = 1e4f;  // a large term next to many small ones
  double want = 0;
  for (float e : x.v) want += double(e) * double(e);
  double got = -1;
  REQUIRE(ops().sum_squares(nullptr, x.dl(), &got) == TSR_OK);
  CHECK(std::fabs(got - want) <= 1e-12 * want);

  F32 empty({0});
  REQUIRE(ops().sum_squares(nullptr, empty.dl(), &got) == TSR_OK);
  CHECK(got == 0.0);
  CHECK(ops().sum_squares(nullptr, x.dl(), nullptr) == TSR_ERR_INVALID);
}

}  // namespace unit_test_cpu_ops
