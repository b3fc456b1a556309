// The CUDA ops table against the CPU ops (float32, on the same values) and,
// for the ABI 1.1 entries, against references written out here in double.
// bfloat16 and float16 runs round their inputs to the dtype first, so the
// reference computes on exactly the values the GPU saw; the tolerances then
// only cover the output's rounding and the fp32 accumulation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <tessera/ops.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/cuda_ops.hpp"
#include "cuda/device.hpp"
#include "host/host.hpp"
#include "ops/cpu_ops.hpp"

namespace {

using tessera::cuda::device_alloc;
using tessera::cuda::device_free;

const tsr_ops &gpu() {
  return *tessera::cuda_ops();
}
const tsr_ops &cpu() {
  return *tessera::cpu_ops();
}

// A host for the error messages the ops report.
tessera::Host &host() {
  static tessera::Host h{tessera::Host::RunFacts{}};
  return h;
}
tsr_host_ctx *ctx() {
  return host().ctx();
}
std::string last_error() {
  return host().last_error();
}

// Fails with the op's own message when a call that should work does not.
#define REQUIRE_OK(call)                                        \
  do {                                                          \
    host().clear_error();                                       \
    const tsr_status s_ = (call);                               \
    INFO(#call << " -> status " << s_ << ": " << last_error()); \
    REQUIRE(s_ == TSR_OK);                                      \
  } while (0)

// ---------------------------------------------------------------------------
// dtypes

enum class Dt { F32, BF16, F16, I32 };
const Dt kFloatDts[] = {Dt::F32, Dt::BF16, Dt::F16};

const char *name(Dt d) {
  switch (d) {
    case Dt::F32:
      return "float32";
    case Dt::BF16:
      return "bfloat16";
    case Dt::F16:
      return "float16";
    default:
      return "int32";
  }
}
DLDataType dl_type(Dt d) {
  switch (d) {
    case Dt::F32:
      return {kDLFloat, 32, 1};
    case Dt::BF16:
      return {kDLBfloat, 16, 1};
    case Dt::F16:
      return {kDLFloat, 16, 1};
    default:
      return {kDLInt, 32, 1};
  }
}
size_t size_of(Dt d) {
  return d == Dt::BF16 || d == Dt::F16 ? 2 : 4;
}

// The value a float becomes when stored as d (round to nearest even).
float round_to(Dt d, float x) {
  switch (d) {
    case Dt::BF16:
      return __bfloat162float(__float2bfloat16_rn(x));
    case Dt::F16:
      return __half2float(__float2half_rn(x));
    default:
      return x;
  }
}
std::vector<float> rounded(Dt d, std::vector<float> v) {
  for (float &x : v) x = round_to(d, x);
  return v;
}

// Relative tolerance of a result stored as d.
double tol(Dt d) {
  return d == Dt::F32 ? 1e-5 : (d == Dt::BF16 ? 1e-2 : 2e-3);
}

std::string shape_str(const std::vector<int64_t> &s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); i++) {
    if (i) r += ",";
    r += std::to_string(s[i]);
  }
  return r + "]";
}

