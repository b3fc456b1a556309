// Config messages that say what to do (issue 22): a key given without its
// section, --unset and the hint that names it, run.plugin_path beside the
// config file, and the batch rule left to training.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "config_support.hpp"
#include "train/job.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_config_messages {

using namespace tessera::test::config_support;

namespace {

// A function, not a constant: edit() asserts, and Catch2 cannot take an
// assertion before main (the test binary would die while being listed).
std::string sgd_config() {
  return edit(kBase, "lr = 0.1", "lr = 0.1\nmomentum = 0.9");
}

}  // namespace

TEST_CASE("a key without its section suggests the section that has it", "[config][set]") {
  TempDir dir;
  std::string msg = error_of([&] { load_text(dir, kBase, {"log_every=100"}); });
  CHECK(msg ==
        "--set log_every=100: unknown section or key 'log_every'; did you mean "
        "'run.log_every'?");
  msg = error_of([&] { load_text(dir, "micro = 8\n" + kBase); });
  CHECK_THAT(msg, Catch::Contains("did you mean 'batch.micro'?"));
}

TEST_CASE("an --unset removes a key or a section before the --set overrides", "[config][set]") {
  TempDir dir;
  SECTION("another plugin's key: the error names --unset, and --unset fixes it") {
    std::string msg = error_of([&] { load_text(dir, sgd_config(), {"optimizer.plugin=adam"}); });
    CHECK_THAT(msg, Catch::Contains("unknown key 'momentum' in [optimizer]") &&
                        Catch::Contains("(--set optimizer.plugin=adam keeps the file's other "
                                        "[optimizer] keys; --set cannot remove one: add --unset "
                                        "optimizer.momentum)"));
    tessera::JobOptions o =
        options(dir.write("unit.toml", sgd_config()), {"optimizer.plugin=adam"});
    o.unsets = {"optimizer.momentum"};
    tessera::Job job = tessera::load_job(o, 1, true);
    CHECK(job.plugin("optimizer").entry->desc->name == std::string("adam"));
  }
  SECTION("a whole section, then set afresh") {
    tessera::JobOptions o =
        options(dir.write("unit.toml", sgd_config()), {"optimizer.plugin=adam"});
    o.unsets = {"optimizer"};
    tessera::Job job = tessera::load_job(o, 1, true);
    CHECK(job.plugin("optimizer").values["lr"].value_or(0.0) == 0.001);  // adam's default
  }
  SECTION("a key that is not there") {
    tessera::JobOptions o = options(dir.write("unit.toml", sgd_config()));
    o.unsets = {"optimizer.momentun"};
    std::string msg = error_of([&] { tessera::load_job(o, 1, true); });
    CHECK(msg ==
          "--unset optimizer.momentun: the config has no 'optimizer.momentun' to remove; "
          "did you mean 'optimizer.momentum'?");
  }
  SECTION("no hint when the file itself chose the plugin") {
    std::string msg = error_of([&] { load_text(dir, kBase + "betas = [0.9, 0.99]\n"); });
    CHECK_THAT(msg, !Catch::Contains("--unset"));
  }
}

TEST_CASE("run.plugin_path is relative to the config file, and resolved absolute",
          "[config][plugins]") {
  TempDir dir;
  std::filesystem::create_directories(dir.file("conf/extra"));
  const std::string text = edit(kBase, "seed = 1", "seed = 1\nplugin_path = [\"extra\"]");
  tessera::Job job = tessera::load_job(options(dir.write("conf/unit.toml", text)), 1, true);
  const std::string want = dir.file("conf/extra");
  REQUIRE(job.settings.plugin_path.size() == 1);
  CHECK(job.settings.plugin_path[0] == want);
  CHECK_THAT(job.resolved_toml(), Catch::Contains("\"" + want + "\""));
}

TEST_CASE("an unknown plugin names the directories searched", "[config][plugins]") {
  TempDir dir;
  std::string msg = error_of([&] { load_text(dir, edit(kBase, "\"mlp\"", "\"mymodel\"")); });
  CHECK_THAT(msg, Catch::Contains("no model plugin named 'mymodel'") &&
                      Catch::Contains("; searched " TESSERA_TEST_PLUGIN_DIR) &&
                      Catch::Contains("--plugin-path DIR (or run.plugin_path"));
}

TEST_CASE("evaluation needs batch.micro only, training the batch rule", "[config][eval]") {
  TempDir dir;
  // A run's config.toml from 2 ranks: global = micro x world = 16.
  const std::string text = edit(kBase, "micro = 8", "global = 16\nmicro = 8\naccumulation = 1");
  const std::string path = dir.write("unit.toml", text);
  tessera::Job eval = tessera::load_job(options(path), 1, false);
  CHECK(eval.settings.micro_batch == 8);
  std::string msg = error_of([&] { tessera::load_job(options(path), 1, true); });
  CHECK_THAT(msg, Catch::Contains("batch sizes do not fit"));
  // The resolved config keeps no DeepSpeed JSON to apply again.
  CHECK_THAT(eval.resolved_toml(), Catch::Contains("deepspeed = \"\""));
}

}  // namespace unit_test_config_messages
