// DeepSpeed JSON configs as a whole: the users' tutorial config on top of
// configs/quickstart.toml (on 1 and 4 ranks, under --set, as run.deepspeed,
// and alone), warnings for keys the engine does not use, and broken files
// naming themselves. Each mapping of DeepSpeed's names and defaults onto
// tessera's sections is in test_deepspeed_mapping.cpp.
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <string>

#include "config/config.hpp"
#include "config/deepspeed.hpp"
#include "deepspeed_support.hpp"
#include "train/job.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_deepspeed {

using namespace tessera::test::deepspeed_support;

namespace {

// The config from our users' DeepSpeed tutorial, unchanged.
const char *kTutorial =
    R"({"train_batch_size": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.001, "momentum": 0.9}}})";

}  // namespace

// ---------------------------------------------------------------------------
// The tutorial

TEST_CASE("the tutorial's DeepSpeed JSON works unchanged on top of the quickstart",
          "[config][deepspeed]") {
  Quickstart q;
  tessera::Job job = q.job(kTutorial);

  // Optimizer: SGD with the JSON's lr and momentum, sgd's defaults otherwise.
  const tessera::PluginChoice &opt = job.plugin("optimizer");
  CHECK(opt.entry->desc->name == std::string("sgd"));
  CHECK(opt.values["lr"].value_or(0.0) == 0.001);
  CHECK(opt.values["momentum"].value_or(0.0) == 0.9);
  CHECK(opt.values["nesterov"].value_or(true) == false);
  CHECK(opt.values["weight_decay"].value_or(-1.0) == 0.0);
  // The quickstart's adam keys are gone with its [optimizer].
  CHECK_FALSE(opt.values.contains("adamw"));

  // Batch: train_batch_size 4 replaces the quickstart's micro = 128.
  CHECK(job.settings.global_batch == 4);
  CHECK(job.settings.micro_batch == 4);
  CHECK(job.settings.accumulation == 1);

  // Everything else is the quickstart's, as it resolves without the JSON.
  tessera::Job base = q.base();
  CHECK(base.plugin("optimizer").entry->desc->name != std::string("sgd"));
  toml::table with = toml::parse(job.resolved_toml());
  toml::table without = toml::parse(base.resolved_toml());
  for (const char *section :
       {"run", "data", "model", "sampler", "schedule", "fp16", "zero", "offload", "checkpoint"}) {
    INFO("[" << section << "]");
    REQUIRE(with.get_as<toml::table>(section) != nullptr);
    REQUIRE(without.get_as<toml::table>(section) != nullptr);
    CHECK(*with.get_as<toml::table>(section) == *without.get_as<toml::table>(section));
  }
  CHECK(job.settings.name == "quickstart");
  CHECK(job.settings.epochs == base.settings.epochs);
  CHECK(job.settings.log_every == base.settings.log_every);
  CHECK(job.settings.schedule.type == base.settings.schedule.type);
  CHECK(job.plugin("model").entry->desc->name == std::string("mlp"));
  CHECK(job.plugin("data.train").entry->desc->name == std::string("idx"));
  CHECK(job.plugin("data.train").values["images"].value_or(std::string()) ==
        "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
  CHECK(job.plugin("data.eval").values["labels"].value_or(std::string()) ==
        "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz");
  CHECK(job.plugin("zero").entry->desc->name == base.plugin("zero").entry->desc->name);
  // Nothing is ignored; the one note says the TOML's schedule still applies
  // (the tutorial's JSON sets an optimizer and no scheduler).
  REQUIRE(job.doc.warnings().size() == 1);
  CHECK_THAT(job.doc.warnings()[0], Catch::Contains("but no scheduler"));

  // What `tessera config check` prints parses back to the same values.
  toml::table resolved = toml::parse(job.resolved_toml());
  CHECK(resolved["optimizer"]["plugin"].value_or(std::string()) == "sgd");
  CHECK(resolved["optimizer"]["momentum"].value_or(0.0) == 0.9);
  CHECK(resolved["batch"]["global"].value_or(int64_t{0}) == 4);
  CHECK(resolved["model"]["plugin"].value_or(std::string()) == "mlp");
}

TEST_CASE("the tutorial on 4 ranks, with --set on top, and as run.deepspeed",
          "[config][deepspeed]") {
  Quickstart q;
  SECTION("4 ranks: one sample per rank") {
    tessera::Job job = q.job(kTutorial, 4);
    CHECK(job.settings.global_batch == 4);
    CHECK(job.settings.micro_batch == 1);
    CHECK(job.settings.accumulation == 1);
  }
  SECTION("--set overrides the JSON") {
    tessera::Job job = tessera::load_job(
        q.options(q.json(kTutorial), {"optimizer.lr=0.01", "optimizer.nesterov=true"}), 1, true);
    CHECK(job.plugin("optimizer").values["lr"].value_or(0.0) == 0.01);
    CHECK(job.plugin("optimizer").values["nesterov"].value_or(false) == true);
    CHECK(job.plugin("optimizer").values["momentum"].value_or(0.0) == 0.9);
  }
  SECTION("run.deepspeed = \"ds.json\" resolves beside the TOML") {
    q.json(kTutorial, "conf/ds.json");
    std::string text = quickstart_text();
    size_t run = text.find("[run]\n");
    REQUIRE(run != std::string::npos);
    text.insert(run + 6, "deepspeed = \"ds.json\"\n");
    JobOptions o = q.options("");
    o.config_path = q.dir.write("conf/quickstart.toml", text);
    // The working directory is elsewhere: the path is the TOML's folder's.
    REQUIRE(fs::current_path() != fs::path(q.dir.file("conf")));
    tessera::Job job = tessera::load_job(o, 1, true);
    CHECK(job.plugin("optimizer").entry->desc->name == std::string("sgd"));
    CHECK(job.settings.global_batch == 4);
    CHECK(job.plugin("model").entry->desc->name == std::string("mlp"));

    // A missing file names itself.
    q.dir.write("conf/quickstart.toml", text);
    fs::remove(q.dir.file("conf/ds.json"));
    CHECK_THAT(error_of([&] { tessera::load_job(o, 1, true); }),
               Catch::Contains(q.dir.file("conf/ds.json")) && Catch::Contains("cannot open"));
  }
  SECTION("--set run.deepspeed=F counts too") {
    std::string ds = q.json(kTutorial);
    tessera::Job job = tessera::load_job(q.options("", {"run.deepspeed=\"" + ds + "\""}), 1, true);
    CHECK(job.plugin("optimizer").entry->desc->name == std::string("sgd"));
    CHECK(job.settings.global_batch == 4);
  }
  SECTION("the JSON alone, as `tessera config convert` reads it") {
    std::string ds = q.json(kTutorial);
    Document d = Document::load(ds);
    CHECK(str_at(d, "optimizer.plugin") == "sgd");
    CHECK(num_at(d, "optimizer.lr") == 0.001);
    CHECK(int_at(d, "batch.global") == 4);
    CHECK(find(d.root(), "model") == nullptr);
    // The equivalent TOML parses back to the same table.
    toml::table back = toml::parse(tessera::config::to_toml(d.root()));
    CHECK(back == d.root());
    CHECK(back["optimizer"]["momentum"].value_or(0.0) == 0.9);
  }
}

// ---------------------------------------------------------------------------
// Warnings and broken files

TEST_CASE("DeepSpeed keys the engine does not use are warnings, not errors",
          "[config][deepspeed]") {
  Quickstart q;
  tessera::Job job = q.job(R"({"train_batch_size": 4, "memory_breakdown": false,
      "activation_checkpointing": {"partition_activations": true},
      "optimizer": {"type": "SGD", "params": {"lr": 0.001, "momentum": 0.9}}})");
  CHECK(job.settings.global_batch == 4);
  CHECK(any_warning(job.doc, "'memory_breakdown' is not used by tessera; ignored"));
  // activation_checkpointing maps onto the model's recompute, which the
  // quickstart's mlp lacks (test_deepspeed_recompute.cpp).
  CHECK(any_warning(job.doc,
                    "activation_checkpointing.partition_activations is not used by "
                    "tessera; ignored"));
  CHECK(any_warning(job.doc, "the model plugin 'mlp' has no 'recompute' parameter"));
  // The JSON has an optimizer and no scheduler: the quickstart's schedule
  // stays, and a fourth warning says so.
  CHECK(any_warning(job.doc, "sets an optimizer but no scheduler: the learning rate follows the " +
                                 q.toml + ":"));
  CHECK(any_warning(job.doc,
                    "[schedule] 'warmup_cosine' (warmup_steps 200), where DeepSpeed "
                    "would keep it constant"));
  for (const auto &w : job.doc.warnings()) CHECK(w.rfind(q.dir.file("ds.json"), 0) == 0);
  CHECK(job.doc.warnings().size() == 4);
}