int64_t numel_of(const std::vector<int64_t> &s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// ---------------------------------------------------------------------------
// Tensors: owned memory on the GPU (kDLCUDA), in pinned host memory
// (kDLCUDAHost) or in plain host memory (kDLCPU).

struct Tensor {
  std::vector<int64_t> shape;
  Dt dt;
  int device_type;
  void *data = nullptr;
  size_t bytes = 0;
  DLTensor t{};

  Tensor(std::vector<int64_t> s, Dt d, int type = kDLCUDA)
      : shape(std::move(s)), dt(d), device_type(type) {
    bytes = static_cast<size_t>(numel_of(shape)) * size_of(dt);
    const size_t b = bytes ? bytes : 1;
    if (type == kDLCUDA) {
      data = device_alloc(b);
    } else if (type == kDLCUDAHost) {
      data = tessera::cuda::pinned_alloc(b);
    } else {
      data = std::malloc(b);
    }
  }
  ~Tensor() {
    if (device_type == kDLCUDA) {
      device_free(data);
    } else if (device_type == kDLCUDAHost) {
      tessera::cuda::pinned_free(data);
    } else {
      std::free(data);
    }
  }
  Tensor(const Tensor &) = delete;
  Tensor &operator=(const Tensor &) = delete;

  int64_t numel() const { return numel_of(shape); }
  // Rebuilt on every call, so a test may break a field on purpose.
  DLTensor *dl() {
    t.data = data;
    t.device = DLDevice{static_cast<DLDeviceType>(device_type),
                        device_type == kDLCUDA ? tessera::cuda::current_device() : 0};
    t.ndim = static_cast<int>(shape.size());
    t.dtype = dl_type(dt);
    t.shape = shape.data();
    t.strides = nullptr;
    t.byte_offset = 0;
    return &t;
  }
  std::string desc() const {
    return std::string(name(dt)) + shape_str(shape) + " on device type " +
           std::to_string(device_type);
  }

  void put_bytes(const void *src) {
    if (!bytes) return;
    if (device_type == kDLCUDA) {
      REQUIRE(cudaMemcpy(data, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
    } else {
      std::memcpy(data, src, bytes);
    }
  }
  void get_bytes(void *dst) const {
    if (!bytes) return;
    tessera::cuda::synchronize();
    if (device_type == kDLCUDA) {
      REQUIRE(cudaMemcpy(dst, data, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    } else {
      std::memcpy(dst, data, bytes);
    }
  }

  // Stores v converted to the dtype (which rounds: pass rounded values to
  // know exactly what was stored).
  void set(const std::vector<float> &v) {
    REQUIRE(static_cast<int64_t>(v.size()) == numel());
    std::vector<unsigned char> raw(bytes);
    for (size_t i = 0; i < v.size(); i++) {
      if (dt == Dt::F32) {
        std::memcpy(&raw[4 * i], &v[i], 4);
      } else if (dt == Dt::BF16) {
        const __nv_bfloat16 h = __float2bfloat16_rn(v[i]);
        std::memcpy(&raw[2 * i], &h, 2);
      } else {
        const __half h = __float2half_rn(v[i]);
        std::memcpy(&raw[2 * i], &h, 2);
      }
    }
    put_bytes(raw.data());
  }
  void set_i32(const std::vector<int32_t> &v) {
    REQUIRE(static_cast<int64_t>(v.size()) == numel());
    put_bytes(v.data());
  }
  std::vector<float> get() const {
    std::vector<unsigned char> raw(bytes);
    get_bytes(raw.data());
    std::vector<float> v(static_cast<size_t>(numel()));
    for (size_t i = 0; i < v.size(); i++) {
      if (dt == Dt::F32) {
        std::memcpy(&v[i], &raw[4 * i], 4);
      } else if (dt == Dt::BF16) {
        __nv_bfloat16 h;
        std::memcpy(&h, &raw[2 * i], 2);
        v[i] = __bfloat162float(h);
      } else {
        __half h;
        std::memcpy(&h, &raw[2 * i], 2);
        v[i] = __half2float(h);
      }
    }
    return v;
  }
};

std::vector<float> randn(size_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float &x : v) x = u(rng);
  return v;
}

// A float32 host tensor holding v, for the CPU ops.
struct Cpu : Tensor {
  Cpu(std::vector<int64_t> s, const std::vector<float> &v) : Tensor(std::move(s), Dt::F32, kDLCPU) {
    set(v);
  }
};

// A device tensor of dtype d holding v rounded to d; `vals` keeps the
// rounded values for the reference.
struct Gpu : Tensor {
  std::vector<float> vals;
  Gpu(std::vector<int64_t> s, Dt d, const std::vector<float> &v)
      : Tensor(std::move(s), d), vals(rounded(d, v)) {
    set(vals);
  }
};

// Norm-relative error plus the worst element, with a message naming the
// case; max-abs is held to a few times the relative tolerance of the
// largest magnitude.
void expect_close(const std::string &what, const std::vector<float> &got,
                  const std::vector<double> &want, double rel_tol) {
  REQUIRE(got.size() == want.size());
  double num = 0, den = 0, worst = 0, scale = 0;
  size_t at = 0;
  bool finite = true;
  for (size_t i = 0; i < got.size(); i++) {
    const double d = got[i] - want[i];
    finite = finite && std::isfinite(got[i]);
    num += d * d;
    den += want[i] * want[i];
    scale = std::max(scale, std::fabs(want[i]));
    if (std::fabs(d) > worst) worst = std::fabs(d), at = i;
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  INFO(what << ": rel err " << rel << " (tol " << rel_tol << "), max abs err " << worst << " at "
            << at << " (got " << (got.empty() ? 0.0 : got[at]) << ", want "
            << (want.empty() ? 0.0 : want[at]) << "), max |want| " << scale);
  CHECK(finite);
  CHECK(rel <= rel_tol);
  CHECK(worst <= 4 * rel_tol * std::max(1.0, scale));
}
void expect_close(const std::string &what, const std::vector<float> &got,
                  const std::vector<float> &want, double rel_tol) {
  expect_close(what, got, std::vector<double>(want.begin(), want.end()), rel_tol);
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
const char *act_name(tsr_activation a) {
  static const char *names[] = {"none", "relu", "gelu", "tanh"};
  return names[a];
}
const tsr_activation kActs[] = {TSR_ACT_NONE, TSR_ACT_RELU, TSR_ACT_GELU, TSR_ACT_TANH};

std::string case_name(const char *op, Dt d, const std::vector<int64_t> &shape,
                      const std::string &extra = "") {
  return std::string(op) + " " + name(d) + shape_str(shape) + (extra.empty() ? "" : " " + extra);
}

}  // namespace

// ===========================================================================
// matmul

TEST_CASE("cuda matmul matches the CPU for every dtype and transpose", "[cuda][ops]") {
  struct Shape {
    int64_t m, k, n;
  };
  for (Dt d : kFloatDts) {
    for (Shape sh : {Shape{64, 96, 80}, Shape{33, 17, 45}, Shape{1, 8, 1}}) {
      for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
          for (float beta : {0.0f, 1.0f}) {
            const std::vector<int64_t> as =
                ta ? std::vector<int64_t>{sh.k, sh.m} : std::vector<int64_t>{sh.m, sh.k};
            const std::vector<int64_t> bs =
                tb ? std::vector<int64_t>{sh.n, sh.k} : std::vector<int64_t>{sh.k, sh.n};
            Gpu a(as, d, randn(sh.m * sh.k, 1)), b(bs, d, randn(sh.k * sh.n, 2));
            Gpu c({sh.m, sh.n}, d, randn(sh.m * sh.n, 3));
            Cpu ca(as, a.vals), cb(bs, b.vals), cc({sh.m, sh.n}, c.vals);
            REQUIRE_OK(gpu().matmul(ctx(), a.dl(), ta, b.dl(), tb, c.dl(), 0.7f, beta));
            REQUIRE_OK(cpu().matmul(ctx(), ca.dl(), ta, cb.dl(), tb, cc.dl(), 0.7f, beta));
            expect_close(case_name("matmul", d, {sh.m, sh.k, sh.n},
                                   "ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                                       " beta=" + std::to_string(beta)),
                         c.get(), cc.get(), tol(d));
          }
        }
      }
    }
  }
}

TEST_CASE("cuda matmul: a of more dims, float32 c from bf16 inputs, k = 0", "[cuda][ops]") {
  // a [2, 12, 16] is the 24 x 16 matrix.
  Gpu a({2, 12, 16}, Dt::BF16, randn(2 * 12 * 16, 4)), b({16, 8}, Dt::BF16, randn(16 * 8, 5));
  Gpu c({2, 12, 8}, Dt::F32, randn(2 * 12 * 8, 6));
  Cpu ca({24, 16}, a.vals), cb({16, 8}, b.vals), cc({24, 8}, c.vals);
  REQUIRE_OK(gpu().matmul(ctx(), a.dl(), 0, b.dl(), 0, c.dl(), 1.0f, 1.0f));
  REQUIRE_OK(cpu().matmul(ctx(), ca.dl(), 0, cb.dl(), 0, cc.dl(), 1.0f, 1.0f));
  expect_close("matmul bf16 x bf16 -> float32 c, beta=1", c.get(), cc.get(), 1e-5);

  // k = 0: c = beta * c.
  Gpu a0({4, 0}, Dt::F32, {}), b0({0, 5}, Dt::F32, {}), c0({4, 5}, Dt::F32, randn(20, 7));
  REQUIRE_OK(gpu().matmul(ctx(), a0.dl(), 0, b0.dl(), 0, c0.dl(), 1.0f, 0.5f));
  std::vector<double> want;
  for (float v : c0.vals) want.push_back(0.5 * v);
  expect_close("matmul k=0 beta=0.5", c0.get(), want, 1e-6);
  REQUIRE_OK(gpu().matmul(ctx(), a0.dl(), 0, b0.dl(), 0, c0.dl(), 1.0f, 0.0f));
  expect_close("matmul k=0 beta=0", c0.get(), std::vector<double>(20, 0.0), 0);
}

TEST_CASE("cuda matmul rejects bad arguments with a message", "[cuda][ops][errors]") {
  Gpu a({4, 8}, Dt::BF16, randn(32, 1)), b({8, 3}, Dt::BF16, randn(24, 2)),
      c({4, 3}, Dt::BF16, randn(12, 3));
  Tensor ha({4, 8}, Dt::BF16, kDLCPU);
  host().clear_error();
  CHECK(gpu().matmul(ctx(), ha.dl(), 0, b.dl(), 0, c.dl(), 1, 0) == TSR_ERR_INVALID);
  CHECK_THAT(last_error(), Catch::Contains("matmul: a bfloat16[4,8] is on device type 1, "
                                           "expected CUDA"));
  Gpu bad_c({4, 4}, Dt::BF16, randn(16, 3));
  CHECK(gpu().matmul(ctx(), a.dl(), 0, b.dl(), 0, bad_c.dl(), 1, 0) == TSR_ERR_INVALID);
  CHECK_THAT(last_error(), Catch::Contains("matmul: c must be 4x3"));
  CHECK(gpu().matmul(ctx(), a.dl(), 1, b.dl(), 0, c.dl(), 1, 0) == TSR_ERR_INVALID);
  CHECK_THAT(last_error(), Catch::Contains("inner dimensions differ"));
  Gpu f16_b({8, 3}, Dt::F16, randn(24, 2));
  CHECK(gpu().matmul(ctx(), a.dl(), 0, f16_b.dl(), 0, c.dl(), 1, 0) == TSR_ERR_UNSUPPORTED);
  CHECK_THAT(last_error(), Catch::Contains("same dtype"));
  Tensor ia({4, 8}, Dt::I32);
  CHECK(gpu().matmul(ctx(), ia.dl(), 0, b.dl(), 0, c.dl(), 1, 0) == TSR_ERR_UNSUPPORTED);
  CHECK_THAT(last_error(), Catch::Contains("matmul: a must be float32, bfloat16 or float16"));
  CHECK(gpu().matmul(ctx(), nullptr, 0, b.dl(), 0, c.dl(), 1, 0) == TSR_ERR_INVALID);
  CHECK_THAT(last_error(), Catch::Contains("matmul: a is NULL"));
  CHECK(gpu().matmul(ctx(), a.dl(), 0, b.dl(), 0, a.dl(), 1, 0) != TSR_OK);
}

// ===========================================================================
// linear: against a double reference (the CPU table may lack linear)

TEST_CASE("cuda linear: every activation, with and without bias and pre", "[cuda][ops]") {
  struct Shape {
    int64_t m, k, n;
  };
  // n % 8 == 0 takes cuBLASLt's GELU_AUX for pre; 35 takes the fallback.
  for (Dt d : kFloatDts) {
    for (Shape sh : {Shape{48, 64, 72}, Shape{20, 30, 35}}) {
      for (int tb = 0; tb < 2; tb++) {
        for (tsr_activation act : kActs) {
          for (int with_bias = 0; with_bias < 2; with_bias++) {
            for (int with_pre = 0; with_pre < 2; with_pre++) {
              const std::vector<int64_t> bs =
                  tb ? std::vector<int64_t>{sh.n, sh.k} : std::vector<int64_t>{sh.k, sh.n};
              Gpu a({sh.m, sh.k}, d, randn(sh.m * sh.k, 11)),
                  b(bs, d, randn(sh.k * sh.n, 12, -0.5f, 0.5f));
              Gpu bias({sh.n}, d, randn(sh.n, 13));
              Tensor c({sh.m, sh.n}, d), pre({sh.m, sh.n}, d);
              const std::string what = case_name(
                  "linear", d, {sh.m, sh.k, sh.n},
                  std::string("act=") + act_name(act) + " tb=" + std::to_string(tb) +
                      " bias=" + std::to_string(with_bias) + " pre=" + std::to_string(with_pre));
              INFO(what);
              REQUIRE_OK(gpu().linear(ctx(), a.dl(), 0, b.dl(), tb, with_bias ? bias.dl() : nullptr,
                                      act, c.dl(), with_pre ? pre.dl() : nullptr));
              std::vector<double> want_pre(sh.m * sh.n), want(sh.m * sh.n);
              for (int64_t i = 0; i < sh.m; i++) {
                for (int64_t j = 0; j < sh.n; j++) {
                  double s = with_bias ? bias.vals[j] : 0.0;
                  for (int64_t p = 0; p < sh.k; p++)
                    s += double(a.vals[i * sh.k + p]) * b.vals[tb ? j * sh.k + p : p * sh.n + j];
                  want_pre[i * sh.n + j] = s;
                  // The GPU rounds pre to the dtype before the activation
                  // only on some paths; either is within the tolerance.
                  want[i * sh.n + j] = ref_act(act, s);
                }
              }
              expect_close(what + " c", c.get(), want, tol(d));
              if (with_pre) expect_close(what + " pre", pre.get(), want_pre, tol(d));
            }
          }
        }
      }
    }
  }
}

// ===========================================================================
// bias_act, bias_grad, activations

TEST_CASE("cuda bias_act matches the CPU", "[cuda][ops]") {
  for (Dt d : kFloatDts) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{37, 48}, {5, 7, 13}}) {
      const int64_t cols = shape.back(), n = numel_of(shape);
      for (tsr_activation act : kActs) {
        Gpu y(shape, d, randn(n, 21)), bias({cols}, d, randn(cols, 22));
        Cpu cy(shape, y.vals), cb({cols}, bias.vals);
        REQUIRE_OK(gpu().bias_act(ctx(), y.dl(), bias.dl(), act));
        REQUIRE_OK(cpu().bias_act(ctx(), cy.dl(), cb.dl(), act));
        expect_close(case_name("bias_act", d, shape, act_name(act)), y.get(), cy.get(), tol(d));
      }
    }
  }
}

TEST_CASE("cuda bias_grad matches the CPU and repeats bit for bit", "[cuda][ops]") {
  for (Dt d : kFloatDts) {
    for (std::vector<int64_t> shape :
         {std::vector<int64_t>{300, 40}, {129, 13}, {4, 1024, 64}, {1, 8}}) {
      const int64_t cols = shape.back(), n = numel_of(shape);
      Gpu dy(shape, d, randn(n, 31)), db({cols}, d, randn(cols, 32));
      Cpu cdy(shape, dy.vals), cdb({cols}, db.vals);
      REQUIRE_OK(gpu().bias_grad(ctx(), dy.dl(), db.dl()));
      REQUIRE_OK(cpu().bias_grad(ctx(), cdy.dl(), cdb.dl()));
      const std::vector<float> first = db.get();
      expect_close(case_name("bias_grad", d, shape), first, cdb.get(), tol(d));
      db.set(db.vals);
      REQUIRE_OK(gpu().bias_grad(ctx(), dy.dl(), db.dl()));
      CHECK(db.get() == first);
    }
  }
}

TEST_CASE("cuda act_forward and act_backward match the CPU, aliasing included", "[cuda][ops]") {
  for (Dt d : kFloatDts) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{33, 64}, {1001}}) {
      const int64_t n = numel_of(shape);
      for (tsr_activation act : kActs) {
        // forward, out of place and in place
        Gpu x(shape, d, randn(n, 41, -4, 4));
        Tensor y(shape, d);
        Cpu cx(shape, x.vals), cy(shape, std::vector<float>(n));
        REQUIRE_OK(gpu().act_forward(ctx(), act, x.dl(), y.dl()));
        REQUIRE_OK(cpu().act_forward(ctx(), act, cx.dl(), cy.dl()));
        expect_close(case_name("act_forward", d, shape, act_name(act)), y.get(), cy.get(), tol(d));
        REQUIRE_OK(gpu().act_forward(ctx(), act, x.dl(), x.dl()));
        expect_close(case_name("act_forward in place", d, shape, act_name(act)), x.get(), cy.get(),
                     tol(d));

        // backward from the input (and from the output for relu and tanh),
        // into a separate dx and into dy itself
        for (int from_output = 0; from_output < 2; from_output++) {
          if (from_output && act == TSR_ACT_GELU) continue;
          Gpu xin(shape, d, randn(n, 42, -4, 4));
          std::vector<float> src = xin.vals;
          if (from_output) {
            for (float &v : src) v = round_to(d, static_cast<float>(ref_act(act, v)));
          }
          Gpu xs(shape, d, src), dy(shape, d, randn(n, 43));
          Tensor dx(shape, d);
          Cpu cxs(shape, xs.vals), cdy(shape, dy.vals), cdx(shape, std::vector<float>(n));
          const std::string what =
              case_name("act_backward", d, shape,
                        std::string(act_name(act)) + " from_output=" + std::to_string(from_output));
          REQUIRE_OK(gpu().act_backward(ctx(), act, xs.dl(), from_output, dy.dl(), dx.dl()));
          REQUIRE_OK(cpu().act_backward(ctx(), act, cxs.dl(), from_output, cdy.dl(), cdx.dl()));
          const std::vector<float> want = cdx.get();
          expect_close(what, dx.get(), want, tol(d));
          REQUIRE_OK(gpu().act_backward(ctx(), act, xs.dl(), from_output, dy.dl(), dy.dl()));
          expect_close(what + " dx == dy", dy.get(), want, tol(d));
        }
      }
    }
  }
  Gpu x({8}, Dt::F32, randn(8, 1)), y({8}, Dt::BF16, randn(8, 1));
  CHECK(gpu().act_forward(ctx(), TSR_ACT_RELU, x.dl(), y.dl()) == TSR_ERR_UNSUPPORTED);
  CHECK_THAT(last_error(), Catch::Contains("same dtype"));
  CHECK(gpu().act_backward(ctx(), TSR_ACT_GELU, x.dl(), 1, x.dl(), x.dl()) == TSR_ERR_INVALID);
  CHECK(gpu().act_forward(ctx(), 7, x.dl(), x.dl()) == TSR_ERR_INVALID);
}

