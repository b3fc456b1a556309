// Optimizers "sgd", "adam" and "adamw" in low precision: the bf16, fp16 and
// fp32 compute copy is the rounded fp32 master (against round-to-nearest-even
// references written here, along the torch.optim trajectories of
// tests/data/optimizers.{json,safetensors} and on rounding edge cases), bf16
// and fp16 gradients are widened exactly, and other gradient dtypes and
// older callers' structs are handled.
#include <tessera/optimizer.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <tessera/cpp/half.hpp>
#include <tessera/cpp/optimizer.hpp>
#include <tessera/cpp/plugin.hpp>
#include <vector>

#include "optimizers_support.hpp"
#include "support/fixture.hpp"
#include "support/safetensors_read.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_optimizers_low_precision {

using namespace tessera::test::optimizers_support;

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

// The bf16 nearest to x, ties to the even mantissa, found by comparing the
// two candidates in double (deliberately not the bit trick the plugins use).
uint16_t bf16_reference(float x) {
  uint32_t u = bits32(x);
  if (std::isnan(x)) return 0;  // callers compare NaNs separately
  if (std::isinf(x)) return static_cast<uint16_t>(u >> 16);
  uint32_t lo = u & 0xffff0000u;
  uint32_t hi = lo + 0x10000u;  // next bf16 away from zero (may be inf)
  double dlo = std::fabs(static_cast<double>(from_bits32(lo)) - x);
  double dhi = std::isinf(from_bits32(hi)) && !std::isinf(x)
                   ? std::fabs(std::ldexp(1.0, 128) * (x < 0 ? -1 : 1) - x)  // 2^128 stands in
                   : std::fabs(static_cast<double>(from_bits32(hi)) - x);
  if (dlo < dhi) return static_cast<uint16_t>(lo >> 16);
  if (dhi < dlo) return static_cast<uint16_t>(hi >> 16);
  return static_cast<uint16_t>(((lo >> 16) & 1u) ? hi >> 16 : lo >> 16);
}

// fp16 bits -> float, exactly (every fp16 value is a float).
float f16_to_float(uint16_t h) {
  const int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v;
  if (exp == 0)
    v = std::ldexp(static_cast<float>(mant), -24);
  else if (exp == 31)
    v = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else
    v = std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
  return sign ? -v : v;
}

// The fp16 nearest to x, ties to even, by search over the candidates
// (independent of the plugin's bit manipulation).
uint16_t f16_reference(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double ax = std::fabs(static_cast<double>(x));
  if (ax >= 65520.0) return sign | 0x7c00;  // rounds to infinity (max finite 65504)
  uint16_t best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    double d = std::fabs(static_cast<double>(f16_to_float(static_cast<uint16_t>(h))) - ax);
    if (d < best_d || (d == best_d && (h & 1u) == 0)) {
      best = static_cast<uint16_t>(h);
      best_d = d;
    }
    if (static_cast<double>(f16_to_float(static_cast<uint16_t>(h))) > ax) break;
  }
  return sign | best;
}

}  // namespace

