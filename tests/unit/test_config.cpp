// Config: TOML documents and their syntax errors, typed --set overrides, a
// valid job (load_job on TOML files written here) with every default
// resolved, the batch rule global = micro x accumulation x world, and
// did-you-mean. Validation errors of whole jobs are in test_config_errors.cpp.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "config/settings.hpp"
#include "config_support.hpp"
#include "train/job.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_config {

using namespace tessera::test::config_support;

namespace {

using tessera::config::Document;
using tessera::config::find;

}  // namespace

// ---------------------------------------------------------------------------
// Documents

TEST_CASE("Document parses TOML and knows the line of each key", "[config]") {
  Document d = Document::from_string(kBase, "base.toml");
  const toml::node *lr = find(d.root(), "optimizer.lr");
  REQUIRE(lr != nullptr);
  CHECK(lr->value_or(0.0) == 0.1);
  CHECK(d.where("optimizer.lr", lr) == "base.toml:" + std::to_string(line_of(kBase, "lr = 0.1")));
  const toml::node *images = find(d.root(), "data.train.images");
  REQUIRE(images != nullptr);
  CHECK(images->value_or(std::string()) == "train-images.gz");
  CHECK(find(d.root(), "data.train.nothing") == nullptr);
  CHECK(find(d.root(), "optimizer.lr.deeper") == nullptr);
  CHECK(find(d.root(), "nothing") == nullptr);

  TempDir dir;
  std::string path = dir.write("base.toml", kBase);
  Document f = Document::load(path);
  CHECK(f.path() == path);
  const toml::node *seed = find(f.root(), "run.seed");
  REQUIRE(seed != nullptr);
  CHECK(seed->is_integer());
  CHECK(f.where("run.seed", seed) == path + ":" + std::to_string(line_of(kBase, "seed = 1")));
  CHECK(f.warnings().empty());

  std::string missing = dir.file("missing.toml");
  std::string msg = error_of([&] { Document::load(missing); });
  CHECK_THAT(msg, Catch::Contains(missing) && Catch::Contains("cannot open"));
}

TEST_CASE("TOML syntax errors name file:line:column", "[config]") {
  SECTION("a value missing") {
    std::string msg = error_of([] { Document::from_string("[run]\nname =\n", "bad.toml"); });
    CHECK(msg.rfind("bad.toml:2:", 0) == 0);
    CHECK_THAT(msg, Catch::Contains("TOML syntax error"));
  }
  SECTION("an unterminated string in a file") {
    TempDir dir;
    std::string text = "[run]\nseed = 1\nname = \"open\n[batch]\nmicro = 2\n";
    std::string path = dir.write("broken.toml", text);
    std::string msg = error_of([&] { Document::load(path); });
    CHECK(msg.rfind(path + ":3:", 0) == 0);
    CHECK_THAT(msg, Catch::Contains("TOML syntax error"));
  }
  SECTION("a key given twice") {
    std::string msg =
        error_of([] { Document::from_string("[run]\nseed = 1\n\nseed = 2\n", "twice.toml"); });
    CHECK(msg.rfind("twice.toml:4:", 0) == 0);
  }
  SECTION("a section given twice") {
    std::string msg = error_of(
        [] { Document::from_string("[run]\nseed = 1\n[batch]\nmicro = 1\n[run]\n", "dup.toml"); });
    CHECK(msg.rfind("dup.toml:5:", 0) == 0);
  }
  SECTION("through load_job") {
    TempDir dir;
    std::string text = edit(kBase, "lr = 0.1", "lr = 0.1.2");
    std::string msg = error_of([&] { load_text(dir, text); });
    CHECK(msg.rfind(dir.file("unit.toml") + ":" + std::to_string(line_of(text, "lr = ")) + ":",
                    0) == 0);
  }
}

// ---------------------------------------------------------------------------
// --set

