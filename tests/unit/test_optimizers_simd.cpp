// The CPU step of "adam" and "adamw" on each instruction set (`cpu_kernel`:
// scalar, avx2, avx512) gives the same bits: master, both moments and the
// compute copy, over random data with special values, every gradient and
// copy dtype, segments with and without decay, a copy long enough to be
// streamed and misaligned so that the scalar loop does its ends, and every
// 16-bit pattern through the conversions. A kernel this CPU cannot run is
// skipped with a warning (AVX-512 on most build machines).
#include <tessera/optimizer.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tessera/cpp/half.hpp>
#include <tessera/cpp/optimizer.hpp>
#include <tessera/cpp/plugin.hpp>
#include <vector>

#include "config/config.hpp"
#include "optimizers_support.hpp"
#include "support/fixture.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_optimizers_simd {

using namespace tessera::test::optimizers_support;
using tessera::sdk::optim::Elem;

namespace {

uint32_t bits32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
float from_bits32(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

DLDataType dtype_of(Elem e) {
  return e == Elem::bf16  ? DLDataType{kDLBfloat, 16, 1}
         : e == Elem::f16 ? DLDataType{kDLFloat, 16, 1}
                          : DLDataType{kDLFloat, 32, 1};
}

// Whether this CPU runs `kernel` (create refuses one it cannot run).
bool kernel_runs(Fixture &f, const std::string &kernel) {
  const auto *vt = f.vtable<tsr_optimizer_vtable>("optimizer", "adam");
  void *self = nullptr;
  const tsr_status s = vt->create(
      f.host.table(), f.config("optimizer", "adam", "cpu_kernel = \"" + kernel + "\""), &self);
  if (self) vt->destroy(self);
  if (s == TSR_ERR_UNSUPPORTED) {
    WARN("cpu_kernel = " << kernel << ": this CPU cannot run it; skipped");
    return false;
  }
  INFO(f.host.last_error());
  REQUIRE(s == TSR_OK);
  return true;
}

// One run: the optimizer steps `steps` times over the same inputs; what it
// leaves behind.
struct Inputs {
  std::vector<float> p0;
  std::vector<uint8_t> grads;  // in grads_elem
  Elem grads_elem = Elem::f32;
  Elem out_elem = Elem::none;
  std::vector<tsr_segment> segments;
  int steps = 3;
};
struct Result {
  std::vector<float> p, m, v;
  std::vector<uint8_t> out;  // the compute copy's bytes
};

Result run(Fixture &f, const std::string &plugin, const std::string &toml,
           const std::string &kernel, const Inputs &in) {
  const size_t n = in.p0.size(), ob = tessera::sdk::optim::elem_bytes(in.out_elem);
  Optimizer opt(f, plugin, toml + "\ncpu_kernel = \"" + kernel + "\"", n);
  Result r;
  r.p = in.p0;
  // The copy starts 3 elements into its buffer: never 64-byte aligned, so
  // a streamed copy has a scalar head.
  std::vector<uint8_t> buf((n + 64) * (ob ? ob : 1), 0);
  void *out = ob ? buf.data() + 3 * ob : nullptr;
  for (int t = 1; t <= in.steps; ++t) {
    const double lr = 1e-3 * t, scale = t == 2 ? 0.5 : 1.0;
    REQUIRE(opt.step_raw(r.p, in.grads.data(), dtype_of(in.grads_elem), in.segments, lr, t, scale,
                         out, dtype_of(in.out_elem)) == TSR_OK);
  }
  r.m = opt.state(0);
  r.v = opt.state(1);
  if (ob) r.out.assign(buf.data() + 3 * ob, buf.data() + (3 + n) * ob);
  return r;
}

bool is_nan_bits(const uint8_t *x, Elem e) {
  uint16_t h;
  std::memcpy(&h, x, 2);
  if (e == Elem::bf16) return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu);
  if (e == Elem::f16) return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
  float y;
  std::memcpy(&y, x, 4);
  return std::isnan(y);
}

// Elements where `got` differs from `want`, bit for bit. With
// `nan_any_payload`, where want's master is NaN only NaN-ness must agree:
// where two different NaNs meet in one addition, x86 keeps the first
// operand's, and the compiler orders the operands of a commutative
// operation as it likes (in the scalar loop as in the vector code).
size_t mismatches(const Result &want, const Result &got, Elem oe, bool nan_any_payload,
                  std::string &first) {
  size_t bad = 0;
  const size_t ob = tessera::sdk::optim::elem_bytes(oe);
  auto note = [&](const char *what, size_t i) {
    if (bad++ == 0) first = std::string(what) + " element " + std::to_string(i);
  };
  for (size_t i = 0; i < want.p.size(); ++i) {
    const float *w[] = {&want.p[i], &want.m[i], &want.v[i]};
    const float *g[] = {&got.p[i], &got.m[i], &got.v[i]};
    const char *names[] = {"master", "exp_avg", "exp_avg_sq"};
    for (int a = 0; a < 3; ++a) {
      const bool same =
          nan_any_payload && std::isnan(*w[a]) ? std::isnan(*g[a]) : bits32(*w[a]) == bits32(*g[a]);
      if (!same) note(names[a], i);
    }
    if (!ob) continue;
    const uint8_t *wo = want.out.data() + i * ob, *go = got.out.data() + i * ob;
    const bool same = nan_any_payload && std::isnan(want.p[i])
                          ? is_nan_bits(wo, oe) && is_nan_bits(go, oe)
                          : std::memcmp(wo, go, ob) == 0;
    if (!same) note("compute copy", i);
  }
  return bad;
}

// Random floats over many binades, both signs, with the values that take
// other paths sprinkled in: zeros, subnormals, huge (g * g overflows),
// infinities, NaN.
std::vector<float> random_floats(std::mt19937 &rng, size_t n, int lo_exp, int hi_exp) {
  std::uniform_int_distribution<int> ex(lo_exp, hi_exp), special(0, 199);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  const float inf = INFINITY;
  const float odd[] = {0.0f, -0.0f, 1e-40f, -3e-39f, 1e30f, -2e25f, inf, -inf, NAN, 65519.0f};
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    const int s = special(rng);
    x[i] = s < 10 ? odd[s] : std::ldexp(mant(rng), ex(rng)) * ((rng() & 1) ? -1.0f : 1.0f);
  }
  return x;
}

