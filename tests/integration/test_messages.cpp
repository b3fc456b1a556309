// What a user sees when something is off (issue 22): config errors once per
// job, before any worker starts; DeepSpeed-JSON warnings once; --set and
// --unset; plugin directories; shapes on a load; the schedule a DeepSpeed
// JSON leaves in place. The text each message shows is asserted.
#include <catch2/catch.hpp>
#include <string>

#include "harness.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace itest_test_messages {

using namespace tessera::itest;

namespace {

size_t count_of(const std::string &text, const std::string &part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

RunResult check_config(const fs::path &config, std::vector<std::string> args = {}) {
  args.insert(args.begin(), {"config", "check", config.string()});
  return run_cli(args);
}

// The harness config with [optimizer] replaced by sgd with momentum.
fs::path sgd_config(const Setup &s) {
  std::string text = read_text(s.config);
  const std::string adam = "plugin = \"adam\"\nlr = 0.01\n";
  REQUIRE(contains(text, adam));
  text.replace(text.find(adam), adam.size(), "plugin = \"sgd\"\nlr = 0.01\nmomentum = 0.9\n");
  const fs::path p = scratch() / "sgd.toml";
  write_text(p, text);
  return p;
}

}  // namespace

TEST_CASE("a 3-rank job with a config error prints it once, before any worker starts",
          "[messages][launcher]") {
  Setup s = setup();
  std::string text = read_text(s.config);
  REQUIRE(contains(text, "seed = 42"));
  text.replace(text.find("seed = 42"), 9, "sed = 42");
  write_text(s.config, text);
  RunResult r = run_cli({"run", "-n", "3", s.config.string()});
  INFO(describe(r));
  CHECK(r.status == 1);
  CHECK(count_of(r.all(), "unknown key 'sed' in [run]; did you mean 'seed'?") == 1);
  CHECK(contains(r.err, "tessera run: error: " + s.config.string() + ":"));
  CHECK(!contains(r.all(), "[rank "));  // no worker ever started
}

TEST_CASE("DeepSpeed-JSON warnings are printed once per job, not per rank",
          "[messages][launcher][deepspeed]") {
  Setup s = setup();
  const fs::path ds = scratch() / "ds.json";
  write_text(ds, R"({"prescale_gradients": false, "steps_per_print": 5,
                      "activation_checkpointing": {"cpu_checkpointing": true}})");
  RunResult r = run_cli({"run", "-n", "2", s.config.string(), "--deepspeed_config", ds.string(),
                         "--set", "run.steps=5"});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  CHECK(count_of(r.err, "'prescale_gradients' is not used by tessera; ignored") == 1);
  CHECK(count_of(r.err, "activation_checkpointing.cpu_checkpointing is not used by tessera") == 1);
  // The one the launcher finds only with the plugins loaded, once too.
  CHECK(count_of(r.err, ds.string() +
                            ": activation_checkpointing: the model plugin 'mlp' has no "
                            "'recompute' parameter (activation checkpointing); ignored") == 1);
}

TEST_CASE("a DeepSpeed key that DeepSpeed does not know is an error with a did-you-mean",
          "[messages][deepspeed]") {
  Setup s = setup();
  const fs::path ds = scratch() / "ds.json";
  write_text(ds, R"({"train_batch_sise": 64})");
  RunResult r = check_config(s.config, {"--deepspeed_config", ds.string()});
  INFO(describe(r));
  CHECK(r.status == 1);
  CHECK(contains(r.err, ds.string() + ": 'train_batch_sise' is not a DeepSpeed config key; did "
                                      "you mean 'train_batch_size'?"));
}

TEST_CASE("a DeepSpeed optimizer without a scheduler says which schedule applies",
          "[messages][deepspeed]") {
  Setup s = setup("\n[schedule]\ntype = \"warmup\"\nwarmup_steps = 10\n");
  const fs::path ds = scratch() / "ds.json";
  write_text(ds, R"({"optimizer": {"type": "SGD", "params": {"lr": 0.01}}})");
  RunResult r = check_config(s.config, {"--deepspeed_config", ds.string()});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  CHECK(contains(r.err, ds.string() +
                            " sets an optimizer but no scheduler: the learning rate "
                            "follows the " +
                            s.config.string() + ":"));
  CHECK(contains(r.err,
                 "[schedule] 'warmup' (warmup_steps 10), where DeepSpeed would keep it "
                 "constant; add --set schedule.type=constant"));
}

