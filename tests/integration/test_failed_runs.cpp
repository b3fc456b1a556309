// Runs that end badly look it (issue 22): summary.json says "failed", why
// and which rank, in one process and through the launcher, and `tessera
// runs` shows them failed. And a run's own config.toml evaluates its
// checkpoint at any world size (eval needs the micro batch only).
#include <catch2/catch.hpp>
#include <string>

#include "harness.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace itest_test_failed_runs {

using namespace tessera::itest;
using nlohmann::json;

TEST_CASE("a run that fails in one process writes a failed summary", "[runs][failed]") {
  // SGD with an absurd rate: the loss is no longer finite after a step.
  Setup s = setup();
  std::string text = read_text(s.config);
  const std::string adam = "plugin = \"adam\"\nlr = 0.01";
  REQUIRE(contains(text, adam));
  text.replace(text.find(adam), adam.size(), "plugin = \"sgd\"\nlr = 1e30");
  write_text(s.config, text);
  RunResult r = run_cli({"run", s.config.string(), "--set", "run.log_every=1"});
  INFO(describe(r));
  REQUIRE(r.status == 1);
  json sum = read_json(s.run_dir / "summary.json");
  CHECK(sum.at("status") == "failed");
  CHECK(contains(sum.at("reason").get<std::string>(), "loss is "));
  CHECK(sum.at("failed_rank") == 0);

  RunResult runs = run_cli({"runs", scratch().string()});
  INFO(describe(runs));
  REQUIRE(runs.status == 0);
  CHECK(any_line_has(lines(runs.out), {"run", "failed (rank 0)"}));
}

TEST_CASE("a 2-rank run whose rank 1 dies writes a failed summary naming rank 1",
          "[runs][failed][launcher]") {
  Setup s = setup();
  RunOptions o;
  o.env["TESSERA_TEST_CRASH"] = "rank=1,step=3";
  RunResult r = run_cli({"run", "-n", "2", s.config.string()}, o);
  INFO(describe(r));
  REQUIRE(r.status == 1);
  CHECK(contains(
      r.err, "tessera run: the failure is recorded in " + (s.run_dir / "summary.json").string()));
  json sum = read_json(s.run_dir / "summary.json");
  CHECK(sum.at("status") == "failed");
  CHECK(sum.at("failed_rank") == 1);
  CHECK(contains(sum.at("reason").get<std::string>(), "rank 1 was killed by signal SIGKILL"));
  CHECK(sum.at("world_size") == 2);

  RunResult runs = run_cli({"runs", scratch().string(), "--json"});
  INFO(describe(runs));
  json rows = json::parse(runs.out);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].at("status") == "failed");
  CHECK(rows[0].at("failed_rank") == 1);
  CHECK(contains(rows[0].at("reason").get<std::string>(), "rank 1"));
}

TEST_CASE("eval on a run's own config.toml works at any world size", "[eval][config]") {
  // Trained on 2 ranks: config.toml holds global 64 = micro 32 x 2 ranks,
  // which the batch rule would refuse on eval's one process.
  Setup s = setup();
  RunResult r = run_cli({"run", "-n", "2", s.config.string(), "--set", "run.steps=6"});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  const fs::path own = s.run_dir / "config.toml";
  CHECK(contains(read_text(own), "global = 64"));
  r = run_cli({"eval", own.string(), "--ckpt", (s.run_dir / "ckpt").string()});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  json sum = read_json(s.run_dir / "summary.json");
  char buf[64];
  std::snprintf(buf, sizeof buf, "accuracy %.4f", sum.at("eval_accuracy").get<double>());
  CHECK(contains(r.out, buf));
  // Training still holds the batch rule.
  r = run_cli({"config", "check", own.string()});
  CHECK(r.status == 1);
  CHECK(contains(r.err, "batch sizes do not fit"));
}

}  // namespace itest_test_failed_runs
