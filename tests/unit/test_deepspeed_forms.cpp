// DeepSpeed's launcher command line onto tessera's (issue 54): --deepspeed,
// --deepspeed_config, --num_gpus and --num_nodes 1 on one node (-n and the
// visible devices), --include/--exclude (devices on one node, the hostfile
// on several), --master_addr/--master_port; each mapping says what it did.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/deepspeed_forms.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_deepspeed_forms {

using tessera::cli::Args;
using tessera::cli::DeepSpeedForms;
using tessera::cli::map_deepspeed_forms;
using tessera::cli::UsageError;

namespace {

DeepSpeedForms run_forms(const Args &args, const char *visible = nullptr) {
  return map_deepspeed_forms(args, true, visible);
}

std::string joined(const std::vector<std::string> &v) {
  std::string s;
  for (const auto &x : v) s += (s.empty() ? "" : "\n") + x;
  return s;
}

std::string usage_error(const Args &args, const char *visible = nullptr) {
  try {
    run_forms(args, visible);
  } catch (const UsageError &e) {
    return e.what();
  }
  FAIL("expected a UsageError for " << joined(args));
  return "";
}

}  // namespace

TEST_CASE("DeepSpeed forms: --deepspeed as DeepSpeed's flag and as a file", "[cli][deepspeed]") {
  // DeepSpeed's scripts: a flag, with the JSON in --deepspeed_config.
  DeepSpeedForms f = run_forms({"--deepspeed", "--deepspeed_config", "ds.json"});
  CHECK(f.args == Args{"--deepspeed_config", "ds.json"});
  REQUIRE(f.notes.size() == 1);
  CHECK_THAT(f.notes[0], Catch::Contains("--deepspeed"));
  // Hugging Face's Trainer: --deepspeed FILE.
  f = run_forms({"cfg.toml", "--deepspeed", "ds.json"});
  CHECK(f.args == Args{"cfg.toml", "--deepspeed_config", "ds.json"});
  CHECK(f.notes.empty());
  f = run_forms({"cfg.toml", "--deepspeed=ds.json"});
  CHECK(f.args == Args{"cfg.toml", "--deepspeed_config", "ds.json"});
  // The same outside the launcher (config check, eval).
  f = map_deepspeed_forms({"config", "--deepspeed", "--deepspeed_config", "ds.json"}, false,
                          nullptr);
  CHECK(f.args == Args{"config", "--deepspeed_config", "ds.json"});
}

TEST_CASE(
    "DeepSpeed forms: --num_gpus and --num_nodes 1 on one node are -n and the visible devices",
    "[cli][deepspeed]") {
  DeepSpeedForms f = run_forms({"ds.json", "--num_gpus", "2", "--num_nodes", "1"});
  CHECK(f.args == Args{"ds.json", "-n", "2"});
  CHECK(f.visible_devices == "0,1");
  CHECK_THAT(joined(f.notes), Catch::Contains("--num_gpus 2: -n 2, CUDA_VISIBLE_DEVICES=0,1"));
  CHECK_THAT(joined(f.notes), Catch::Contains("--num_nodes 1"));
  // The first N of the devices already visible.
  f = run_forms({"ds.json", "--num_gpus=2"}, "3,5,7");
  CHECK(f.args == Args{"ds.json", "-n", "2"});
  CHECK(f.visible_devices == "3,5");
  // More than there are, several nodes without a hostfile, -n that disagrees.
  CHECK_THAT(usage_error({"ds.json", "--num_gpus", "3"}, "0,1"),
             Catch::Contains("CUDA_VISIBLE_DEVICES=0,1"));
  CHECK_THAT(usage_error({"ds.json", "--num_nodes", "2"}), Catch::Contains("--hostfile"));
  CHECK_THAT(usage_error({"ds.json", "--num_gpus", "2", "-n", "4"}),
             Catch::Contains("-n 4") && Catch::Contains("--num_gpus 2"));
  CHECK_THAT(usage_error({"ds.json", "--num_gpus", "0"}), Catch::Contains("--num_gpus"));
}

TEST_CASE("DeepSpeed forms: --include and --exclude on one node choose the devices",
          "[cli][deepspeed]") {
  DeepSpeedForms f = run_forms({"ds.json", "--include", "localhost:0,1"});
  CHECK(f.args == Args{"ds.json", "-n", "2"});
  CHECK(f.visible_devices == "0,1");
  CHECK_THAT(joined(f.notes),
             Catch::Contains("--include localhost:0,1: -n 2, CUDA_VISIBLE_DEVICES=0,1"));
  f = run_forms({"ds.json", "--include=localhost:1,3"});
  CHECK(f.visible_devices == "1,3");
  // Slot numbers index the visible devices, as DeepSpeed's do.
  f = run_forms({"ds.json", "--include", "localhost:1"}, "4,6");
  CHECK(f.visible_devices == "6");
  f = run_forms({"ds.json", "--exclude", "localhost:1", "--num_gpus", "3"});
  CHECK(f.args == Args{"ds.json", "-n", "2"});
  CHECK(f.visible_devices == "0,2");
  f = run_forms({"ds.json", "--exclude", "localhost:0"}, "0,1,2,3");
  CHECK(f.visible_devices == "1,2,3");
  CHECK_THAT(usage_error({"ds.json", "--exclude", "localhost:0"}),
             Catch::Contains("--num_gpus") && Catch::Contains("CUDA_VISIBLE_DEVICES"));
  CHECK_THAT(usage_error({"ds.json", "--include", "node7:0,1"}), Catch::Contains("--hostfile"));
  CHECK_THAT(usage_error({"ds.json", "--include", "localhost:0@node7:1"}),
             Catch::Contains("--hostfile"));
  CHECK_THAT(usage_error({"ds.json", "--include", "localhost:0", "--exclude", "localhost:1"}),
             Catch::Contains("--include") && Catch::Contains("--exclude"));
  CHECK_THAT(usage_error({"ds.json", "--include", "localhost:x"}), Catch::Contains("'x'"));
}

TEST_CASE("with --hostfile the host selection stays the hostfile's", "[cli][deepspeed]") {
  DeepSpeedForms f = run_forms({"ds.json", "--hostfile", "hf", "--include", "a:0,1@b", "--num_gpus",
                                "2", "--num_nodes", "2"});
  CHECK(f.args == Args{"ds.json", "--hostfile", "hf", "--include", "a:0,1@b", "--num_gpus", "2",
                       "--num_nodes", "2"});
  CHECK(f.visible_devices.empty());
}

TEST_CASE("DeepSpeed forms: --master_addr and --master_port are --master", "[cli][deepspeed]") {
  DeepSpeedForms f = run_forms({"ds.json", "--master_addr", "10.0.0.1", "--master_port", "29600"});
  CHECK(f.args == Args{"ds.json", "--master", "10.0.0.1:29600"});
  CHECK_THAT(
      joined(f.notes),
      Catch::Contains("--master_addr 10.0.0.1 --master_port 29600: --master 10.0.0.1:29600"));
  f = run_forms({"ds.json", "--hostfile", "hf", "--master_addr=node1"});
  CHECK(f.args == Args{"ds.json", "--hostfile", "hf", "--master", "node1:29500"});
  // --master_port alone keeps its meaning (the first host, that port).
  f = run_forms({"ds.json", "--hostfile", "hf", "--master_port", "29700"});
  CHECK(f.args == Args{"ds.json", "--hostfile", "hf", "--master_port", "29700"});
  CHECK_THAT(usage_error({"ds.json", "--master_addr", "a", "--master", "b:1"}),
             Catch::Contains("--master"));
}

}  // namespace unit_test_deepspeed_forms