TEST_CASE("overrides: --set parses values as TOML and keeps their types", "[config]") {
  Document d = Document::from_string(kBase, "base.toml");

  SECTION("integer") {
    d.apply_set("run.seed=7");
    const toml::node *n = find(d.root(), "run.seed");
    REQUIRE(n != nullptr);
    REQUIRE(n->is_integer());
    CHECK(n->as_integer()->get() == 7);
  }
  SECTION("float, in exponent form") {
    d.apply_set("optimizer.lr=3e-4");
    const toml::node *n = find(d.root(), "optimizer.lr");
    REQUIRE(n != nullptr);
    REQUIRE(n->is_floating_point());
    CHECK(n->as_floating_point()->get() == 3e-4);
  }
  SECTION("boolean") {
    d.apply_set("sampler.shuffle=false");
    const toml::node *n = find(d.root(), "sampler.shuffle");
    REQUIRE(n != nullptr);
    REQUIRE(n->is_boolean());
    CHECK(n->as_boolean()->get() == false);
  }
  SECTION("strings: quoted TOML, or anything that does not parse") {
    d.apply_set("run.name=my-run");
    d.apply_set("run.dir=runs/a b");
    d.apply_set("checkpoint.resume=\"auto\"");
    d.apply_set("run.device=");
    CHECK(find(d.root(), "run.name")->value_or(std::string()) == "my-run");
    CHECK(find(d.root(), "run.dir")->value_or(std::string()) == "runs/a b");
    CHECK(find(d.root(), "checkpoint.resume")->value_or(std::string()) == "auto");
    REQUIRE(find(d.root(), "run.device")->is_string());
    CHECK(find(d.root(), "run.device")->value_or(std::string("x")).empty());
    // An '=' inside the value belongs to the value.
    d.apply_set("run.name=a=b");
    CHECK(find(d.root(), "run.name")->value_or(std::string()) == "a=b");
  }
  SECTION("arrays") {
    d.apply_set("model.hidden=[64, 32]");
    d.apply_set("optimizer.betas=[0.8, 0.99]");
    d.apply_set("run.plugin_path=[\"/a\", \"/b\"]");
    const toml::array *hidden = find(d.root(), "model.hidden")->as_array();
    REQUIRE(hidden != nullptr);
    REQUIRE(hidden->size() == 2);
    CHECK(hidden->get(0)->value_or(int64_t{0}) == 64);
    CHECK(hidden->get(1)->value_or(int64_t{0}) == 32);
    const toml::array *betas = find(d.root(), "optimizer.betas")->as_array();
    REQUIRE(betas != nullptr);
    CHECK(betas->get(1)->value_or(0.0) == 0.99);
    CHECK(find(d.root(), "run.plugin_path")->as_array()->size() == 2);
    d.apply_set("model.hidden=[]");
    CHECK(find(d.root(), "model.hidden")->as_array()->empty());
  }
  SECTION("new keys and new nested sections") {
    REQUIRE(find(d.root(), "schedule") == nullptr);
    d.apply_set("schedule.warmup_steps=10");
    d.apply_set("deep.er.key=1");
    REQUIRE(find(d.root(), "schedule")->is_table());
    CHECK(find(d.root(), "schedule.warmup_steps")->value_or(int64_t{0}) == 10);
    CHECK(find(d.root(), "deep.er.key")->value_or(int64_t{0}) == 1);
    d.apply_set("data.eval.plugin=idx");
    CHECK(find(d.root(), "data.eval.plugin")->value_or(std::string()) == "idx");
    CHECK(find(d.root(), "data.train.plugin")->value_or(std::string()) == "idx");
  }
  SECTION("keys of [data.train]") {
    d.apply_set("data.train.limit=100");
    d.apply_set("data.train.images=/tmp/other-images.gz");
    CHECK(find(d.root(), "data.train.limit")->value_or(int64_t{0}) == 100);
    CHECK(find(d.root(), "data.train.images")->value_or(std::string()) == "/tmp/other-images.gz");
    CHECK(find(d.root(), "data.train.labels")->value_or(std::string()) == "train-labels.gz");
  }
  SECTION("an inline table replaces a section") {
    d.apply_set("optimizer={plugin = \"adam\", lr = 0.5}");
    CHECK(find(d.root(), "optimizer.plugin")->value_or(std::string()) == "adam");
    CHECK(find(d.root(), "optimizer.lr")->value_or(0.0) == 0.5);
    CHECK(d.where("optimizer.lr", find(d.root(), "optimizer.lr")) ==
          "--set optimizer={plugin = \"adam\", lr = 0.5}");
  }
  SECTION("the last override wins, and names itself as the origin") {
    d.apply_set("optimizer.lr=0.5");
    d.apply_set("optimizer.lr=0.25");
    const toml::node *n = find(d.root(), "optimizer.lr");
    CHECK(n->value_or(0.0) == 0.25);
    CHECK(d.where("optimizer.lr", n) == "--set optimizer.lr=0.25");
    // Keys the override did not touch keep their lines.
    const toml::node *plugin = find(d.root(), "optimizer.plugin");
    CHECK(d.where("optimizer.plugin", plugin) ==
          "base.toml:" + std::to_string(line_of(kBase, "plugin = \"sgd\"")));
  }
  SECTION("malformed overrides") {
    CHECK_THAT(error_of([&] { d.apply_set("optimizer.lr"); }),
               Catch::Contains("'optimizer.lr'") && Catch::Contains("expected key=value"));
    CHECK_THAT(error_of([&] { d.apply_set("=3"); }), Catch::Contains("expected key=value"));
    CHECK_THAT(error_of([&] { d.apply_set("run..seed=1"); }),
               Catch::Contains("run..seed") && Catch::Contains("empty part"));
    std::string msg = error_of([&] { d.apply_set("run.name.first=x"); });
    CHECK(msg.rfind("--set run.name.first=x: ", 0) == 0);
    CHECK_THAT(msg, Catch::Contains("'name' is a value, not a section"));
  }
}

