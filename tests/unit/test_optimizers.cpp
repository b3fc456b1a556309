// Optimizers "sgd", "adam" and "adamw": eight steps against torch.optim
// (tests/data/optimizers.{json,safetensors}, float64 references), grad_scale,
// segments without decay, config refusals, and the low-precision compute copy.
#include <tessera/optimizer.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tessera/cpp/optimizer.hpp>
#include <tessera/cpp/plugin.hpp>
#include <vector>

#include "config/config.hpp"
#include "support/fixture.hpp"
#include "support/safetensors_read.hpp"

namespace {

using tessera::test::Fixture;
namespace sdk = tessera::sdk;

// One optimizer instance, destroyed at scope exit, with its own zeroed state
// arrays of n elements.
class Optimizer {
 public:
  Optimizer(Fixture &f, const std::string &name, const std::string &toml, size_t n) : f_(f) {
    vt_ = f.vtable<tsr_optimizer_vtable>("optimizer", name);
    REQUIRE(vt_ != nullptr);
    REQUIRE(vt_->struct_size >= sizeof(tsr_optimizer_vtable));
    tsr_config *cfg = f.config("optimizer", name, toml);
    tsr_status s = vt_->create(f.host.table(), cfg, &self_);
    INFO(f.host.last_error());
    REQUIRE(s == TSR_OK);
    REQUIRE(self_ != nullptr);
    state_.assign(vt_->state_count(self_), std::vector<float>(n, 0.0f));
    for (auto &s : state_) state_ptrs_.push_back(s.data());
  }
  ~Optimizer() {
    if (self_) vt_->destroy(self_);
  }
  Optimizer(const Optimizer &) = delete;
  Optimizer &operator=(const Optimizer &) = delete;

  uint32_t state_count() const { return vt_->state_count(self_); }
  const char *state_name(uint32_t i) const { return vt_->state_name(self_, i); }

  // One update of params with grads; the compute copy is written when
  // `compute` is non-null.
  tsr_status step(std::vector<float> &params, const std::vector<float> &grads,
                  const std::vector<tsr_segment> &segments, double lr, int64_t t,
                  double grad_scale = 1.0, void *compute = nullptr,
                  DLDataType compute_dtype = sdk::dtype_f32(),
                  DLDevice device = DLDevice{kDLCPU, 0}) {
    return step_raw(params, grads.data(), DLDataType{0, 0, 0}, segments, lr, t, grad_scale, compute,
                    compute_dtype, device);
  }

  // The same with gradients of any dtype (grads_dtype {0, 0, 0}: left unset,
  // as a caller that zero-fills the struct and ignores the field).
  tsr_status step_raw(std::vector<float> &params, const void *grads, DLDataType grads_dtype,
                      const std::vector<tsr_segment> &segments, double lr, int64_t t,
                      double grad_scale = 1.0, void *compute = nullptr,
                      DLDataType compute_dtype = sdk::dtype_f32(),
                      DLDevice device = DLDevice{kDLCPU, 0}, size_t struct_size = 0) {
    auto a = sdk::make<tsr_optimizer_step_args>();
    if (struct_size) a.struct_size = struct_size;
    a.device = device;
    a.params = params.data();
    a.grads = static_cast<const float *>(grads);
    a.grads_dtype = grads_dtype;
    a.state = state_ptrs_.empty() ? nullptr : state_ptrs_.data();
    a.n = params.size();
    a.segments = segments.data();
    a.num_segments = segments.size();
    a.lr = lr;
    a.grad_scale = grad_scale;
    a.step = t;
    a.compute_params = compute;
    a.compute_dtype = compute_dtype;
    return vt_->step(self_, &a);
  }