TEST_CASE("the compute copy is the rounded fp32 master", "[optimizer]") {
  Fixture f;
  auto ref = tessera::test::read_safetensors(tessera::test::data_path("optimizers.safetensors"));
  nlohmann::json cases = load_cases();

  SECTION("bf16, f16 and f32 copies along the torch trajectories") {
    for (const auto &[name, c] : cases.items()) {
      const auto &p0 = ref.at(name + ".p0");
      const auto &grads = ref.at(name + ".grads");
      const size_t n = p0.data.size();
      const double lr = c.at("lr").get<double>();
      Optimizer opt(f, plugin_of(c), toml_from_case(c), n);
      std::vector<float> p = to_float(p0.data, 0, n), copy32(n);
      std::vector<uint16_t> copy16(n);
      std::vector<tsr_segment> segs = {{0, 10, 1}, {10, n - 10, 0}};
      for (int64_t t = 1; t <= 8; ++t) {
        std::vector<float> g = to_float(grads.data, (t - 1) * n, n);
        // Cycle through the three dtypes; the master is what matters.
        int which = static_cast<int>(t % 3);
        DLDataType dt = which == 0   ? DLDataType{kDLBfloat, 16, 1}
                        : which == 1 ? DLDataType{kDLFloat, 16, 1}
                                     : sdk::dtype_f32();
        void *out = which == 2 ? static_cast<void *>(copy32.data()) : copy16.data();
        REQUIRE(opt.step(p, g, segs, lr, t, 1.0, out, dt) == TSR_OK);
        for (size_t i = 0; i < n; ++i) {
          INFO(name << " step " << t << " element " << i << " master " << p[i]);
          if (which == 0) REQUIRE(copy16[i] == bf16_reference(p[i]));
          if (which == 1) REQUIRE(copy16[i] == f16_reference(p[i]));
          if (which == 2) REQUIRE(bits32(copy32[i]) == bits32(p[i]));
        }
      }
    }
  }

  SECTION("rounding edge cases") {
    // lr = 0 and zero grads leave the master as it is, so the copy shows the
    // conversion of chosen values: ties, carries into the exponent, overflow,
    // subnormals, signed zero, infinities and NaN.
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> vals = {0.0f,
                               -0.0f,
                               1.0f,
                               -1.0f,
                               from_bits32(0x3f808000u),  // bf16 tie, even below: rounds down
                               from_bits32(0x3f818000u),  // bf16 tie, odd below: rounds up
                               from_bits32(0x3f808001u),  // just above a tie: up
                               from_bits32(0x3f7fffffu),  // carries into the exponent
                               from_bits32(0x7f7fffffu),  // max float: bf16 overflows to inf
                               inf,
                               -inf,
                               1.0009765625f + 0.00048828125f,  // fp16 tie (1 + 1.5 ulp)
                               65504.0f,
                               65519.0f,
                               65520.0f,
                               1e-7f,
                               -3e-8f,
                               6.0e-8f,
                               2.9e-8f,                   // fp16 max/overflow/subnormal
                               from_bits32(0x00000001u),  // float subnormal
                               3.14159265f,
                               -2.71828183f,
                               0.1f,
                               1e30f,
                               -1e-30f,
                               nan};
    const size_t n = vals.size();
    for (const char *name : {"sgd", "adam"}) {
      Optimizer opt(f, name, "", n);
      std::vector<float> zeros(n, 0.0f);
      std::vector<tsr_segment> all = {{0, n, 0}};
      std::vector<uint16_t> bf(n), hf(n);
      std::vector<float> p = vals;
      REQUIRE(opt.step(p, zeros, all, 0.0, 1, 1.0, bf.data(), DLDataType{kDLBfloat, 16, 1}) ==
              TSR_OK);
      REQUIRE(opt.step(p, zeros, all, 0.0, 2, 1.0, hf.data(), DLDataType{kDLFloat, 16, 1}) ==
              TSR_OK);
      for (size_t i = 0; i < n; ++i) {
        INFO(name << " value " << vals[i] << " bits " << std::hex << bits32(vals[i]));
        if (std::isnan(vals[i])) {
          CHECK(std::isnan(p[i]));
          CHECK((bf[i] & 0x7f80u) == 0x7f80u);
          CHECK((bf[i] & 0x007fu) != 0);
          CHECK((hf[i] & 0x7c00u) == 0x7c00u);
          CHECK((hf[i] & 0x03ffu) != 0);
          continue;
        }
        REQUIRE(bits32(p[i]) == bits32(vals[i]));  // master unchanged
        CHECK(bf[i] == bf16_reference(vals[i]));
        CHECK(hf[i] == f16_reference(vals[i]));
      }
      // A few spelled out, so the references themselves are pinned.
      CHECK(bf[4] == 0x3f80);
      CHECK(bf[5] == 0x3f82);
      CHECK(bf[6] == 0x3f81);
      CHECK(bf[7] == 0x3f80);
      CHECK(bf[8] == 0x7f80);
      CHECK(hf[2] == 0x3c00);
      CHECK(hf[11] == 0x3c02);
      CHECK(hf[12] == 0x7bff);
      CHECK(hf[13] == 0x7bff);
      CHECK(hf[14] == 0x7c00);
    }
  }
}