// ===========================================================================
// cross_entropy

TEST_CASE("cuda cross_entropy matches the CPU: padding, ignored rows, aliasing", "[cuda][ops]") {
  struct Case {
    int64_t rows, cols, valid;
  };
  for (Dt d : kFloatDts) {
    for (Case cs : {Case{33, 50, 45}, Case{16, 64, 0}, Case{8, 50304, 50257}, Case{3, 7, 0}}) {
      for (int alias = 0; alias < 2; alias++) {
        const std::vector<int64_t> shape{cs.rows, cs.cols};
        const int64_t V = cs.valid > 0 ? cs.valid : cs.cols;
        Gpu logits(shape, d, randn(cs.rows * cs.cols, 51, -6, 6));
        std::vector<int32_t> t(cs.rows);
        std::mt19937 rng(52);
        for (int64_t r = 0; r < cs.rows; r++)
          t[r] = r % 5 == 3 ? -1 : static_cast<int32_t>(rng() % V);
        if (cs.rows > 2) {  // a row whose argmax is its target
          int64_t best = 0;
          for (int64_t j = 1; j < V; j++)
            if (logits.vals[2 * cs.cols + j] > logits.vals[2 * cs.cols + best]) best = j;
          t[2] = static_cast<int32_t>(best);
        }
        Tensor targets({cs.rows}, Dt::I32), dl(shape, d);
        targets.set_i32(t);
        Tensor ctg({cs.rows}, Dt::I32, kDLCPU);
        ctg.set_i32(t);
        Cpu cl(shape, logits.vals), cdl(shape, std::vector<float>(cs.rows * cs.cols));
        double loss = 0, closs = 0;
        int64_t count = 0, ccount = 0, correct = 0, ccorrect = 0;
        const std::string what =
            case_name("cross_entropy", d, shape,
                      "valid=" + std::to_string(cs.valid) + " alias=" + std::to_string(alias));
        INFO(what);
        REQUIRE_OK(gpu().cross_entropy(ctx(), logits.dl(), targets.dl(), cs.valid, 0.5f,
                                       alias ? logits.dl() : dl.dl(), &loss, &count, &correct));
        REQUIRE_OK(cpu().cross_entropy(ctx(), cl.dl(), ctg.dl(), cs.valid, 0.5f, cdl.dl(), &closs,
                                       &ccount, &ccorrect));
        CHECK(count == ccount);
        CHECK(correct == ccorrect);
        CHECK(std::fabs(loss - closs) <= 1e-5 * std::fabs(closs) + 1e-6);
        expect_close(what + " dlogits", alias ? logits.get() : dl.get(), cdl.get(),
                     d == Dt::F32 ? 1e-5 : tol(d));
      }
    }
  }
}