 private:
  Fixture &f_;
  const tsr_optimizer_vtable *vt_ = nullptr;
  void *self_ = nullptr;
  std::vector<std::vector<float>> state_;
  std::vector<float *> state_ptrs_;
};

nlohmann::json load_cases() {
  std::ifstream in(tessera::test::data_path("optimizers.json"));
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

// The TOML body of an [optimizer] section from one JSON case: every key but
// "optimizer" (the plugin name), values written as JSON, which is valid TOML
// for numbers, booleans and arrays of numbers.
std::string toml_from_case(const nlohmann::json &c) {
  std::string body;
  for (const auto &[k, v] : c.items())
    if (k != "optimizer") body += k + " = " + v.dump() + "\n";
  return body;
}

std::vector<float> to_float(const std::vector<double> &v, size_t begin, size_t n) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(v[begin + i]);
  return out;
}

// How close fp32 must get to torch's float64 trajectory. The plugins compute
// in fp32 (unit roundoff 6e-8), starting from p0 rounded to fp32; after 8
// steps of a few operations each the error is a few ulps of the values
// involved, which are O(1) (|p| up to ~3.5 in the data). That error does not
// shrink when a parameter happens to pass near zero, so the bound is 1e-6
// relative for |p| >= 1 and 1e-6 absolute below (observed worst: ~4e-7).
// It is still meaningful: one Adam step moves a parameter by about lr
// (1e-3..3e-3) and one SGD step by lr * |g| ~ 1e-2, so a wrong bias
// correction, a missing momentum or decay term, or an off-by-one step shows
// up hundreds of times over the bound.
bool close_to_torch(float got, double want) {
  return std::fabs(static_cast<double>(got) - want) <= 1e-6 * std::max(std::fabs(want), 1.0);
}

std::string plugin_of(const nlohmann::json &c) {
  return c.at("optimizer").get<std::string>();
}

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

TEST_CASE("optimizers match torch.optim for 8 steps in fp32", "[optimizer]") {
  Fixture f;
  auto ref = tessera::test::read_safetensors(tessera::test::data_path("optimizers.safetensors"));
  nlohmann::json cases = load_cases();
  REQUIRE(cases.size() == 5);
  for (const auto &[name, c] : cases.items()) {
    SECTION(name) {
      const auto &p0 = ref.at(name + ".p0");
      const auto &grads = ref.at(name + ".grads");
      const auto &want = ref.at(name + ".params");
      const size_t n = p0.data.size();
      REQUIRE(n == 37);
      REQUIRE(grads.shape == std::vector<int64_t>{8, 37});
      REQUIRE(want.shape == std::vector<int64_t>{8, 37});

      Optimizer opt(f, plugin_of(c), toml_from_case(c), n);
      const double lr = c.at("lr").get<double>();
      std::vector<float> p = to_float(p0.data, 0, n);
      std::vector<tsr_segment> all = {{0, n, 1}};
      for (int64_t t = 1; t <= 8; ++t) {
        std::vector<float> g = to_float(grads.data, (t - 1) * n, n);
        REQUIRE(opt.step(p, g, all, lr, t) == TSR_OK);
        for (size_t i = 0; i < n; ++i) {
          double w = want.data[(t - 1) * n + i];
          INFO(name << " step " << t << " element " << i << ": got " << p[i] << ", torch " << w);
          REQUIRE(close_to_torch(p[i], w));
        }
      }
    }
  }
}

TEST_CASE("optimizers declare their state", "[optimizer]") {
  Fixture f;
  {
    Optimizer plain(f, "sgd", "lr = 0.1", 4);
    CHECK(plain.state_count() == 0);
    CHECK(plain.state_name(0) == nullptr);
  }
  {
    Optimizer mom(f, "sgd", "momentum = 0.9", 4);
    REQUIRE(mom.state_count() == 1);
    CHECK(std::string(mom.state_name(0)) == "momentum_buffer");
    CHECK(mom.state_name(1) == nullptr);
  }
  for (const char *name : {"adam", "adamw"}) {
    Optimizer adam(f, name, "", 4);
    REQUIRE(adam.state_count() == 2);
    CHECK(std::string(adam.state_name(0)) == "exp_avg");
    CHECK(std::string(adam.state_name(1)) == "exp_avg_sq");
    CHECK(adam.state_name(2) == nullptr);
  }
  for (const char *name : {"sgd", "adam", "adamw"}) {
    const tsr_plugin_descriptor &d = f.desc("optimizer", name);
    CHECK(std::string(d.kind) == TSR_KIND_OPTIMIZER);
    CHECK(std::string(d.version) == "1.0.0");
    CHECK((d.devices & TSR_DEVICE_CPU) != 0);
  }
}

TEST_CASE("adamw is adam with decoupled decay and torch's AdamW defaults", "[optimizer]") {
  Fixture f;
  const size_t n = 37;
  auto ref = tessera::test::read_safetensors(tessera::test::data_path("optimizers.safetensors"));
  const auto &p0 = ref.at("adamw_wd.p0");
  const auto &grads = ref.at("adamw_wd.grads");
  Optimizer w(f, "adamw", "", n);  // weight_decay 0.01, adamw = true by default
  Optimizer a(f, "adam", "weight_decay = 0.01\nadamw = true", n);
  Optimizer l2(f, "adam", "weight_decay = 0.01", n);  // L2: a different trajectory
  std::vector<float> pw = to_float(p0.data, 0, n), pa = pw, pl = pw;
  std::vector<tsr_segment> all = {{0, n, 1}};
  for (int64_t t = 1; t <= 8; ++t) {
    std::vector<float> g = to_float(grads.data, (t - 1) * n, n);
    REQUIRE(w.step(pw, g, all, 1e-2, t) == TSR_OK);
    REQUIRE(a.step(pa, g, all, 1e-2, t) == TSR_OK);
    REQUIRE(l2.step(pl, g, all, 1e-2, t) == TSR_OK);
  }
  CHECK(pw == pa);
  CHECK(pw != pl);
}

TEST_CASE("grad_scale multiplies the gradient first", "[optimizer]") {
  // Halving the grads and passing grad_scale = 2 must give bit-identical
  // results: scaling by a power of two is exact in fp32.
  Fixture f;
  auto ref = tessera::test::read_safetensors(tessera::test::data_path("optimizers.safetensors"));
  nlohmann::json cases = load_cases();
  for (const auto &[name, c] : cases.items()) {
    SECTION(name) {
      const auto &p0 = ref.at(name + ".p0");
      const auto &grads = ref.at(name + ".grads");
      const size_t n = p0.data.size();
      Optimizer one(f, plugin_of(c), toml_from_case(c), n);
      Optimizer two(f, plugin_of(c), toml_from_case(c), n);
      const double lr = c.at("lr").get<double>();
      std::vector<float> p1 = to_float(p0.data, 0, n), p2 = p1;
      std::vector<tsr_segment> all = {{0, n, 1}};
      for (int64_t t = 1; t <= 8; ++t) {
        std::vector<float> g = to_float(grads.data, (t - 1) * n, n), half = g;
        for (float &x : half) x *= 0.5f;
        REQUIRE(one.step(p1, g, all, lr, t, 1.0) == TSR_OK);
        REQUIRE(two.step(p2, half, all, lr, t, 2.0) == TSR_OK);
        REQUIRE(p1 == p2);
      }
      // And grad_scale is not ignored: a different scale moves differently.
      Optimizer three(f, plugin_of(c), toml_from_case(c), n);
      std::vector<float> p3 = to_float(p0.data, 0, n);
      std::vector<float> g = to_float(grads.data, 0, n);
      std::vector<float> p1_first = to_float(p0.data, 0, n);
      Optimizer ref_one(f, plugin_of(c), toml_from_case(c), n);
      REQUIRE(ref_one.step(p1_first, g, all, lr, 1, 1.0) == TSR_OK);
      REQUIRE(three.step(p3, g, all, lr, 1, 0.25) == TSR_OK);
      if (plugin_of(c) == "sgd") CHECK(p3 != p1_first);
    }
  }
}

TEST_CASE("weight decay applies only to segments with decay", "[optimizer]") {
  // Elements [0, 20) decay and [20, 37) do not. The decaying part must
  // follow torch (which decays everything); the other part must be exactly
  // what the same optimizer gives with weight_decay = 0.
  Fixture f;
  auto ref = tessera::test::read_safetensors(tessera::test::data_path("optimizers.safetensors"));
  nlohmann::json cases = load_cases();
  const size_t split = 20;
  for (const std::string name : {"sgd_nesterov_wd", "adamw_wd"}) {
    SECTION(name) {
      const nlohmann::json &c = cases.at(name);
      REQUIRE(c.at("weight_decay").get<double>() > 0);
      nlohmann::json no_wd = c;
      no_wd["weight_decay"] = 0.0;
      const auto &p0 = ref.at(name + ".p0");
      const auto &grads = ref.at(name + ".grads");
      const auto &want = ref.at(name + ".params");
      const size_t n = p0.data.size();
      const double lr = c.at("lr").get<double>();
      Optimizer mixed(f, plugin_of(c), toml_from_case(c), n);
      Optimizer plain(f, plugin_of(no_wd), toml_from_case(no_wd), n);
      std::vector<float> pm = to_float(p0.data, 0, n), pp = pm;
      std::vector<tsr_segment> segs = {{0, split, 1}, {split, n - split, 0}};
      std::vector<tsr_segment> all = {{0, n, 1}};
      for (int64_t t = 1; t <= 8; ++t) {
        std::vector<float> g = to_float(grads.data, (t - 1) * n, n);
        REQUIRE(mixed.step(pm, g, segs, lr, t) == TSR_OK);
        REQUIRE(plain.step(pp, g, all, lr, t) == TSR_OK);
        for (size_t i = 0; i < split; ++i) {
          INFO("step " << t << " element " << i);
          REQUIRE(close_to_torch(pm[i], want.data[(t - 1) * n + i]));
        }
        for (size_t i = split; i < n; ++i) {
          INFO("step " << t << " element " << i);
          REQUIRE(pm[i] == pp[i]);
        }
      }
      // The decaying part really differs from the undecayed run.
      bool differs = false;
      for (size_t i = 0; i < split; ++i) differs |= pm[i] != pp[i];
      CHECK(differs);
    }
  }
  SECTION("adam L2") {
    // torch.optim.Adam's weight_decay is added to the gradient; it too must
    // stay out of no-decay segments.
    const size_t n = 8;
    Optimizer l2(f, "adam", "weight_decay = 0.5", n);
    Optimizer none(f, "adam", "", n);
    std::vector<float> pa(n, 1.0f), pb(n, 1.0f), g(n, 0.25f);
    std::vector<tsr_segment> segs = {{0, 3, 0}, {3, 2, 1}, {5, 3, 0}};
    std::vector<tsr_segment> all = {{0, n, 0}};
    for (int64_t t = 1; t <= 3; ++t) {
      REQUIRE(l2.step(pa, g, segs, 1e-2, t) == TSR_OK);
      REQUIRE(none.step(pb, g, all, 1e-2, t) == TSR_OK);
    }
    for (size_t i : {0, 1, 2, 5, 6, 7}) CHECK(pa[i] == pb[i]);
    for (size_t i : {3, 4}) CHECK(pa[i] != pb[i]);
  }
}

TEST_CASE("sgd momentum: step 1 copies the gradient into the buffer", "[optimizer]") {
  // torch clones the gradient on the first step (no dampening applied), then
  // uses buf = momentum * buf + (1 - dampening) * g.
  Fixture f;
  Optimizer opt(f, "sgd", "momentum = 0.5\ndampening = 0.5", 1);
  std::vector<float> p = {1.0f};
  std::vector<tsr_segment> all = {{0, 1, 1}};
  REQUIRE(opt.step(p, {2.0f}, all, 0.1, 1) == TSR_OK);
  CHECK(p[0] == Approx(1.0 - 0.1 * 2.0).epsilon(1e-6));  // buf = 2
  REQUIRE(opt.step(p, {2.0f}, all, 0.1, 2) == TSR_OK);
  CHECK(p[0] == Approx(0.8 - 0.1 * (0.5 * 2.0 + 0.5 * 2.0)).epsilon(1e-6));  // buf = 2
  REQUIRE(opt.step(p, {4.0f}, all, 0.1, 3) == TSR_OK);
  CHECK(p[0] == Approx(0.6 - 0.1 * (0.5 * 2.0 + 0.5 * 4.0)).epsilon(1e-6));  // buf = 3
}

TEST_CASE("optimizer configs are checked", "[optimizer]") {
  Fixture f;
  auto create = [&](const std::string &name, const std::string &toml) {
    const auto *vt = f.vtable<tsr_optimizer_vtable>("optimizer", name);
    tsr_config *cfg = f.config("optimizer", name, toml);
    f.host.clear_error();
    void *self = nullptr;
    tsr_status s = vt->create(f.host.table(), cfg, &self);
    if (s == TSR_OK) vt->destroy(self);
    if (s != TSR_OK) CHECK(self == nullptr);
    return s;
  };
  using tessera::config::ConfigError;

  SECTION("betas must have two elements") {
    for (const char *name : {"adam", "adamw"}) {
      CHECK(create(name, "betas = [0.9, 0.99, 0.999]") == TSR_ERR_CONFIG);
      CHECK_THAT(f.host.last_error(), Catch::Contains("exactly 2"));
      CHECK_THAT(f.host.last_error(), Catch::Contains("betas"));
      CHECK(create(name, "betas = [0.9]") == TSR_ERR_CONFIG);
      CHECK_THAT(f.host.last_error(), Catch::Contains("exactly 2"));
    }
  }
  SECTION("betas lie in [0, 1)") {
    CHECK(create("adam", "betas = [0.9, 1.0]") == TSR_ERR_CONFIG);
    CHECK_THAT(f.host.last_error(), Catch::Contains("[0, 1)"));
    CHECK_THROWS_AS(f.config("optimizer", "adam", "betas = [0.9, 1.5]"), ConfigError);
    CHECK_THROWS_AS(f.config("optimizer", "adam", "betas = [-0.1, 0.9]"), ConfigError);
    CHECK(create("adam", "betas = [0.0, 0.5]") == TSR_OK);
  }
  SECTION("nesterov needs momentum and no dampening") {
    CHECK(create("sgd", "nesterov = true") == TSR_ERR_CONFIG);
    CHECK_THAT(f.host.last_error(), Catch::Contains("nesterov") && Catch::Contains("momentum"));
    CHECK(create("sgd", "nesterov = true\nmomentum = 0.9\ndampening = 0.1") == TSR_ERR_CONFIG);
    CHECK_THAT(f.host.last_error(), Catch::Contains("dampening"));
    CHECK(create("sgd", "nesterov = true\nmomentum = 0.9") == TSR_OK);
  }
  SECTION("ranges and types") {
    CHECK_THROWS_AS(f.config("optimizer", "sgd", "lr = -0.1"), ConfigError);
    CHECK_THROWS_AS(f.config("optimizer", "sgd", "momentum = 1.5"), ConfigError);
    CHECK_THROWS_AS(f.config("optimizer", "sgd", "weight_decay = -1"), ConfigError);
    CHECK_THROWS_AS(f.config("optimizer", "sgd", "nesterov = 1"), ConfigError);
    CHECK_THROWS_AS(f.config("optimizer", "adam", "eps = -1e-8"), ConfigError);
    CHECK_THROWS_AS(f.config("optimizer", "adam", "betas = 0.9"), ConfigError);
    CHECK_THROWS_AS(f.config("optimizer", "adamw", "amsgrad = true"), ConfigError);
  }
}

TEST_CASE("optimizer steps refuse what they cannot do", "[optimizer]") {
  Fixture f;
  for (const char *name : {"sgd", "adam"}) {
    SECTION(name) {
      Optimizer opt(f, name, "", 4);
      std::vector<float> p(4, 1.0f), g(4, 1.0f);
      std::vector<tsr_segment> all = {{0, 4, 1}};
      f.host.clear_error();
      const tsr_status on_cuda =
          opt.step(p, g, all, 0.1, 1, 1.0, nullptr, sdk::dtype_f32(), DLDevice{kDLCUDA, 0});
      if (f.desc("optimizer", name).devices & TSR_DEVICE_CUDA) {
        // Built with CUDA: host vectors are refused before any kernel sees
        // them (no GPU here: unsupported; a GPU: not device memory).
        CHECK((on_cuda == TSR_ERR_UNSUPPORTED || on_cuda == TSR_ERR_INVALID));
        CHECK_THAT(f.host.last_error(), Catch::Contains("CUDA"));
      } else {
        CHECK(on_cuda == TSR_ERR_UNSUPPORTED);
        CHECK_THAT(f.host.last_error(), Catch::Contains("CPU"));
      }
      CHECK(p == std::vector<float>(4, 1.0f));

      std::vector<double> f64(4);
      CHECK(opt.step(p, g, all, 0.1, 1, 1.0, f64.data(), DLDataType{kDLFloat, 64, 1}) ==
            TSR_ERR_UNSUPPORTED);
      CHECK_THAT(f.host.last_error(), Catch::Contains("dtype"));
      CHECK(p == std::vector<float>(4, 1.0f));

      std::vector<tsr_segment> outside = {{2, 3, 1}};
      CHECK(opt.step(p, g, outside, 0.1, 1) == TSR_ERR_INVALID);
      CHECK(p == std::vector<float>(4, 1.0f));
    }
  }
}

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
            h[i] = bf16 ? sdk::optim::float_to_bf16(g[i]) : sdk::optim::float_to_f16(g[i]);
            g[i] = bf16 ? sdk::optim::bf16_to_float(h[i]) : f16_to_float(h[i]);  // the reference
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
      const float got = sdk::optim::f16_to_float(static_cast<uint16_t>(h));
      INFO("fp16 bits " << std::hex << h);
      if (std::isnan(want))
        REQUIRE(std::isnan(got));
      else
        REQUIRE(bits32(got) == bits32(want));
      REQUIRE(bits32(sdk::optim::bf16_to_float(static_cast<uint16_t>(h))) == h << 16);
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