TEST_CASE("bf16 and fp16 gradients are widened exactly on CPU", "[optimizer]") {
  // A 16-bit gradient must give the same update, bit for bit, as the same
  // values handed over in fp32: the step widens it (exactly) and goes on.
  Fixture f;
  auto ref = tessera::test::read_safetensors(tessera::test::data_path("optimizers.safetensors"));
  nlohmann::json cases = load_cases();
  for (const auto &[name, c] : cases.items()) {
    SECTION(name) {
      const auto &p0 = ref.at(name + ".p0");
      const auto &grads = ref.at(name + ".grads");
      const size_t n = p0.data.size();
      const double lr = c.at("lr").get<double>();
      for (const bool bf16 : {true, false}) {
        Optimizer wide(f, plugin_of(c), toml_from_case(c), n);
        Optimizer narrow(f, plugin_of(c), toml_from_case(c), n);
        std::vector<float> pw = to_float(p0.data, 0, n), pn = pw;
        std::vector<tsr_segment> segs = {{0, 13, 1}, {13, 11, 0}, {24, n - 24, 1}};
        for (int64_t t = 1; t <= 8; ++t) {
          std::vector<float> g = to_float(grads.data, (t - 1) * n, n);
          std::vector<uint16_t> h(n);
          for (size_t i = 0; i < n; ++i) {
            h[i] = bf16 ? sdk::float_to_bf16(g[i]) : sdk::float_to_f16(g[i]);
            g[i] = bf16 ? sdk::bf16_to_float(h[i]) : f16_to_float(h[i]);  // the reference
          }
          const DLDataType dt = bf16 ? DLDataType{kDLBfloat, 16, 1} : DLDataType{kDLFloat, 16, 1};
          REQUIRE(wide.step_raw(pw, g.data(), sdk::dtype_f32(), segs, lr, t, 0.5) == TSR_OK);
          REQUIRE(narrow.step_raw(pn, h.data(), dt, segs, lr, t, 0.5) == TSR_OK);
          for (size_t i = 0; i < n; ++i) {
            INFO(name << (bf16 ? " bf16" : " fp16") << " step " << t << " element " << i);
            REQUIRE(bits32(pn[i]) == bits32(pw[i]));
          }
        }
      }
    }
  }
  SECTION("the widening itself") {
    for (uint32_t h = 0; h < 0x10000u; ++h) {
      const float want = f16_to_float(static_cast<uint16_t>(h));
      const float got = sdk::f16_to_float(static_cast<uint16_t>(h));
      INFO("fp16 bits " << std::hex << h);
      if (std::isnan(want))
        REQUIRE(std::isnan(got));
      else
        REQUIRE(bits32(got) == bits32(want));
      REQUIRE(bits32(sdk::bf16_to_float(static_cast<uint16_t>(h))) == h << 16);
    }
  }
}

TEST_CASE("gradient dtypes: refusals and older callers", "[optimizer]") {
  Fixture f;
  for (const char *name : {"sgd", "adam"}) {
    SECTION(name) {
      Optimizer opt(f, name, "", 4);
      std::vector<float> p(4, 1.0f), g(4, 1.0f);
      std::vector<tsr_segment> all = {{0, 4, 1}};
      std::vector<double> g64(4, 1.0);
      f.host.clear_error();
      CHECK(opt.step_raw(p, g64.data(), DLDataType{kDLFloat, 64, 1}, all, 0.1, 1) ==
            TSR_ERR_UNSUPPORTED);
      CHECK_THAT(f.host.last_error(), Catch::Contains("gradient dtype") &&
                                          Catch::Contains("bits 64") &&
                                          Catch::Contains("bfloat16"));
      CHECK(p == std::vector<float>(4, 1.0f));

      // An ABI 1.0 caller's struct ends before grads_dtype: its gradients are
      // fp32 whatever lies past struct_size.
      std::vector<float> p10(4, 1.0f), p11(4, 1.0f);
      Optimizer other(f, name, "", 4);
      REQUIRE(opt.step_raw(p10, g.data(), DLDataType{kDLBfloat, 16, 1}, all, 0.1, 1, 1.0, nullptr,
                           sdk::dtype_f32(), DLDevice{kDLCPU, 0},
                           offsetof(tsr_optimizer_step_args, grads_dtype)) == TSR_OK);
      REQUIRE(other.step_raw(p11, g.data(), sdk::dtype_f32(), all, 0.1, 1) == TSR_OK);
      CHECK(p10 == p11);
      CHECK(p10 != std::vector<float>(4, 1.0f));
      // Shorter than 1.0: refused.
      CHECK(opt.step_raw(p10, g.data(), sdk::dtype_f32(), all, 0.1, 2, 1.0, nullptr,
                         sdk::dtype_f32(), DLDevice{kDLCPU, 0},
                         offsetof(tsr_optimizer_step_args, compute_dtype)) == TSR_ERR_INVALID);
      CHECK_THAT(f.host.last_error(), Catch::Contains("older ABI"));
    }
  }
}

}  // namespace unit_test_optimizers_low_precision
