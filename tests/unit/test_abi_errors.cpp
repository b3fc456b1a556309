// The C ABI's errors, with the test plugins of tests/plugins (one folder
// per case under TESSERA_TEST_BAD_PLUGIN_DIR):
//  - libraries the host must refuse (no entry symbol, another ABI major, a
//    short descriptor or function table, an unknown kind, a duplicate name)
//    are refused by load_file with a message naming the file and the reason,
//    and by scan() without losing the good plugin beside them;
//  - a plugin's own error message, and exceptions caught by sdk::guard,
//    reach the engine as a status code and a message.
#include <stdlib.h>
#include <tessera/optimizer.h>
#include <tessera/zero.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "abi_support.hpp"
#include "plugin/registry.hpp"
#include "support/fixture.hpp"
#include "support/temp_dir.hpp"
#include "train/job.hpp"
#include "train/session.hpp"
#include "util/error.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_abi_errors {

using namespace tessera::test::abi_support;

namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;
using Catch::Matchers::StartsWith;
using tessera::PluginEntry;
using tessera::Registry;
using tessera::test::Fixture;

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

using TempDir = tessera::test::TempDir;

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

// Zero plugins ship with tessera, which serves them from the minor that
// split the step (1.2) on; every other kind loads from 1.0 on
// (tests/abi_1_0 trains with a frozen 1.0 set of them).
TEST_CASE("a zero plugin built before ABI 1.2 is refused naming it and its file", "[abi]") {
  const std::string lib = test_lib("zero_before_1_2", "tsr_test_zero_before_1_2");
  const std::vector<std::string> expected = {lib,
                                             "'old_zero'",
                                             "zero plugin built before ABI 1.2",
                                             "reshare and clear_grads",
                                             bytes(offsetof(tsr_zero_vtable, reshare)),
                                             "rebuild it against this SDK"};
  SECTION("load_file") {
    Registry r;
    check_mentions(refusal(r, lib), expected);
  }
  SECTION("scan") {
    Registry r;
    auto refusals = scan_case(r, "zero_before_1_2");
    REQUIRE(refusals.size() == 1);
    check_mentions(refusals[0], expected);
    CHECK(r.find("zero", "old_zero") == nullptr);
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
      // The plugin's message, then the status by name and the calling line.
      CHECK_THAT(e.what(), StartsWith(what + ": twin-turbo needs a positive warp factor (got 0) "
                                             "(TSR_ERR_CONFIG, "));
      // The user reads the message without them (the debug log has them).
      CHECK(tessera::user_message(e.what()) ==
            what + ": twin-turbo needs a positive warp factor (got 0)");
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
                        StartsWith(std::string("[optimizer] plugin 'thrower': ") + c.message +
                                   " (" + tessera::status_name(c.code) + ", "));
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

}  // namespace unit_test_abi_errors

TEST_CASE("what the user reads of an error leaves out the status name and the engine line",
          "[abi]") {
  using tessera::user_message;
  // plugin_ok's note: the step stays, the status and the line go.
  CHECK(user_message("[optimizer] plugin 'sgd' update: diverged (TSR_ERR_INVALID at step 12, "
                     "engine/train/step.cpp:170)") ==
        "[optimizer] plugin 'sgd' update: diverged (at step 12)");
  CHECK(user_message("[model] plugin 'mlp' create: no (TSR_ERR_CONFIG, engine/train/session.cpp:"
                     "267)") == "[model] plugin 'mlp' create: no");
  // TSR_CHECK's note, with the build machine's path, inside a longer text.
  CHECK(user_message("--ckpt x: 3 parameters, model has 4 (/home/b/tessera/engine/ckpt/"
                     "manifest.cpp:80); start from scratch") ==
        "--ckpt x: 3 parameters, model has 4; start from scratch");
  // Parentheses the message's author wrote stay.
  const std::string own = "data.path (a directory): no shards (expected *.bin); see docs/data.md";
  CHECK(user_message(own) == own);
  CHECK(user_message("[zero] plugin 'z' (libz.so): bucket (TSR_ERR_X) too small") ==
        "[zero] plugin 'z' (libz.so): bucket (TSR_ERR_X) too small");
}
