// The C ABI from the host's side, with the test plugins of tests/plugins
// (one folder per case under TESSERA_TEST_BAD_PLUGIN_DIR):
//  - a plugin written in plain C99 loads, its declared parameters validate,
//    and it runs real steps;
//  - the shipped plugins all load; TSR_HAS_FIELD on truncated structs.
// Libraries the host must refuse, and failures inside plugins reaching the
// engine, are in test_abi_errors.cpp.
#include <tessera/optimizer.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "abi_support.hpp"
#include "config/config.hpp"
#include "plugin/registry.hpp"
#include "support/fixture.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_abi {

using namespace tessera::test::abi_support;

namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::Equals;
using tessera::PluginEntry;
using tessera::Registry;
using tessera::test::Fixture;

// ---------------------------------------------------------------------------
// An optimizer instance through its function table, destroyed at scope exit.

class Optimizer {
 public:
  Optimizer(Fixture &f, const std::string &name, const std::string &toml) : f_(f) {
    vt_ = f.vtable<tsr_optimizer_vtable>("optimizer", name);
    REQUIRE(vt_ != nullptr);
    tsr_config *cfg = f.config("optimizer", name, toml);
    tsr_status s = vt_->create(f.host.table(), cfg, &self_);
    INFO(f.host.last_error());
    REQUIRE(s == TSR_OK);
    REQUIRE(self_ != nullptr);
  }
  ~Optimizer() {
    if (self_) vt_->destroy(self_);
  }
  Optimizer(const Optimizer &) = delete;
  Optimizer &operator=(const Optimizer &) = delete;

  const tsr_optimizer_vtable *vt() const { return vt_; }
  void *self() const { return self_; }
  tsr_status step(const tsr_optimizer_step_args &a) {
    f_.host.clear_error();
    return vt_->step(self_, &a);
  }

 private:
  Fixture &f_;
  const tsr_optimizer_vtable *vt_ = nullptr;
  void *self_ = nullptr;
};

}  // namespace

// ---------------------------------------------------------------------------
// The plain C plugin.

TEST_CASE("a plugin written in plain C99 loads and registers as an optimizer", "[abi]") {
  const std::string lib = test_lib("good_c", "tsr_test_good_c");
  Registry r;
  REQUIRE_NOTHROW(r.load_file(lib));
  REQUIRE(r.plugins().size() == 1);
  const PluginEntry *e = r.find("optimizer", "signsgd");
  REQUIRE(e != nullptr);
  CHECK(e->kind == "optimizer");
  CHECK(e->file == lib);
  CHECK_THAT(e->desc->kind, Equals(TSR_KIND_OPTIMIZER));
  CHECK_THAT(e->desc->version, Equals("1.0.0"));
  CHECK(e->desc->devices == TSR_DEVICE_CPU);
  REQUIRE(e->desc->num_params == 3);
  CHECK_THAT(e->desc->params[0].name, Equals("lr"));
  CHECK_THAT(e->desc->params[1].name, Equals("momentum"));
  CHECK_THAT(e->desc->params[2].name, Equals("weight_decay"));
  const auto *vt = static_cast<const tsr_optimizer_vtable *>(e->desc->vtable);
  CHECK(vt->struct_size == sizeof(tsr_optimizer_vtable));

  // Found by a scan of its folder too, with nothing refused.
  Registry scanned;
  scanned.scan({case_dir("good_c")});
  CHECK(scanned.refusals().empty());
  REQUIRE(scanned.plugins().size() == 1);
  CHECK(scanned.plugins()[0].file == lib);
}