TEST_CASE("overrides: --set overrides reach the validated job", "[config]") {
  TempDir dir;
  tessera::Job job = load_text(
      dir, kBase,
      {"optimizer.lr=0.05", "optimizer.momentum=0.9", "run.seed=9", "model.hidden=[16, 8]",
       "data.train.limit=100", "batch.micro=4", "run.name=override"});
  CHECK(job.plugin("optimizer").values["lr"].value_or(0.0) == 0.05);
  CHECK(job.plugin("optimizer").values["momentum"].value_or(0.0) == 0.9);
  CHECK(job.settings.seed == 9);
  CHECK(job.settings.name == "override");
  CHECK(job.settings.dir == "runs/override");
  CHECK(job.settings.micro_batch == 4);
  CHECK(job.settings.global_batch == 4);
  const toml::array *hidden = job.plugin("model").values["hidden"].as_array();
  REQUIRE(hidden != nullptr);
  CHECK(hidden->size() == 2);
  CHECK(job.plugin("data.train").values["limit"].value_or(int64_t{0}) == 100);
  // An integer where a number is declared is widened.
  tessera::Job widened = load_text(dir, kBase, {"optimizer.lr=1"});
  const toml::node *lr = widened.plugin("optimizer").values.get("lr");
  REQUIRE(lr != nullptr);
  CHECK(lr->is_floating_point());
  CHECK(lr->value_or(0.0) == 1.0);
}

// ---------------------------------------------------------------------------
// Validation of whole jobs

