// The C ABI from the host's side, with the test plugins of tests/plugins
// (one folder per case under TESSERA_TEST_BAD_PLUGIN_DIR):
//  - a plugin written in plain C99 loads, its declared parameters validate,
//    and it runs real steps;
//  - libraries the host must refuse (no entry symbol, another ABI major, a
//    short descriptor or function table, an unknown kind, a duplicate name)
//    are refused by load_file with a message naming the file and the reason,
//    and by scan() without losing the good plugin beside them;
//  - a plugin's own error message, and exceptions caught by sdk::guard,
//    reach the engine as a status code and a message;
//  - the shipped plugins all load; TSR_HAS_FIELD on truncated structs.
#include <stdlib.h>
#include <tessera/optimizer.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <tessera/cpp/plugin.hpp>
#include <tuple>
#include <utility>
#include <vector>

#include "config/config.hpp"
#include "plugin/registry.hpp"
#include "support/fixture.hpp"
#include "train/job.hpp"
#include "train/session.hpp"
#include "util/error.hpp"

namespace {

namespace fs = std::filesystem;
namespace sdk = tessera::sdk;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;
using tessera::PluginEntry;
using tessera::Registry;
using tessera::test::Fixture;

// The folder of one test case, and a library in it: tests/plugins builds
// target T of case C as <test-plugins>/C/libT.so.
std::string case_dir(const std::string &name) {
  return std::string(TESSERA_TEST_BAD_PLUGIN_DIR) + "/" + name;
}
std::string test_lib(const std::string &case_name, const std::string &target) {
  return case_dir(case_name) + "/lib" + target + ".so";
}
// The good C plugin built next to each refused library, sorting after it.
std::string companion_lib(const std::string &case_name) {
  return test_lib(case_name, "tsr_test_" + case_name + "_good");
}

// The message load_file refuses `path` with. Fails the test when the library
// loads, or when anything but a tessera::Error comes out; checks that
// nothing of the refused library was registered.
std::string refusal(Registry &r, const std::string &path) {
  INFO(path);
  REQUIRE(fs::is_regular_file(path));
  const size_t before = r.plugins().size();
  std::string message;
  bool refused = false;
  try {
    r.load_file(path);
  } catch (const tessera::Error &e) {
    refused = true;
    message = e.what();
  }
  REQUIRE(refused);
  CHECK(r.plugins().size() == before);
  return message;
}

// Scans one case's folder and returns its refusals, after checking that the
// good C plugin beside the refused libraries was still registered.
std::vector<std::string> scan_case(Registry &r, const std::string &case_name) {
  r.scan({case_dir(case_name)});
  const PluginEntry *good = r.find("optimizer", "signsgd");
  for (const auto &why : r.refusals()) UNSCOPED_INFO("refused: " << why);
  REQUIRE(good != nullptr);
  CHECK(good->file == companion_lib(case_name));
  return r.refusals();
}

std::string bytes(size_t n) {
  return std::to_string(n) + " bytes";
}

// Checks that `message` mentions every one of `parts`.
void check_mentions(const std::string &message, const std::vector<std::string> &parts) {
  INFO(message);
  for (const auto &part : parts) CHECK_THAT(message, Contains(part));
}

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

// Step args over whole vectors; `state` may be empty.
tsr_optimizer_step_args step_args(std::vector<float> &params, const std::vector<float> &grads,
                                  float *const *state, const std::vector<tsr_segment> &segments,
                                  double lr, int64_t step, double grad_scale = 1.0) {
  auto a = sdk::make<tsr_optimizer_step_args>();
  a.device = DLDevice{kDLCPU, 0};
  a.params = params.data();
  a.grads = grads.data();
  a.state = state;
  a.n = params.size();
  a.segments = segments.data();
  a.num_segments = segments.size();
  a.lr = lr;
  a.grad_scale = grad_scale;
  a.step = step;
  a.compute_dtype = sdk::dtype_f32();
  return a;
}

// A fresh directory, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tessera_abi_XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string &name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

void write_bytes(const std::string &path, const std::vector<uint8_t> &data) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char *>(data.data()), static_cast<std::streamsize>(data.size()));
  REQUIRE(out.good());
}