TEST_CASE("the C plugin's declared parameters validate like any plugin's", "[abi]") {
  Fixture f;
  f.registry.scan({case_dir("good_c")});
  REQUIRE(f.registry.refusals().empty());

  SECTION("defaults are filled in, integers widen to floats") {
    tsr_config *cfg = f.config("optimizer", "signsgd");
    CHECK(cfg->values["lr"].value<double>() == Approx(0.01));
    CHECK(cfg->values["momentum"].value<double>() == 0.0);
    CHECK(cfg->values["weight_decay"].value<double>() == 0.0);
    tsr_config *given = f.config("optimizer", "signsgd", "lr = 1\nmomentum = 0.5");
    CHECK(given->values["lr"].is_floating_point());
    CHECK(given->values["lr"].value<double>() == 1.0);
    CHECK(given->values["momentum"].value<double>() == 0.5);
  }
  SECTION("the plugin reads its values through host->config_float") {
    Optimizer with_momentum(f, "signsgd", "lr = 0.5\nmomentum = 0.9");
    CHECK(with_momentum.vt()->state_count(with_momentum.self()) == 1);
    CHECK_THAT(with_momentum.vt()->state_name(with_momentum.self(), 0), Equals("momentum"));
    CHECK(with_momentum.vt()->state_name(with_momentum.self(), 1) == nullptr);
    Optimizer without(f, "signsgd", "");
    CHECK(without.vt()->state_count(without.self()) == 0);
    CHECK(without.vt()->state_name(without.self(), 0) == nullptr);
  }
  SECTION("unknown keys, types and ranges are refused before the plugin sees them") {
    CHECK_THROWS_AS(f.config("optimizer", "signsgd", "lrr = 0.1"), tessera::config::ConfigError);
    CHECK_THROWS_WITH(f.config("optimizer", "signsgd", "lrr = 0.1"),
                      Contains("unknown key 'lrr'") && Contains("did you mean 'lr'"));
    CHECK_THROWS_WITH(f.config("optimizer", "signsgd", "lr = \"fast\""),
                      Contains("optimizer.lr") && Contains("expected a number"));
    CHECK_THROWS_WITH(f.config("optimizer", "signsgd", "momentum = 1.5"),
                      Contains("optimizer.momentum") && Contains("must be <= 1"));
    CHECK_THROWS_WITH(f.config("optimizer", "signsgd", "weight_decay = -1"),
                      Contains("optimizer.weight_decay") && Contains("must be >= 0"));
  }
  SECTION("a value the declaration allows but the plugin refuses: its own message") {
    const auto *vt = f.vtable<tsr_optimizer_vtable>("optimizer", "signsgd");
    tsr_config *cfg = f.config("optimizer", "signsgd", "lr = 0");
    int marker = 0;
    void *self = &marker;
    f.host.clear_error();
    CHECK(vt->create(f.host.table(), cfg, &self) == TSR_ERR_CONFIG);
    CHECK(self == nullptr);
    CHECK_THAT(f.host.last_error(), Contains("signsgd: lr must be positive, got 0"));
  }
}