std::vector<uint8_t> encode(const std::vector<float> &x, Elem e) {
  const size_t b = tessera::sdk::optim::elem_bytes(e);
  std::vector<uint8_t> out(x.size() * b);
  for (size_t i = 0; i < x.size(); ++i) {
    uint16_t h = 0;
    if (e == Elem::bf16) h = tessera::sdk::float_to_bf16(x[i]);
    if (e == Elem::f16) h = tessera::sdk::float_to_f16(x[i]);
    if (e == Elem::f32)
      std::memcpy(out.data() + i * 4, &x[i], 4);
    else
      std::memcpy(out.data() + i * 2, &h, 2);
  }
  return out;
}

const char *const kVectorKernels[] = {"avx2", "avx512"};
const Elem kGrads[] = {Elem::f32, Elem::bf16, Elem::f16};
const Elem kOuts[] = {Elem::none, Elem::f32, Elem::bf16, Elem::f16};

}  // namespace

TEST_CASE("adam's CPU kernels give the same bits on every instruction set", "[optimizer]") {
  Fixture f;
  std::vector<std::string> kernels;
  for (const char *k : kVectorKernels)
    if (kernel_runs(f, k)) kernels.push_back(k);
  if (kernels.empty()) return;

  // Past kStreamMin (65536) so that the long segment streams its copy.
  const size_t n = 70001;
  std::mt19937 rng(20240519);
  const std::vector<float> p0 = random_floats(rng, n, -12, 3);
  const std::vector<float> g = random_floats(rng, n, -20, 2);
  const std::vector<tsr_segment> segs = {{0, 5, 1}, {5, 69990, 0}, {69995, 6, 1}};
  const std::pair<const char *, const char *> configs[] = {
      {"adam", "weight_decay = 0.1"},  // L2
      {"adamw", "weight_decay = 0.05"},
      {"adam", "betas = [0.8, 0.95]\neps = 1e-6"},
      {"adamw", "betas = [0.0, 0.5]\neps = 0.0\nweight_decay = 0.0"},
  };
  for (const auto &[plugin, toml] : configs)
    for (Elem ge : kGrads)
      for (Elem oe : kOuts) {
        Inputs in{p0, encode(g, ge), ge, oe, segs};
        const Result want = run(f, plugin, toml, "scalar", in);
        for (const std::string &k : kernels) {
          const Result got = run(f, plugin, toml, k, in);
          std::string first;
          const size_t bad = mismatches(want, got, oe, true, first);
          INFO(plugin << " [" << toml << "] " << k << ": grads "
                      << tessera::sdk::optim::elem_name(ge) << ", copy "
                      << tessera::sdk::optim::elem_name(oe) << ": " << bad
                      << " elements differ, the first: " << first);
          CHECK(bad == 0);
        }
      }
}