// An IDX file: big-endian magic and dimensions, then the bytes.
std::vector<uint8_t> idx_file(uint32_t magic, const std::vector<uint32_t> &dims,
                              const std::vector<uint8_t> &data) {
  std::vector<uint8_t> out;
  auto be32 = [&](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
  };
  be32(magic);
  for (uint32_t d : dims) be32(d);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

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
// Libraries the host refuses.

TEST_CASE("a library that exports no entry symbol is refused", "[abi]") {
  const std::string lib = test_lib("no_entry", "tsr_test_no_entry");
  const std::string reason = "no '" TSR_ENTRY_SYMBOL "' symbol exported";
  SECTION("load_file") {
    Registry r;
    check_mentions(refusal(r, lib), {lib, "not a tessera plugin", reason});
  }
  SECTION("scan") {
    Registry r;
    auto refusals = scan_case(r, "no_entry");
    REQUIRE(refusals.size() == 1);
    check_mentions(refusals[0], {lib, reason});
    // Its (hidden) entry point was not found some other way.
    CHECK(r.find("optimizer", "hidden") == nullptr);
    CHECK(r.plugins().size() == 1);
  }
}

TEST_CASE("a library built for another ABI major is refused naming both versions", "[abi]") {
  const std::string lib = test_lib("abi_major", "tsr_test_abi_major");
  // The host names its own version, whatever the current minor is.
  static_assert(TSR_ABI_MAJOR != 2, "the test library claims ABI 2.3: another major than ours");
  const std::string ours =
      "ABI " + std::to_string(TSR_ABI_MAJOR) + "." + std::to_string(TSR_ABI_MINOR);
  SECTION("load_file") {
    Registry r;
    check_mentions(refusal(r, lib), {lib, "ABI 2.3", ours});
  }
  SECTION("scan") {
    Registry r;
    auto refusals = scan_case(r, "abi_major");
    REQUIRE(refusals.size() == 1);
    check_mentions(refusals[0], {lib, "ABI 2.3", ours});
  }
}

TEST_CASE("a plugin descriptor smaller than the 1.0 descriptor is refused", "[abi]") {
  const std::string lib = test_lib("small_descriptor", "tsr_test_small_descriptor");
  // The 1.0 descriptor ends with its function table pointer.
  const size_t v1_size = offsetof(tsr_plugin_descriptor, vtable) + sizeof(const void *);
  const size_t given = offsetof(tsr_plugin_descriptor, vtable);
  const std::vector<std::string> expected = {lib, "descriptor", "smaller", bytes(given),
                                             bytes(v1_size)};
  SECTION("load_file") {
    Registry r;
    check_mentions(refusal(r, lib), expected);
  }
  SECTION("scan") {
    Registry r;
    auto refusals = scan_case(r, "small_descriptor");
    REQUIRE(refusals.size() == 1);
    check_mentions(refusals[0], expected);
    CHECK(r.find("optimizer", "stubby") == nullptr);
  }
}

TEST_CASE("a kind function table smaller than the 1.0 table is refused", "[abi]") {
  const std::string lib = test_lib("small_vtable", "tsr_test_small_vtable");
  REQUIRE(tessera::kind_vtable_min_size("optimizer") == sizeof(tsr_optimizer_vtable));
  const std::vector<std::string> expected = {lib,
                                             "'shorty'",
                                             "optimizer function table",
                                             "smaller",
                                             bytes(offsetof(tsr_optimizer_vtable, step)),
                                             bytes(sizeof(tsr_optimizer_vtable))};
  SECTION("load_file") {
    Registry r;
    check_mentions(refusal(r, lib), expected);
  }
  SECTION("scan") {
    Registry r;
    auto refusals = scan_case(r, "small_vtable");
    REQUIRE(refusals.size() == 1);
    check_mentions(refusals[0], expected);
    CHECK(r.find("optimizer", "shorty") == nullptr);
  }
}

TEST_CASE("a plugin of an unknown kind is refused", "[abi]") {
  const std::string lib = test_lib("unknown_kind", "tsr_test_unknown_kind");
  CHECK(tessera::kind_short_name("tessera.widget/1").empty());
  CHECK(tessera::kind_short_name("tessera.optimizer/2").empty());  // the revision counts
  CHECK(tessera::kind_short_name(TSR_KIND_OPTIMIZER) == "optimizer");
  const std::vector<std::string> expected = {lib, "'gizmo'", "unknown kind", "'tessera.widget/1'"};
  SECTION("load_file") {
    Registry r;
    check_mentions(refusal(r, lib), expected);
  }
  SECTION("scan") {
    Registry r;
    auto refusals = scan_case(r, "unknown_kind");
    REQUIRE(refusals.size() == 1);
    check_mentions(refusals[0], expected);
    for (const auto &e : r.plugins()) CHECK_THAT(e.desc->name, !Equals("gizmo"));
  }
}

TEST_CASE("two libraries declaring the same plugin: the second is refused naming both", "[abi]") {
  const std::string a = test_lib("duplicate", "tsr_test_duplicate_a");
  const std::string b = test_lib("duplicate", "tsr_test_duplicate_b");
  auto count_twins = [](const Registry &r) {
    size_t n = 0;
    for (const auto &e : r.plugins()) n += std::string(e.desc->name) == "twin";
    return n;
  };
  SECTION("load_file, in either order: the first one loaded stays") {
    for (const auto &[first, second, version] :
         {std::tuple{a, b, "1.0.0-a"}, std::tuple{b, a, "1.0.0-b"}}) {
      Registry r;
      REQUIRE_NOTHROW(r.load_file(first));
      check_mentions(refusal(r, second), {first, second, "'twin'"});
      const PluginEntry *twin = r.find("optimizer", "twin");
      REQUIRE(twin != nullptr);
      CHECK(twin->file == first);
      CHECK_THAT(twin->desc->version, Equals(version));
      CHECK(count_twins(r) == 1);
    }
  }
  SECTION("scan") {
    Registry r;
    auto refusals = scan_case(r, "duplicate");
    REQUIRE(refusals.size() == 1);
    check_mentions(refusals[0], {a, b, "'twin'"});
    const PluginEntry *twin = r.find("optimizer", "twin");
    REQUIRE(twin != nullptr);
    CHECK(twin->file == a);
    CHECK(count_twins(r) == 1);
    CHECK(r.plugins().size() == 2);  // twin and signsgd
  }
}

// ---------------------------------------------------------------------------
// Failures inside plugins reach the engine as status + message.

TEST_CASE("a plugin's own create error reaches the engine with its message", "[abi]") {
  Fixture f;
  f.registry.scan({case_dir("create_fails")});
  REQUIRE(f.registry.refusals().empty());
  const auto *vt = f.vtable<tsr_optimizer_vtable>("optimizer", "twin-turbo");
  const std::string what = "[optimizer] plugin 'twin-turbo'";

  SECTION("refused: TSR_ERR_CONFIG, host.last_error(), and plugin_ok's tessera::Error") {
    tsr_config *cfg = f.config("optimizer", "twin-turbo");  // warp = 0, allowed by the declaration
    int marker = 0;
    void *self = &marker;
    tsr_status s = vt->create(f.host.table(), cfg, &self);
    CHECK(s == TSR_ERR_CONFIG);
    CHECK(self == nullptr);
    CHECK(f.host.last_error() == "twin-turbo needs a positive warp factor (got 0)");
    bool thrown = false;
    try {
      tessera::plugin_ok(f.host, s, what);
    } catch (const tessera::Error &e) {
      thrown = true;
      CHECK(e.code() == TSR_ERR_CONFIG);
      CHECK_THAT(e.what(), Equals(what + ": twin-turbo needs a positive warp factor (got 0)"));
    }
    CHECK(thrown);
    CHECK(f.host.last_error().empty());  // consumed by plugin_ok
  }
  SECTION("accepted with a positive warp") {
    tsr_config *cfg = f.config("optimizer", "twin-turbo", "warp = 9");
    void *self = nullptr;
    tsr_status s = vt->create(f.host.table(), cfg, &self);
    INFO(f.host.last_error());
    REQUIRE(s == TSR_OK);
    CHECK(self != nullptr);
    CHECK_NOTHROW(tessera::plugin_ok(f.host, s, what));
    vt->destroy(self);
  }
}

TEST_CASE("a run whose optimizer refuses its config stops with the plugin's message", "[abi]") {
  // A whole job: tiny IDX data, the shipped mlp, and twin-turbo from its
  // test folder; the Session creates plugins in order and reports through
  // plugin_ok.
  TempDir dir;
  write_bytes(dir.file("images.idx"), idx_file(0x803, {4, 2, 2}, std::vector<uint8_t>(16, 128)));
  write_bytes(dir.file("labels.idx"), idx_file(0x801, {4}, {0, 1, 0, 1}));
  auto job_with_warp = [&](const std::string &warp) {
    const std::string path = dir.file("job.toml");
    std::ofstream(path) << "[batch]\nmicro = 2\n"
                        << "[model]\nplugin = \"mlp\"\nhidden = [3]\n"
                        << "[data.train]\nplugin = \"idx\"\nimages = '" << dir.file("images.idx")
                        << "'\nlabels = '" << dir.file("labels.idx") << "'\n"
                        << "[optimizer]\nplugin = \"twin-turbo\"\n"
                        << warp;
    tessera::JobOptions opts;
    opts.config_path = path;
    opts.plugin_paths = {case_dir("create_fails"), TESSERA_TEST_PLUGIN_DIR};
    return tessera::load_job(opts, 1, true);
  };

  tessera::Job refused = job_with_warp("");
  REQUIRE(refused.registry->refusals().empty());
  std::string message;
  try {
    tessera::Session session(refused, tessera::Host::RunFacts{}, true);
  } catch (const tessera::Error &e) {
    message = e.what();
    CHECK(e.code() == TSR_ERR_CONFIG);
  }
  check_mentions(
      message, {"[optimizer]", "'twin-turbo'", "twin-turbo needs a positive warp factor (got 0)"});

  // The same job with a positive warp gets past the optimizer.
  tessera::Job accepted = job_with_warp("warp = 2\n");
  tessera::Session session(accepted, tessera::Host::RunFacts{}, true);
  CHECK(session.optimizer.self != nullptr);
  CHECK(session.optimizer.name == "twin-turbo");
}

TEST_CASE("exceptions thrown inside sdk::guard come back as a status and a message", "[abi]") {
  Fixture f;
  f.registry.scan({case_dir("throws")});
  // A C++ plugin: its entry point is an ordinary one and loads.
  REQUIRE(f.registry.refusals().empty());
  const PluginEntry *e = f.registry.find("optimizer", "thrower");
  REQUIRE(e != nullptr);
  CHECK(e->file == test_lib("throws", "tsr_test_throws"));
  const auto *vt = static_cast<const tsr_optimizer_vtable *>(e->desc->vtable);

  SECTION("from create") {
    struct Case {
      const char *create_throws;
      tsr_status code;
      const char *message;
    };
    const Case cases[] = {
        {"std", TSR_ERR_INTERNAL, "unhandled exception: thrower: create blew up"},
        {"other", TSR_ERR_INTERNAL, "unhandled non-standard exception"},
        {"sdk", TSR_ERR_CONFIG, "thrower: create refused on request"},
        {"nomem", TSR_ERR_NO_MEMORY, "out of host memory"},
        // A failing host call: the host's own message stays.
        {"host", TSR_ERR_CONFIG,
         "config [optimizer] key 'no_such_key': not declared by the plugin"},
    };
    for (const Case &c : cases) {
      INFO("create_throws = " << c.create_throws);
      tsr_config *cfg = f.config("optimizer", "thrower",
                                 std::string("create_throws = \"") + c.create_throws + "\"");
      f.host.clear_error();
      int marker = 0;
      void *self = &marker;
      tsr_status s = vt->create(f.host.table(), cfg, &self);
      CHECK(s == c.code);
      CHECK(self == nullptr);
      CHECK(f.host.last_error() == c.message);
      CHECK_THROWS_WITH(tessera::plugin_ok(f.host, s, "[optimizer] plugin 'thrower'"),
                        Equals(std::string("[optimizer] plugin 'thrower': ") + c.message));
    }
  }
  SECTION("from step") {
    for (const auto &[step_throws, message] :
         {std::pair{"std", "unhandled exception: thrower: step blew up"},
          std::pair{"other", "unhandled non-standard exception"}}) {
      INFO("step_throws = " << step_throws);
      tsr_config *cfg =
          f.config("optimizer", "thrower", std::string("step_throws = \"") + step_throws + "\"");
      void *self = nullptr;
      tsr_status s = vt->create(f.host.table(), cfg, &self);
      INFO(f.host.last_error());
      REQUIRE(s == TSR_OK);
      REQUIRE(self != nullptr);
      std::vector<float> p = {1.0f}, g = {1.0f};
      std::vector<tsr_segment> segs = {{0, 1, 0}};
      auto a = step_args(p, g, nullptr, segs, 0.1, 1);
      f.host.clear_error();
      s = vt->step(self, &a);
      CHECK(s == TSR_ERR_INTERNAL);
      CHECK(f.host.last_error() == message);
      CHECK_THROWS_WITH(tessera::plugin_ok(f.host, s, "[optimizer] plugin 'thrower' step"),
                        Contains(message));
      vt->destroy(self);
    }
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
