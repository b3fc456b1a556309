// DeepSpeed's activation_checkpointing onto the model's `recompute` (issue
// 22): set for a model that declares it (gpt2), dropped with a warning that
// says so for one that does not (the quickstart's mlp), and an ordinary key
// again once --set or --unset touches it.
#include <catch2/catch.hpp>
#include <string>

#include "config/config.hpp"
#include "deepspeed_support.hpp"
#include "train/job.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_deepspeed_recompute {

using namespace tessera::test::deepspeed_support;

namespace {

// The quickstart with a gpt2 for its model (only validated here, never
// built, so its dimensions may stay at their defaults).
JobOptions gpt2_options(Quickstart &q, const std::string &json_text,
                        std::vector<std::string> sets = {}) {
  std::string text = quickstart_text();
  const std::string mlp = "plugin = \"mlp\"\nhidden = [256, 128]\nactivation = \"relu\"\n";
  REQUIRE(text.find(mlp) != std::string::npos);
  text.replace(text.find(mlp), mlp.size(), "plugin = \"gpt2\"\n");
  JobOptions o = q.options(q.json(json_text), std::move(sets));
  o.config_path = q.dir.write("gpt2.toml", text);
  return o;
}

bool recompute_of(const tessera::Job &job) {
  const toml::node *n = job.plugin("model").values.get("recompute");
  REQUIRE(n != nullptr);
  REQUIRE(n->is_boolean());
  return n->as_boolean()->get();
}

}  // namespace

TEST_CASE("activation_checkpointing turns on gpt2's recompute", "[config][deepspeed]") {
  Quickstart q;
  CHECK_FALSE(recompute_of(tessera::load_job(gpt2_options(q, "{}"), 1, true)));
  tessera::Job job = tessera::load_job(
      gpt2_options(q, R"({"activation_checkpointing": {"partition_activations": false,
        "cpu_checkpointing": false, "contiguous_memory_optimization": false}})"),
      1, true);
  CHECK(recompute_of(job));
  // DeepSpeed's false is what tessera does: nothing to warn about.
  CHECK(job.doc.warnings().empty());
  CHECK_THAT(job.resolved_toml(), Catch::Contains("recompute = true"));
  // The layered document (what `tessera config convert` prints) has the key.
  CHECK(bool_at(q.doc(R"({"activation_checkpointing": {}})"), "model.recompute"));
}

TEST_CASE("activation_checkpointing on a model without recompute is a warning that says so",
          "[config][deepspeed]") {
  Quickstart q;
  const std::string ds = q.dir.file("ds.json");
  tessera::Job job = q.job(R"({"activation_checkpointing": {}})");
  REQUIRE(job.doc.warnings().size() == 1);
  CHECK(job.doc.warnings()[0] == ds + ": activation_checkpointing: the model plugin 'mlp' has no "
                                      "'recompute' parameter (activation checkpointing); ignored "
                                      "(model plugins with it: gpt2, llama)");
  CHECK(job.plugin("model").values.get("recompute") == nullptr);
  CHECK_THAT(job.resolved_toml(), !Catch::Contains("recompute"));
}

TEST_CASE("activation_checkpointing's other keys: true is not done, and a warning",
          "[config][deepspeed]") {
  Quickstart q;
  const std::string ds = q.dir.file("ds.json");
  tessera::Job job = tessera::load_job(
      gpt2_options(q, R"({"activation_checkpointing": {"partition_activations": true,
        "cpu_checkpointing": false, "number_checkpoints": 4}})"),
      1, true);
  CHECK(recompute_of(job));
  CHECK(job.doc.warnings() ==
        std::vector<std::string>{
            ds + ": activation_checkpointing.number_checkpoints is not used by tessera; ignored",
            ds + ": activation_checkpointing.partition_activations is not used by tessera; "
                 "ignored"});
  CHECK(q.doc_error(R"({"activation_checkpointing": true})") ==
        ds + ": activation_checkpointing: expected an object like {\"partition_activations\": "
             "false}");
}

TEST_CASE("the command line over activation_checkpointing's recompute: --set and --unset",
          "[config][deepspeed]") {
  Quickstart q;
  const std::string on = R"({"activation_checkpointing": {}})";
  // The command line wins, as over any DeepSpeed key.
  CHECK_FALSE(
      recompute_of(tessera::load_job(gpt2_options(q, on, {"model.recompute=false"}), 1, true)));
  JobOptions o = gpt2_options(q, on);
  o.unsets.push_back("model.recompute");
  tessera::Job job = tessera::load_job(o, 1, true);
  CHECK_FALSE(recompute_of(job));
  CHECK(job.doc.warnings().empty());
  // A --set of the key is the user's own: on a model without it, the usual
  // unknown-key error, not a warning.
  std::string msg = error_of(
      [&] { tessera::load_job(q.options(q.json(on), {"model.recompute=true"}), 1, true); });
  CHECK_THAT(msg,
             Catch::Contains("--set model.recompute=true: unknown key 'recompute' in [model]"));
}

}  // namespace unit_test_deepspeed_recompute
