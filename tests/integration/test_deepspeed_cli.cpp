// A DeepSpeed user's command lines (issues 53 and 54): the JSON running
// alone with its model and data from --model/--data or a TOML beside it,
// DeepSpeed's launcher forms (--deepspeed, --num_gpus, --include),
// --local_rank given to a launcher of several workers, what a TOML under a
// JSON adds, the offload ratio as a number, and `config check` refusing what
// the run would.
#include <toml++/toml.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "harness.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace itest_test_deepspeed_cli {

using namespace tessera::itest;

namespace {

// The config from our users' DeepSpeed tutorial, unchanged.
const char *kTutorialDs =
    R"({"train_batch_size": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.001, "momentum": 0.9}}})";

// [model] and [data.train] only: what a DeepSpeed user adds to the JSON.
std::string model_and_data(const Dataset &d) {
  return "[model]\nplugin = \"mlp\"\nhidden = [16]\n\n[data.train]\nplugin = \"idx\"\nimages = \"" +
         d.train_images.string() + "\"\nlabels = \"" + d.train_labels.string() + "\"\n";
}

RunResult ok(const std::vector<std::string> &args, const RunOptions &o = {}) {
  RunResult r = run_cli(args, o);
  INFO(describe(r));
  REQUIRE(r.status == 0);
  return r;
}

RunResult refused(const std::vector<std::string> &args, const RunOptions &o = {}) {
  RunResult r = run_cli(args, o);
  INFO(describe(r));
  CHECK(r.status != 0);
  CHECK(r.status < 128);
  return r;
}

int count(const std::string &text, const std::string &part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("a DeepSpeed JSON runs alone with a TOML of model and data beside it",
          "[run][deepspeed]") {
  Dataset data = write_dataset(scratch() / "data");
  fs::path ds = scratch() / "ds.json";
  write_text(ds, kTutorialDs);
  write_text(scratch() / "ds.toml", model_and_data(data));
  RunResult r = ok({"run", ds.string(), "--set", "run.dir=alone"});
  // One epoch (the JSON says nothing of how long), said at start; nothing
  // else implied: the TOML beside it adds model and data only.
  CHECK(contains(r.err, "run.epochs = 1"));
  CHECK_FALSE(contains(r.all(), "adds to"));
  nlohmann::json sum = read_json(scratch() / "alone" / "summary.json");
  CHECK(sum["steps"].get<int64_t>() == 512 / 4);
  toml::table t = toml::parse_file((scratch() / "alone" / "config.toml").string());
  CHECK(t["optimizer"]["plugin"].value_or(std::string()) == "sgd");
  CHECK(t["zero"]["plugin"].value_or(std::string()) == "stage0");
  CHECK(t["sampler"]["drop_last"].value_or(true) == false);
  CHECK(t["log"]["trace"].value_or(std::string("x")).empty());

  // DeepSpeed's own form: no CONFIG, the JSON in --deepspeed_config.
  r = ok({"run", "--deepspeed", "--deepspeed_config", ds.string(), "--set", "run.dir=ds_form",
          "--set", "run.steps=5"});
  CHECK(read_json(scratch() / "ds_form" / "summary.json")["steps"].get<int64_t>() == 5);
}

TEST_CASE("a DeepSpeed JSON alone takes its model and data from --model and --data",
          "[run][deepspeed]") {
  Dataset data = write_dataset(scratch() / "data");
  fs::path ds = scratch() / "conf" / "ds.json";
  write_text(ds, kTutorialDs);
  SECTION("missing: the error says where they come from") {
    RunResult r = refused({"run", ds.string()});
    CHECK(contains(r.err, ds.string()));
    CHECK(contains(r.err, "--model"));
    CHECK(contains(r.err, "--data"));
    CHECK(contains(r.err, (scratch() / "conf" / "ds.toml").string()));
    r = refused({"config", "check", ds.string()});
    CHECK(contains(r.err, "--model"));
  }
  SECTION("--model a plugin name, --data a TOML file") {
    fs::path d = scratch() / "data.toml";
    write_text(d, model_and_data(data) + "\n[data]\nworkers = 0\n");
    ok({"run", ds.string(), "--model", "mlp", "--data", d.string(), "--set", "run.dir=flags",
        "--set", "run.steps=4"});
    toml::table t = toml::parse_file((scratch() / "flags" / "config.toml").string());
    CHECK(t["model"]["plugin"].value_or(std::string()) == "mlp");
    // The TOML's [model] is not taken by --data: the mlp keeps its default.
    CHECK(t["model"]["hidden"].as_array()->size() == 2);
    CHECK(t["data"]["workers"].value_or(int64_t{-1}) == 0);
    CHECK(t["data"]["train"]["images"].value_or(std::string()) == data.train_images.string());
  }
}

TEST_CASE("settings a TOML under a DeepSpeed JSON adds are printed", "[run][deepspeed]") {
  Setup s = setup("\n[zero]\nplugin = \"stage1\"\n");
  fs::path ds = scratch() / "ds.json";
  write_text(ds, kTutorialDs);
  RunResult r = run_cli({"config", "check", s.config.string(), "--deepspeed_config", ds.string()});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  CHECK(count(r.err, "adds to " + ds.string()) == 1);
  CHECK(contains(r.err, "run.steps = 60"));
  CHECK(contains(r.err, "zero.plugin = \"stage1\""));
  // What the JSON replaced, and model and data, are not listed.
  CHECK_FALSE(contains(r.err, "optimizer.lr"));
  CHECK_FALSE(contains(r.err, "batch.micro"));
  CHECK_FALSE(contains(r.err, "model.hidden"));
}

TEST_CASE("configs/deepspeed-tutorial.toml brings model and data and nothing else",
          "[run][deepspeed]") {
  fs::path ds = scratch() / "ds.json";
  write_text(ds, kTutorialDs);
  const std::string tutorial = std::string(TESSERA_SOURCE_DIR) + "/configs/deepspeed-tutorial.toml";
  RunResult r = ok({"config", "check", tutorial, "--deepspeed_config", ds.string()});
  CHECK_FALSE(contains(r.err, "adds to"));
  toml::table t = toml::parse(r.out.substr(r.out.find('\n') + 1));
  CHECK(t["optimizer"]["plugin"].value_or(std::string()) == "sgd");
  CHECK(t["batch"]["global"].value_or(int64_t{0}) == 4);
  CHECK(t["run"]["epochs"].value_or(int64_t{0}) == 1);
  CHECK(t["zero"]["plugin"].value_or(std::string()) == "stage0");
  CHECK(t["schedule"]["type"].value_or(std::string()) == "constant");
  CHECK(t["sampler"]["drop_last"].value_or(true) == false);
  CHECK(t["log"]["trace"].value_or(std::string("x")).empty());
  CHECK(t["model"]["plugin"].value_or(std::string()) == "mlp");
  CHECK(t["data"]["train"]["plugin"].value_or(std::string()) == "idx");
}

TEST_CASE("launcher: --local_rank given to a launcher of several workers is refused",
          "[run][launcher]") {
  Setup s = setup();
  // Before: every worker got --local_rank 0 (on a GPU host, both on GPU 0).
  RunResult r = refused({"run", "-n", "2", s.config.string(), "--local_rank", "0"});
  CHECK(contains(r.err, "--local_rank"));
  CHECK(contains(r.err, "LOCAL_RANK"));
  CHECK_FALSE(fs::exists(s.run_dir / "summary.json"));
  r = refused({"run", "--num_gpus", "2", s.config.string(), "--local-rank=1"});
  CHECK(contains(r.err, "--local-rank"));
  // A worker told two different local ranks says so.
  RunOptions o;
  o.env = {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}};
  r = refused({"run", s.config.string(), "--local_rank", "0"}, o);
  CHECK(contains(r.err, "--local_rank 0"));
  CHECK(contains(r.err, "LOCAL_RANK=1"));
}

TEST_CASE("DeepSpeed's --num_gpus and --include start the workers on one node",
          "[run][launcher][deepspeed]") {
  Setup s = setup();
  for (const std::vector<std::string> &form :
       {std::vector<std::string>{"--num_gpus", "2"},
        std::vector<std::string>{"--include", "localhost:0,1"}}) {
    INFO(form[0]);
    std::vector<std::string> args = {"run"};
    args.insert(args.end(), form.begin(), form.end());
    args.insert(args.end(), {s.config.string(), "--set", "run.steps=4"});
    RunResult r = ok(args);
    CHECK(count(r.err, form[0] + " " + form[1] + ": -n 2, CUDA_VISIBLE_DEVICES=0,1") == 1);
    CHECK(read_json(s.run_dir / "summary.json")["world_size"].get<int64_t>() == 2);
  }
}

TEST_CASE("offload ratio is a number, or \"auto\"", "[config][offload]") {
  Setup s = setup("\n[zero]\nplugin = \"stage1\"\n[offload]\nplugin = \"cpu\"\nratio = 0.5\n");
  RunResult r = ok({"config", "check", s.config.string()});
  // The plugin reads it as text (abi.h: a STRING declared with '#').
  CHECK(contains(r.out, "ratio = \"0.5\""));
  ok({"config", "check", s.config.string(), "--set", "offload.ratio=0.25"});
  ok({"config", "check", s.config.string(), "--set", "offload.ratio=1"});
  ok({"config", "check", s.config.string(), "--set", "offload.ratio=auto"});
  r = refused({"config", "check", s.config.string(), "--set", "offload.ratio=1.5"});
  CHECK(contains(r.err, "offload.ratio"));
  r = refused({"config", "check", s.config.string(), "--set", "offload.ratio=fast"});
  CHECK(contains(r.err, "\"fast\""));
  // A word where a word is meant stays a word.
  r = refused({"config", "check", s.config.string(), "--set", "run.device=0.5"});
  CHECK(contains(r.err, "run.device"));
  // DeepSpeed's ratio, a number, maps onto it unchanged.
  fs::path ds = scratch() / "ds.json";
  write_text(ds, R"({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu",
      "ratio": 0.3}}})");
  r = ok({"config", "check", s.config.string(), "--deepspeed_config", ds.string()});
  CHECK(contains(r.out, "ratio = \"0.3\""));
}

TEST_CASE("config check refuses what the run would refuse", "[config][offload]") {
  // Parameter offload needs ZeRO stage 3: the run refused it at start-up,
  // `config check` printed it as valid.
  Setup s = setup("\n[zero]\nplugin = \"stage2\"\n[offload]\nplugin = \"cpu\"\nparams = \"cpu\"\n");
  RunResult r = refused({"config", "check", s.config.string()});
  CHECK(contains(r.err, "parameter offload needs ZeRO stage 3"));
  CHECK_FALSE(contains(r.out, "(valid)"));
  // Stage 3 with it passes.
  Setup ok3 = setup(
      "\n[zero]\nplugin = \"stage3\"\n[offload]\nplugin = \"cpu\"\nparams = \"cpu\"\n", "stage3");
  ok({"config", "check", ok3.config.string()});
}

}  // namespace itest_test_deepspeed_cli