TEST_CASE("cuda cross_entropy without dlogits, and a bad target writes nothing", "[cuda][ops]") {
  Gpu logits({4, 10}, Dt::BF16, randn(40, 61));
  Tensor targets({4}, Dt::I32);
  targets.set_i32({1, 2, 3, 4});
  double loss = 0;
  int64_t count = 0;
  REQUIRE_OK(gpu().cross_entropy(ctx(), logits.dl(), targets.dl(), 0, 1.0f, nullptr, &loss, &count,
                                 nullptr));
  CHECK(count == 4);
  CHECK(loss > 0);

  targets.set_i32({1, 2, 9, 4});
  const std::vector<float> before = logits.get();
  host().clear_error();
  CHECK(gpu().cross_entropy(ctx(), logits.dl(), targets.dl(), 8, 1.0f, logits.dl(), &loss, &count,
                            nullptr) == TSR_ERR_INVALID);
  CHECK_THAT(last_error(), Catch::Contains("row 2 has target 9 but only 8 valid classes"));
  CHECK(logits.get() == before);
}

// ===========================================================================
// fill, scale, axpy, sum_squares

TEST_CASE("cuda fill, scale, axpy and sum_squares", "[cuda][ops]") {
  for (Dt d : kFloatDts) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{1000003}, {3, 5}, {256, 64}}) {
      const int64_t n = numel_of(shape);
      Gpu y(shape, d, randn(n, 71));
      REQUIRE_OK(gpu().fill(ctx(), y.dl(), 1.25f));
      expect_close(case_name("fill", d, shape), y.get(), std::vector<double>(n, 1.25), 0);

      Gpu s(shape, d, randn(n, 72));
      Cpu cs(shape, s.vals);
      REQUIRE_OK(gpu().scale(ctx(), -0.3f, s.dl()));
      REQUIRE_OK(cpu().scale(ctx(), -0.3f, cs.dl()));
      expect_close(case_name("scale", d, shape), s.get(), cs.get(), tol(d));

      // axpy with x and y in this dtype, and x in this dtype into float32 y
      for (Dt yd : {d, Dt::F32}) {
        Gpu x(shape, d, randn(n, 73)), ay(shape, yd, randn(n, 74));
        Cpu cx(shape, x.vals), cy(shape, ay.vals);
        REQUIRE_OK(gpu().axpy(ctx(), 0.75f, x.dl(), ay.dl()));
        REQUIRE_OK(cpu().axpy(ctx(), 0.75f, cx.dl(), cy.dl()));
        expect_close(case_name("axpy", d, shape, std::string("into ") + name(yd)), ay.get(),
                     cy.get(), tol(yd));
      }

      Gpu q(shape, d, randn(n, 75));
      Cpu cq(shape, q.vals);
      double got = 0, got2 = 0, want = 0;
      REQUIRE_OK(gpu().sum_squares(ctx(), q.dl(), &got));
      REQUIRE_OK(cpu().sum_squares(ctx(), cq.dl(), &want));
      INFO(case_name("sum_squares", d, shape) << ": got " << got << ", want " << want);
      CHECK(std::fabs(got - want) <= 1e-10 * want);
      REQUIRE_OK(gpu().sum_squares(ctx(), q.dl(), &got2));
      CHECK(got2 == got);
    }
  }
  // An unaligned view (byte_offset of one element) takes the scalar path.
  Gpu x({17}, Dt::BF16, randn(17, 76));
  DLTensor *v = x.dl();
  int64_t sixteen = 16;
  v->shape = &sixteen;
  v->byte_offset = 2;
  double got = 0, want = 0;
  for (int i = 1; i < 17; i++) want += double(x.vals[i]) * x.vals[i];
  REQUIRE_OK(gpu().sum_squares(ctx(), v, &got));
  CHECK(std::fabs(got - want) <= 1e-12 * want);
}

