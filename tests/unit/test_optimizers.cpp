// Optimizers "sgd", "adam" and "adamw": eight steps against torch.optim
// (tests/data/optimizers.{json,safetensors}, float64 references), declared
// state, grad_scale, segments without decay, sgd's first momentum step,
// config refusals and steps refused. The low-precision compute copy and
// 16-bit gradients are in test_optimizers_low_precision.cpp.
#include <tessera/optimizer.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <tessera/cpp/plugin.hpp>
#include <vector>

#include "config/config.hpp"
#include "optimizers_support.hpp"
#include "support/fixture.hpp"
#include "support/safetensors_read.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_optimizers {

using namespace tessera::test::optimizers_support;

namespace {

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

}  // namespace unit_test_optimizers