TEST_CASE("the C plugin runs steps with the right numbers", "[abi]") {
  Fixture f;
  f.registry.scan({case_dir("good_c")});
  REQUIRE(f.registry.refusals().empty());

  SECTION("sign of the scaled, decayed gradient; only covered elements move") {
    Optimizer opt(f, "signsgd", "weight_decay = 0.5");
    // Elements 0-1 decay, 2-3 do not, 4 lies in no segment.
    std::vector<float> p = {1.0f, 1.0f, 1.0f, 2.0f, 3.0f};
    std::vector<float> g = {-1.0f, 0.1f, -1.0f, 0.0f, 5.0f};
    std::vector<tsr_segment> segs = {{0, 2, 1}, {2, 2, 0}};
    // scale 1: g0 = -1 + 0.5 = -0.5 (up), g1 = 0.1 + 0.5 (down),
    //          g2 = -1 (up), g3 = 0 (stays).
    auto a = step_args(p, g, nullptr, segs, 0.25, 1);
    REQUIRE(opt.step(a) == TSR_OK);
    CHECK(p == std::vector<float>{1.25f, 0.75f, 1.25f, 2.0f, 3.0f});
    // scale 0.25 on p = {1.25, 0.75, ...}: g0 = -0.25 + 0.625 > 0 (down),
    // g1 = 0.025 + 0.375 (down), g2 = -0.25 (up).
    a = step_args(p, g, nullptr, segs, 0.25, 2, 0.25);
    REQUIRE(opt.step(a) == TSR_OK);
    CHECK(p == std::vector<float>{1.0f, 0.5f, 1.5f, 2.0f, 3.0f});
  }
  SECTION("momentum: the sign of the running average, kept in the state array") {
    Optimizer opt(f, "signsgd", "momentum = 0.5");
    std::vector<float> p = {0.0f, 0.0f, 0.0f};
    std::vector<float> m(3, 0.0f);
    float *state[] = {m.data()};
    std::vector<tsr_segment> segs = {{0, 3, 0}};
    // m1 = 0.5 * g1 = {1, 1, -0.5}
    std::vector<float> g1 = {2.0f, 2.0f, -1.0f};
    auto a = step_args(p, g1, state, segs, 0.25, 1);
    REQUIRE(opt.step(a) == TSR_OK);
    CHECK(m == std::vector<float>{1.0f, 1.0f, -0.5f});
    CHECK(p == std::vector<float>{-0.25f, -0.25f, 0.25f});
    // m2 = 0.5 * m1 + 0.5 * g2 = {0, -1, -0.75}: the first stays put.
    std::vector<float> g2 = {-1.0f, -3.0f, -1.0f};
    a = step_args(p, g2, state, segs, 0.25, 2);
    REQUIRE(opt.step(a) == TSR_OK);
    CHECK(m == std::vector<float>{0.0f, -1.0f, -0.75f});
    CHECK(p == std::vector<float>{-0.25f, 0.0f, 0.5f});
  }
  SECTION("the compute copy: float32 written in the same pass, others refused") {
    Optimizer opt(f, "signsgd", "");
    std::vector<float> p = {1.0f, 1.0f}, g = {1.0f, -1.0f}, copy(2, -7.0f);
    std::vector<tsr_segment> segs = {{0, 2, 0}};
    auto a = step_args(p, g, nullptr, segs, 0.5, 1);
    a.compute_params = copy.data();
    REQUIRE(opt.step(a) == TSR_OK);
    CHECK(p == std::vector<float>{0.5f, 1.5f});
    CHECK(copy == p);
    a.compute_dtype = DLDataType{kDLBfloat, 16, 1};
    CHECK(opt.step(a) == TSR_ERR_UNSUPPORTED);
    CHECK_THAT(f.host.last_error(), Contains("signsgd: the compute copy must be float32"));
    CHECK(p == std::vector<float>{0.5f, 1.5f});
  }
  SECTION("fields beyond struct_size are not read (an older, shorter args struct)") {
    Optimizer opt(f, "signsgd", "");
    std::vector<float> p = {1.0f, 1.0f}, g = {1.0f, -1.0f}, copy(2, -7.0f);
    std::vector<tsr_segment> segs = {{0, 2, 0}};
    auto a = step_args(p, g, nullptr, segs, 0.5, 1);
    // Garbage where the compute copy would be: bf16 would be refused, and
    // the copy would be written, if the plugin looked past struct_size.
    a.compute_params = copy.data();
    a.compute_dtype = DLDataType{kDLBfloat, 16, 1};
    a.struct_size = offsetof(tsr_optimizer_step_args, compute_params);
    REQUIRE(opt.step(a) == TSR_OK);
    CHECK(p == std::vector<float>{0.5f, 1.5f});
    CHECK(copy == std::vector<float>{-7.0f, -7.0f});
    // Too short for a field it needs: refused, nothing touched.
    a.struct_size = offsetof(tsr_optimizer_step_args, step);
    CHECK(opt.step(a) == TSR_ERR_INVALID);
    CHECK_THAT(f.host.last_error(), Contains("struct_size"));
    CHECK(p == std::vector<float>{0.5f, 1.5f});
  }
  SECTION("bad arguments come back as status codes with the plugin's message") {
    Optimizer opt(f, "signsgd", "");
    std::vector<float> p = {1.0f, 1.0f}, g = {1.0f, -1.0f};
    std::vector<tsr_segment> outside = {{1, 2, 0}};
    auto a = step_args(p, g, nullptr, outside, 0.5, 1);
    CHECK(opt.step(a) == TSR_ERR_INVALID);
    CHECK_THAT(f.host.last_error(), Contains("signsgd: segment 0 [1, 1 + 2) lies outside [0, 2)"));
    std::vector<tsr_segment> segs = {{0, 2, 0}};
    a = step_args(p, g, nullptr, segs, 0.5, 1);
    a.device = DLDevice{kDLCUDA, 0};
    CHECK(opt.step(a) == TSR_ERR_UNSUPPORTED);
    CHECK_THAT(f.host.last_error(), Contains("only runs on the CPU"));
    a = step_args(p, g, nullptr, segs, 0.5, 0);
    CHECK(opt.step(a) == TSR_ERR_INVALID);
    CHECK_THAT(f.host.last_error(), Contains("step counts from 1"));
    CHECK(p == std::vector<float>{1.0f, 1.0f});
  }
}
// ---------------------------------------------------------------------------
// The shipped plugins, and the struct_size rule itself.