// ===========================================================================
// copy and cast

TEST_CASE("cuda copy between every pair of host, pinned and device memory", "[cuda][ops]") {
  const int types[] = {kDLCPU, kDLCUDAHost, kDLCUDA};
  for (Dt d : {Dt::F32, Dt::BF16}) {
    for (int st : types) {
      for (int dt : types) {
        if (d != Dt::F32 && st != kDLCUDA && dt != kDLCUDA) continue;  // CPU ops: float32
        const std::vector<int64_t> shape{123, 7};
        const std::vector<float> v = rounded(d, randn(123 * 7, 81));
        Tensor src(shape, d, st), dst(shape, d, dt);
        src.set(v);
        INFO("copy " << src.desc() << " -> " << dst.desc());
        REQUIRE_OK(gpu().copy(ctx(), src.dl(), dst.dl()));
        // Pageable destinations are ready on return; the rest after a sync.
        if (dt != kDLCPU) tessera::cuda::synchronize();
        CHECK(dst.get() == v);
      }
    }
  }
  // Overlapping views of one device buffer: memmove semantics.
  Gpu buf({64}, Dt::F32, randn(64, 82));
  DLTensor src = *buf.dl(), dst = src;
  int64_t n = 48;
  src.shape = &n;
  dst.shape = &n;
  dst.byte_offset = 16 * sizeof(float);
  REQUIRE_OK(gpu().copy(ctx(), &src, &dst));
  std::vector<float> want = buf.vals;
  std::memmove(want.data() + 16, buf.vals.data(), 48 * sizeof(float));
  CHECK(buf.get() == want);

  Gpu a({8}, Dt::F32, randn(8, 83)), b({8}, Dt::BF16, randn(8, 83)), c({9}, Dt::F32, randn(9, 1));
  CHECK(gpu().copy(ctx(), a.dl(), b.dl()) == TSR_ERR_INVALID);
  CHECK_THAT(last_error(), Catch::Contains("differ in dtype"));
  CHECK(gpu().copy(ctx(), a.dl(), c.dl()) == TSR_ERR_INVALID);
  CHECK_THAT(last_error(), Catch::Contains("differ in element count"));
}