TEST_CASE("adam's CPU kernels convert every 16-bit pattern like the scalar loop", "[optimizer]") {
  Fixture f;
  std::vector<std::string> kernels;
  for (const char *k : kVectorKernels)
    if (kernel_runs(f, k)) kernels.push_back(k);
  if (kernels.empty()) return;

  SECTION("the compute copy of every bf16 pattern, ties and fp16 rounding bits around it") {
    // Zero gradients and state with lr = 0 leave the master as it is (a
    // signalling NaN gets its quiet bit), so the copy shows the conversion.
    const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x2000,
                             0x3000, 0x7fff, 0x8000, 0x8001, 0xefff, 0xffff};
    std::vector<float> p0;
    for (uint32_t hi = 0; hi < 0x10000u; ++hi)
      for (uint32_t lo : lows) p0.push_back(from_bits32(hi << 16 | lo));
    const size_t n = p0.size();
    const std::vector<float> zeros(n, 0.0f);
    for (Elem oe : {Elem::bf16, Elem::f16, Elem::f32}) {
      Inputs in{p0, encode(zeros, Elem::f32), Elem::f32, oe, {{0, n, 0}}, 1};
      // run() steps with lr 1e-3, but zero gradients give a zero update.
      const Result want = run(f, "adam", "", "scalar", in);
      for (const std::string &k : kernels) {
        std::string first;
        const size_t bad = mismatches(want, run(f, "adam", "", k, in), oe, false, first);
        INFO(k << ", copy " << tessera::sdk::optim::elem_name(oe) << ": " << bad
               << " elements differ, the first: " << first);
        CHECK(bad == 0);
      }
    }
  }

  SECTION("every bf16 and fp16 gradient, NaN payloads included") {
    // One NaN at most flows into each element (zero state, finite master),
    // so even the payloads must agree.
    std::mt19937 rng(7);
    const std::vector<float> p0 = random_floats(rng, 0x10000, -6, 2);
    std::vector<float> finite = p0;
    for (float &x : finite)
      if (!std::isfinite(x)) x = 0.5f;
    std::vector<uint8_t> patterns(0x20000);
    for (uint32_t h = 0; h < 0x10000u; ++h) std::memcpy(&patterns[h * 2], &h, 2);
    for (Elem ge : {Elem::bf16, Elem::f16})
      for (const char *plugin : {"adam", "adamw"}) {
        Inputs in{finite, patterns, ge, Elem::bf16, {{0, 0x10000, 1}}, 1};
        const Result want = run(f, plugin, "weight_decay = 0.1", "scalar", in);
        for (const std::string &k : kernels) {
          std::string first;
          const size_t bad = mismatches(want, run(f, plugin, "weight_decay = 0.1", k, in),
                                        Elem::bf16, false, first);
          INFO(plugin << " " << k << ", grads " << tessera::sdk::optim::elem_name(ge) << ": " << bad
                      << " elements differ, the first: " << first);
          CHECK(bad == 0);
        }
      }
  }
}

TEST_CASE("cpu_kernel is checked", "[optimizer]") {
  Fixture f;
  CHECK_THROWS_AS(f.config("optimizer", "adamw", "cpu_kernel = \"sse2\""),
                  tessera::config::ConfigError);
  CHECK(kernel_runs(f, "scalar"));
  CHECK(kernel_runs(f, "auto"));
  // A named kernel this CPU cannot run is refused, not replaced.
  for (const char *k : kVectorKernels) {
    const auto *vt = f.vtable<tsr_optimizer_vtable>("optimizer", "adam");
    void *self = nullptr;
    const tsr_status s =
        vt->create(f.host.table(),
                   f.config("optimizer", "adam", std::string("cpu_kernel = \"") + k + "\""), &self);
    if (self) vt->destroy(self);
    if (s == TSR_OK) continue;
    CHECK(s == TSR_ERR_UNSUPPORTED);
    CHECK_THAT(f.host.last_error(), Catch::Contains(k) && Catch::Contains("cannot run"));
  }
}

}  // namespace unit_test_optimizers_simd