TEST_CASE("the shipped plugins all load, and no test plugin is among them", "[abi]") {
  Registry r;
  r.scan({TESSERA_TEST_PLUGIN_DIR});
  for (const auto &why : r.refusals()) FAIL_CHECK("refused: " << why);
  const std::pair<const char *, const char *> expected[] = {
      {"model", "mlp"},          {"dataset", "idx"},   {"sampler", "distributed"},
      {"sampler", "sequential"}, {"optimizer", "sgd"}, {"optimizer", "adam"},
      {"optimizer", "adamw"},    {"zero", "stage0"},   {"offload", "none"},
  };
  for (const auto &[kind, name] : expected) {
    INFO(kind << " " << name);
    const PluginEntry *e = r.find(kind, name);
    REQUIRE(e != nullptr);
    CHECK(e->file.rfind(TESSERA_TEST_PLUGIN_DIR, 0) == 0);
    CHECK(e->desc->struct_size >= sizeof(tsr_plugin_descriptor));
    CHECK(*static_cast<const size_t *>(e->desc->vtable) >= tessera::kind_vtable_min_size(kind));
  }
  for (const char *test_only :
       {"signsgd", "twin", "twin-turbo", "thrower", "hidden", "stubby", "shorty", "gizmo"})
    for (const auto &e : r.plugins()) CHECK_THAT(e.desc->name, !Equals(test_only));
}

TEST_CASE("TSR_HAS_FIELD reads struct_size, not the reader's sizeof", "[abi]") {
  using Args = tsr_optimizer_step_args;
  Args a;
  std::memset(&a, 0, sizeof a);

  a.struct_size = sizeof(Args);
  CHECK(TSR_HAS_FIELD(&a, Args, struct_size));
  CHECK(TSR_HAS_FIELD(&a, Args, compute_dtype));

  // An older writer whose struct ended before the compute copy.
  a.struct_size = offsetof(Args, compute_params);
  CHECK(TSR_HAS_FIELD(&a, Args, params));
  CHECK(TSR_HAS_FIELD(&a, Args, stream));
  CHECK_FALSE(TSR_HAS_FIELD(&a, Args, compute_params));
  CHECK_FALSE(TSR_HAS_FIELD(&a, Args, compute_dtype));

  // A field must lie wholly inside struct_size.
  a.struct_size = offsetof(Args, compute_params) + sizeof(void *) - 1;
  CHECK_FALSE(TSR_HAS_FIELD(&a, Args, compute_params));
  a.struct_size = offsetof(Args, compute_params) + sizeof(void *);
  CHECK(TSR_HAS_FIELD(&a, Args, compute_params));
  CHECK_FALSE(TSR_HAS_FIELD(&a, Args, compute_dtype));

  // Only struct_size is read: a truncated struct allocated at its own size.
  const size_t short_size = offsetof(tsr_plugin_descriptor, vtable);
  void *block = std::malloc(short_size);
  REQUIRE(block != nullptr);
  std::memset(block, 0, short_size);
  std::memcpy(block, &short_size, sizeof short_size);
  const auto *d = static_cast<const tsr_plugin_descriptor *>(block);
  CHECK(TSR_HAS_FIELD(d, tsr_plugin_descriptor, devices));
  CHECK_FALSE(TSR_HAS_FIELD(d, tsr_plugin_descriptor, vtable));
  std::free(block);

  const Args *none = nullptr;
  CHECK_FALSE(TSR_HAS_FIELD(none, Args, struct_size));
}

}  // namespace unit_test_abi