TEST_CASE("cuda cast between every pair of float dtypes rounds to nearest even", "[cuda][ops]") {
  std::vector<float> v = randn(1000, 91, -70000, 70000);
  for (size_t i = 0; i < 300; i++) v[i] = v[i] * 1e-4f;  // small ones too
  v[0] = 1.0f + 1.0f / 256;                              // a bf16 tie: rounds to even (1.0)
  v[1] = 65504.0f;
  for (Dt from : kFloatDts) {
    for (Dt to : kFloatDts) {
      Gpu x({10, 100}, from, v);
      Tensor y({1000}, to);
      INFO("cast " << name(from) << " -> " << name(to));
      REQUIRE_OK(gpu().cast(ctx(), x.dl(), y.dl()));
      std::vector<float> want = x.vals;
      for (float &e : want) e = round_to(to, e);
      CHECK(y.get() == want);
    }
  }
  Gpu x({8}, Dt::F32, randn(8, 1));
  Tensor y({9}, Dt::BF16);
  CHECK(gpu().cast(ctx(), x.dl(), y.dl()) == TSR_ERR_INVALID);
}

// ===========================================================================
// layernorm: against a double reference

TEST_CASE("cuda layernorm forward and backward", "[cuda][ops]") {
  const float eps = 1e-5f;
  for (Dt d : kFloatDts) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{37, 96}, {2, 5, 50}, {3, 768}}) {
      const int64_t C = shape.back(), rows = numel_of(shape) / C, n = rows * C;
      for (int alias = 0; alias < 2; alias++) {
        Gpu x(shape, d, randn(n, 101, -3, 3)), w({C}, d, randn(C, 102)), b({C}, d, randn(C, 103));
        Tensor y(shape, d), mean({rows}, Dt::F32), rstd({rows}, Dt::F32);
        const std::string what = case_name("layernorm", d, shape, alias ? "dx == dy" : "");
        INFO(what);
        REQUIRE_OK(gpu().layernorm_forward(ctx(), x.dl(), w.dl(), b.dl(), eps, y.dl(), mean.dl(),
                                           rstd.dl()));
        std::vector<double> wy(n), wm(rows), wr(rows), norm(n);
        for (int64_t r = 0; r < rows; r++) {
          double m = 0, v = 0;
          for (int64_t j = 0; j < C; j++) m += x.vals[r * C + j];
          m /= C;
          for (int64_t j = 0; j < C; j++) v += (x.vals[r * C + j] - m) * (x.vals[r * C + j] - m);
          v /= C;
          const double s = 1 / std::sqrt(v + eps);
          wm[r] = m, wr[r] = s;
          for (int64_t j = 0; j < C; j++) {
            norm[r * C + j] = (x.vals[r * C + j] - m) * s;
            wy[r * C + j] = norm[r * C + j] * w.vals[j] + b.vals[j];
          }
        }
        expect_close(what + " y", y.get(), wy, tol(d));
        expect_close(what + " mean", mean.get(), wm, 1e-5);
        expect_close(what + " rstd", rstd.get(), wr, 1e-5);

        // backward; dx, dweight, dbias accumulate into what they hold
        Gpu dy(shape, d, randn(n, 104)), dx(shape, d, randn(n, 105)), dw({C}, d, randn(C, 106)),
            db({C}, d, randn(C, 107));
        const std::vector<float> dx0 = alias ? dy.vals : dx.vals;
        REQUIRE_OK(gpu().layernorm_backward(ctx(), dy.dl(), x.dl(), w.dl(), mean.dl(), rstd.dl(),
                                            alias ? dy.dl() : dx.dl(), dw.dl(), db.dl()));
        // The reference uses the GPU's mean and rstd, as the op does.
        const std::vector<float> gm = mean.get(), gr = rstd.get();
        std::vector<double> wdx(n), wdw(dw.vals.begin(), dw.vals.end()),
            wdb(db.vals.begin(), db.vals.end());
        for (int64_t r = 0; r < rows; r++) {
          double ma = 0, mb = 0;
          for (int64_t j = 0; j < C; j++) {
            const double nv = (x.vals[r * C + j] - gm[r]) * double(gr[r]);
            const double dn = double(dy.vals[r * C + j]) * w.vals[j];
            ma += dn, mb += dn * nv;
            wdw[j] += dy.vals[r * C + j] * nv;
            wdb[j] += dy.vals[r * C + j];
          }
          ma /= C, mb /= C;
          for (int64_t j = 0; j < C; j++) {
            const double nv = (x.vals[r * C + j] - gm[r]) * double(gr[r]);
            const double dn = double(dy.vals[r * C + j]) * w.vals[j];
            wdx[r * C + j] = dx0[r * C + j] + gr[r] * (dn - ma - nv * mb);
          }
        }
        expect_close(what + " dx", alias ? dy.get() : dx.get(), wdx, tol(d));
        expect_close(what + " dweight", dw.get(), wdw, tol(d));
        expect_close(what + " dbias", db.get(), wdb, tol(d));
      }
    }
  }
}