TEST_CASE("a key DeepSpeed itself does not know is an error with a did-you-mean",
          "[config][deepspeed]") {
  Quickstart q;
  std::string ds = q.dir.file("ds.json");
  std::string msg = q.doc_error(R"({"train_batch_sise": 4})");
  CHECK(msg == ds + ": 'train_batch_sise' is not a DeepSpeed config key; did you mean "
                    "'train_batch_size'?");
  msg = q.doc_error(R"({"zzzzzzzzzz": 1})");
  CHECK_THAT(msg, Catch::Contains("'zzzzzzzzzz' is not a DeepSpeed config key (docs/config.md"));
  // A real DeepSpeed key tessera does not use stays a warning.
  CHECK(any_warning(q.doc(R"({"prescale_gradients": true})"),
                    "'prescale_gradients' is not used by tessera; ignored"));
}

TEST_CASE("broken DeepSpeed files name the file", "[config][deepspeed]") {
  Quickstart q;
  std::string ds = q.dir.file("ds.json");
  std::string msg = q.doc_error(R"({"train_batch_size": 4,})");
  CHECK(msg.rfind(ds + ": invalid JSON: ", 0) == 0);
  CHECK_THAT(msg, Catch::Contains("line 1"));
  msg = q.doc_error("{\n  \"train_batch_size\": 4\n  \"steps_per_print\": 1\n}\n");
  CHECK(msg.rfind(ds + ": invalid JSON: ", 0) == 0);
  CHECK_THAT(msg, Catch::Contains("line 3"));
  msg = q.doc_error("[1, 2]");
  CHECK(msg.rfind(ds + ": a DeepSpeed config must be a JSON object", 0) == 0);
  msg = q.doc_error("");
  CHECK(msg.rfind(ds + ": invalid JSON", 0) == 0);
  std::string missing = q.dir.file("missing.json");
  msg = error_of([&] { tessera::load_document(q.options(missing)); });
  CHECK(msg.rfind(missing + ": cannot open", 0) == 0);
}

}  // namespace unit_test_deepspeed