TEST_CASE("a valid job resolves every default", "[config]") {
  TempDir dir;
  tessera::Job job = load_text(dir, kBase);
  CHECK(job.settings.name == "unit");
  CHECK(job.settings.device == "cpu");
  CHECK(job.settings.precision == "fp32");
  CHECK(job.settings.log_every == 50);
  CHECK(job.settings.schedule.type == "constant");
  CHECK(job.settings.ckpt_keep == 3);
  CHECK(job.settings.ckpt_dir == "runs/unit/ckpt");
  CHECK(job.plugin("optimizer").entry->desc->name == std::string("sgd"));
  CHECK(job.plugin("optimizer").values["momentum"].value_or(-1.0) == 0.0);
  CHECK_FALSE(job.plugin("optimizer").values.contains("plugin"));
  // Slots with defaults are filled; the optional eval set is not.
  CHECK(job.plugin("sampler").entry->desc->name == std::string("distributed"));
  CHECK(job.plugin("zero").entry->desc->name == std::string("stage0"));
  CHECK(job.plugin("offload").entry->desc->name == std::string("none"));
  CHECK_FALSE(job.has("data.eval"));
  CHECK(job.plugin("data.train").values["normalize"].value_or(false) == true);
  CHECK(job.doc.warnings().empty());

  // The resolved config (what `tessera config check` prints) is TOML that
  // names every plugin and parameter.
  toml::table resolved = toml::parse(job.resolved_toml());
  CHECK(resolved["optimizer"]["plugin"].value_or(std::string()) == "sgd");
  CHECK(resolved["optimizer"]["nesterov"].value_or(true) == false);
  CHECK(resolved["data"]["train"]["plugin"].value_or(std::string()) == "idx");
  CHECK(resolved["data"]["workers"].value_or(int64_t{0}) == 1);
  CHECK(resolved["batch"]["global"].value_or(int64_t{0}) == 8);
  CHECK(resolved["batch"]["accumulation"].value_or(int64_t{0}) == 1);
  CHECK(resolved["zero"]["plugin"].value_or(std::string()) == "stage0");

  // Evaluation needs only the model and the data.
  std::string no_optimizer = kBase.substr(0, kBase.find("[optimizer]"));
  tessera::Job eval = tessera::load_job(options(dir.write("eval.toml", no_optimizer)), 1, false);
  CHECK_FALSE(eval.has("optimizer"));
  CHECK(eval.has("model"));
  CHECK_THAT(error_of([&] { load_text(dir, no_optimizer); }),
             Catch::Contains("[optimizer] needs 'plugin'"));
}

// ---------------------------------------------------------------------------
// The batch rule

namespace {

struct Batch {
  int64_t global, micro, accumulation;
};

Batch resolve(Batch b, uint32_t world) {
  tessera::config::resolve_batch(b.global, b.micro, b.accumulation, world, "here");
  return b;
}

std::string batch_error(Batch b, uint32_t world) {
  return error_of([&] { resolve(b, world); });
}

}  // namespace

TEST_CASE("the batch rule derives what is missing", "[config]") {
  auto check = [](Batch given, uint32_t world, Batch want) {
    INFO("given " << given.global << "/" << given.micro << "/" << given.accumulation << " world "
                  << world);
    Batch got = resolve(given, world);
    CHECK(got.global == want.global);
    CHECK(got.micro == want.micro);
    CHECK(got.accumulation == want.accumulation);
    CHECK(got.global == got.micro * got.accumulation * static_cast<int64_t>(world));
  };
  // global only: no accumulation, split over the ranks.
  check({64, 0, 0}, 1, {64, 64, 1});
  check({64, 0, 0}, 4, {64, 16, 1});
  // micro only, and micro with accumulation.
  check({0, 8, 0}, 1, {8, 8, 1});
  check({0, 8, 0}, 4, {32, 8, 1});
  check({0, 8, 3}, 1, {24, 8, 3});
  check({0, 8, 3}, 4, {96, 8, 3});
  // global and micro: accumulation derived.
  check({64, 8, 0}, 1, {64, 8, 8});
  check({64, 8, 0}, 4, {64, 8, 2});
  // global and accumulation: micro derived.
  check({64, 0, 2}, 1, {64, 32, 2});
  check({64, 0, 2}, 4, {64, 8, 2});
  // all three, consistent.
  check({64, 8, 8}, 1, {64, 8, 8});
  check({64, 8, 2}, 4, {64, 8, 2});
}