// ===========================================================================
// embedding: against a double reference

TEST_CASE("cuda embedding forward and backward", "[cuda][ops]") {
  for (Dt d : kFloatDts) {
    for (int64_t C : {64, 13}) {
      const int64_t vocab = 50, rows = 300;
      std::vector<int32_t> ids(rows);
      std::mt19937 rng(111);
      for (auto &i : ids) i = static_cast<int32_t>(rng() % 20);  // many repeats
      ids[7] = vocab - 1;
      Tensor tids({3, 100}, Dt::I32);
      tids.set_i32(ids);
      Gpu table({vocab, C}, d, randn(vocab * C, 112));
      for (int acc = 0; acc < 2; acc++) {
        Gpu out({3, 100, C}, d, randn(rows * C, 113));
        const std::string what =
            case_name("embedding_forward", d, {vocab, C}, "accumulate=" + std::to_string(acc));
        REQUIRE_OK(gpu().embedding_forward(ctx(), tids.dl(), table.dl(), out.dl(), acc));
        std::vector<double> want(rows * C);
        for (int64_t i = 0; i < rows; i++)
          for (int64_t j = 0; j < C; j++)
            want[i * C + j] = table.vals[ids[i] * C + j] + (acc ? out.vals[i * C + j] : 0.0);
        expect_close(what, out.get(), want, tol(d));
      }
      Gpu dout({rows, C}, d, randn(rows * C, 114)), dtable({vocab, C}, d, randn(vocab * C, 115));
      REQUIRE_OK(gpu().embedding_backward(ctx(), tids.dl(), dout.dl(), dtable.dl()));
      std::vector<double> want(dtable.vals.begin(), dtable.vals.end());
      for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < C; j++) want[ids[i] * C + j] += dout.vals[i * C + j];
      const std::vector<float> first = dtable.get();
      expect_close(case_name("embedding_backward", d, {vocab, C}), first, want, tol(d));
      dtable.set(dtable.vals);
      REQUIRE_OK(gpu().embedding_backward(ctx(), tids.dl(), dout.dl(), dtable.dl()));
      CHECK(dtable.get() == first);  // deterministic

      // An id out of range fails and writes nothing.
      ids[5] = static_cast<int32_t>(vocab);
      tids.set_i32(ids);
      Gpu out({3, 100, C}, d, randn(rows * C, 116));
      host().clear_error();
      CHECK(gpu().embedding_forward(ctx(), tids.dl(), table.dl(), out.dl(), 0) == TSR_ERR_INVALID);
      CHECK_THAT(last_error(), Catch::Contains("row 5 holds id 50, outside [0, 50)"));
      CHECK(out.get() == out.vals);
      CHECK(gpu().embedding_backward(ctx(), tids.dl(), dout.dl(), dtable.dl()) == TSR_ERR_INVALID);
      CHECK(dtable.get() == first);
    }
  }
}