TEST_CASE("a --set with a key and no section suggests the section", "[messages][set]") {
  Setup s = setup();
  RunResult r = check_config(s.config, {"--set", "log_every=100"});
  INFO(describe(r));
  CHECK(r.status == 1);
  CHECK(contains(r.err,
                 "--set log_every=100: unknown section or key 'log_every'; did you mean "
                 "'run.log_every'?"));
}

TEST_CASE("a --set of another plugin names --unset for the keys it does not take",
          "[messages][set]") {
  Setup s = setup();
  const fs::path sgd = sgd_config(s);
  RunResult r = check_config(sgd, {"--set", "optimizer.plugin=adam"});
  INFO(describe(r));
  CHECK(r.status == 1);
  CHECK(contains(r.err, "unknown key 'momentum' in [optimizer]"));
  CHECK(contains(r.err,
                 "(--set optimizer.plugin=adam keeps the file's other [optimizer] keys; "
                 "--set cannot remove one: add --unset optimizer.momentum)"));
  // ...and --unset does it.
  r = check_config(sgd, {"--set", "optimizer.plugin=adam", "--unset", "optimizer.momentum"});
  INFO(describe(r));
  CHECK(r.status == 0);
  CHECK(!contains(r.out, "momentum"));
  // A key that is not there is named, with the closest one.
  r = check_config(sgd, {"--unset", "optimizer.momentun"});
  INFO(describe(r));
  CHECK(r.status == 1);
  CHECK(contains(r.err,
                 "--unset optimizer.momentun: the config has no 'optimizer.momentun' to "
                 "remove; did you mean 'optimizer.momentum'?"));
}

TEST_CASE("an unknown model plugin names the directories searched and --plugin-path",
          "[messages][plugins]") {
  Setup s = setup();
  // run.plugin_path is relative to the config file, as run.deepspeed is.
  const fs::path sub = scratch() / "cfg";
  fs::create_directories(sub / "myplugins");
  std::string text = read_text(s.config);
  text.replace(text.find("plugin = \"mlp\""), 14, "plugin = \"mymodel\"");
  text.replace(text.find("[batch]"), 7, "plugin_path = [\"myplugins\"]\n\n[batch]");
  write_text(sub / "x.toml", text);
  RunOptions in_sub;
  in_sub.cwd = sub;
  RunResult r = run_cli({"config", "check", "x.toml"}, in_sub);
  INFO(describe(r));
  CHECK(r.status == 1);
  CHECK(contains(r.err, "no model plugin named 'mymodel'"));
  CHECK(contains(r.err, "; searched " + (sub / "myplugins").string() + ", "));
  CHECK(contains(r.err, "found with --plugin-path DIR (or run.plugin_path"));
  // From another directory the same config finds the same directory.
  r = run_cli({"config", "check", (sub / "x.toml").string()});
  CHECK(contains(r.err, "; searched " + (sub / "myplugins").string() + ", "));
}

TEST_CASE("loading a checkpoint into another shape names both shapes", "[messages][ckpt]") {
  Setup s = setup();
  RunResult r = run_cli({"run", s.config.string(), "--set", "run.steps=2"});
  REQUIRE(r.status == 0);
  const fs::path ckpt = s.run_dir / "ckpt";
  const fs::path file = scratch() / "model.safetensors";
  REQUIRE(run_cli({"ckpt", "export", ckpt.string(), "-o", file.string()}).status == 0);
  SECTION("eval from a step directory") {
    r = run_cli({"eval", s.config.string(), "--ckpt", ckpt.string(), "--set", "model.hidden=[8]"});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(contains(r.err,
                   "0.weight: checkpoint [16, 64], model [8, 64]; the config describes "
                   "another model than the one saved"));
  }
  SECTION("eval from a safetensors file") {
    r = run_cli({"eval", s.config.string(), "--ckpt", file.string(), "--set", "model.hidden=[8]"});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(contains(r.err, file.string() + ": 0.weight: file [16, 64], model [8, 64]"));
  }
  SECTION("resuming a run") {
    r = run_cli({"run", s.config.string(), "--set", "model.hidden=[8]", "--set",
                 "checkpoint.resume=auto", "--set", "run.steps=4"});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(contains(r.err, "0.weight: checkpoint [16, 64], model [8, 64]"));
  }
}

}  // namespace itest_test_messages