TEST_CASE("a batch mismatch shows all four numbers", "[config]") {
  auto has_all = [](const std::string &msg, int64_t g, int64_t m, int64_t a, int64_t w) {
    INFO(msg);
    CHECK(msg.rfind("here: ", 0) == 0);
    CHECK_THAT(msg, Catch::Contains("global (train_batch_size) = " + std::to_string(g)));
    CHECK_THAT(msg,
               Catch::Contains("micro (train_micro_batch_size_per_gpu) = " + std::to_string(m)));
    CHECK_THAT(
        msg, Catch::Contains("accumulation (gradient_accumulation_steps) = " + std::to_string(a)));
    CHECK_THAT(msg, Catch::Contains("world size = " + std::to_string(w)));
    CHECK_THAT(msg, Catch::Contains("global = micro x accumulation x world"));
  };
  // All three given, inconsistent.
  has_all(batch_error({64, 8, 3}, 1), 64, 8, 3, 1);
  has_all(batch_error({64, 8, 3}, 4), 64, 8, 3, 4);
  CHECK_THAT(batch_error({64, 8, 3}, 4), Catch::Contains("96 != 64"));
  // Consistent for one world size, not for another.
  has_all(batch_error({64, 8, 8}, 4), 64, 8, 8, 4);
  // Nothing divides.
  has_all(batch_error({60, 8, 0}, 1), 60, 8, 0, 1);
  // (global alone means no accumulation, as in DeepSpeed.)
  has_all(batch_error({64, 0, 0}, 3), 64, 0, 1, 3);
  has_all(batch_error({64, 0, 3}, 4), 64, 0, 3, 4);
  // global smaller than one micro-batch per rank.
  has_all(batch_error({4, 4, 0}, 4), 4, 4, 0, 4);
  has_all(batch_error({2, 0, 0}, 4), 2, 0, 1, 4);
  // Neither global nor micro.
  CHECK_THAT(batch_error({0, 0, 0}, 1), Catch::Contains("[batch] needs 'global' or 'micro'"));
  CHECK_THAT(batch_error({0, 0, 4}, 4), Catch::Contains("[batch] needs 'global' or 'micro'"));
}

TEST_CASE("the batch rule in a job, for 1 and 4 ranks", "[config]") {
  TempDir dir;
  std::string text = edit(kBase, "micro = 8", "global = 64\nmicro = 8");
  tessera::Job one = load_text(dir, text, {}, 1);
  CHECK(one.settings.global_batch == 64);
  CHECK(one.settings.micro_batch == 8);
  CHECK(one.settings.accumulation == 8);
  tessera::Job four = load_text(dir, text, {}, 4);
  CHECK(four.settings.accumulation == 2);
  CHECK(toml::parse(four.resolved_toml())["batch"]["accumulation"].value_or(int64_t{0}) == 2);

  std::string bad = edit(kBase, "micro = 8", "global = 64\nmicro = 8\naccumulation = 2");
  CHECK(load_text(dir, bad, {}, 4).settings.accumulation == 2);
  std::string msg = load_error(dir, bad, "[batch]", {}, 1);
  CHECK_THAT(msg, Catch::Contains("global (train_batch_size) = 64") &&
                      Catch::Contains("micro (train_micro_batch_size_per_gpu) = 8") &&
                      Catch::Contains("accumulation (gradient_accumulation_steps) = 2") &&
                      Catch::Contains("world size = 1"));
  msg = load_error(dir, kBase, "", {"batch.global=30"}, 4);
  CHECK_THAT(msg, Catch::Contains("global (train_batch_size) = 30") &&
                      Catch::Contains("micro (train_micro_batch_size_per_gpu) = 8") &&
                      Catch::Contains("world size = 4"));
}

TEST_CASE("did_you_mean picks the closest name, or none", "[config]") {
  using tessera::config::did_you_mean;
  CHECK(did_you_mean("lrr", {"lr", "momentum", "nesterov"}) == "lr");
  CHECK(did_you_mean("momentun", {"lr", "momentum", "nesterov"}) == "momentum");
  CHECK(did_you_mean("weightdecay", {"lr", "weight_decay"}) == "weight_decay");
  CHECK(did_you_mean("banana", {"lr", "momentum"}).empty());
  CHECK(did_you_mean("x", {}).empty());
}

}  // namespace unit_test_config