// ===========================================================================
// Routing: host tensors go to the CPU ops; mixes are errors

TEST_CASE("cuda ops forward host-memory calls to the CPU ops", "[cuda][ops]") {
  for (int type : {kDLCPU, kDLCUDAHost}) {
    Tensor x({10}, Dt::F32, type), y({10}, Dt::F32, type);
    x.set(randn(10, 121));
    y.set(randn(10, 122));
    const std::vector<float> xv = x.get(), yv = y.get();
    REQUIRE_OK(gpu().axpy(ctx(), 2.0f, x.dl(), y.dl()));
    std::vector<double> want(10);
    for (int i = 0; i < 10; i++) want[i] = double(yv[i]) + 2.0 * xv[i];
    expect_close("axpy on host type " + std::to_string(type), y.get(), want, 1e-6);
    double ss = 0;
    REQUIRE_OK(gpu().sum_squares(ctx(), x.dl(), &ss));
    CHECK(ss > 0);
  }
  Tensor hx({10}, Dt::F32, kDLCPU);
  Gpu dy({10}, Dt::F32, randn(10, 123));
  host().clear_error();
  CHECK(gpu().axpy(ctx(), 1.0f, hx.dl(), dy.dl()) == TSR_ERR_INVALID);
  CHECK_THAT(last_error(),
             Catch::Contains("axpy: x float32[10] is on device type 1, expected CUDA"));
  DLTensor odd = *dy.dl();
  odd.device.device_type = kDLOpenCL;
  CHECK(gpu().fill(ctx(), &odd, 0.0f) == TSR_ERR_UNSUPPORTED);
  CHECK_THAT(last_error(), Catch::Contains("fill: x"));
}

// ===========================================================================
// A benchmark, not run by default ([.]): the MLP of the target, 4 layers of
// 4096, batch 1024, bf16, ReLU as bench/mlp_gpu: forward (linear with the
// fused relu epilogue) and backward (act_backward from the output,
// bias_grad, and two matmuls per layer).

TEST_CASE("cuda mlp step benchmark", "[.][bench]") {
  const int64_t B = 1024, H = 4096, L = 4;
  const Dt d = Dt::BF16;
  std::vector<std::unique_ptr<Tensor>> w, bias, dw, db, act;
  auto make = [&](std::vector<int64_t> s) {
    auto t = std::make_unique<Tensor>(std::move(s), d);
    REQUIRE_OK(gpu().fill(ctx(), t->dl(), 0.01f));
    return t;
  };
  act.push_back(make({B, H}));
  for (int l = 0; l < L; l++) {
    w.push_back(make({H, H}));
    bias.push_back(make({H}));
    dw.push_back(make({H, H}));
    db.push_back(make({H}));
    act.push_back(make({B, H}));
  }
  auto g1 = make({B, H}), g2 = make({B, H});
  auto step = [&] {
    for (int l = 0; l < L; l++)
      REQUIRE_OK(gpu().linear(ctx(), act[l]->dl(), 0, w[l]->dl(), 1, bias[l]->dl(), TSR_ACT_RELU,
                              act[l + 1]->dl(), nullptr));
    for (int l = L - 1; l >= 0; l--) {
      REQUIRE_OK(gpu().act_backward(ctx(), TSR_ACT_RELU, act[l + 1]->dl(), 1, g1->dl(), g1->dl()));
      REQUIRE_OK(gpu().bias_grad(ctx(), g1->dl(), db[l]->dl()));
      REQUIRE_OK(gpu().matmul(ctx(), g1->dl(), 1, act[l]->dl(), 0, dw[l]->dl(), 1.0f, 1.0f));
      REQUIRE_OK(gpu().matmul(ctx(), g1->dl(), 0, w[l]->dl(), 0, g2->dl(), 1.0f, 0.0f));
      std::swap(g1, g2);
    }
  };
  for (int i = 0; i < 3; i++) step();
  tessera::cuda::synchronize();
  const int iters = 20;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; i++) step();
  tessera::cuda::synchronize();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double flops = 3.0 * 2 * B * H * H * L;
  std::printf("mlp fwd+bwd (B=%ld H=%ld L=%ld bf16, relu): %.3f ms, %.1f TFLOP/s\n", long(B),
              long(H), long(L), 1e3 * s / iters, flops * iters / s / 1e12);
}
