// Config: TOML documents and their syntax errors, typed --set overrides, and
// validation of whole jobs (load_job on TOML files written here) against the
// engine's schema and each plugin's declared parameters: unknown keys and
// sections with file:line and did-you-mean, wrong types, ranges, choices,
// missing required keys, unknown plugins, errors from --set, and the batch
// rule global = micro x accumulation x world.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "config/settings.hpp"
#include "train/job.hpp"

namespace {

namespace fs = std::filesystem;
using tessera::JobOptions;
using tessera::config::ConfigError;
using tessera::config::Document;
using tessera::config::find;

// A fresh directory, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tessera_config_XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;
  std::string file(const std::string &name) const { return (path_ / name).string(); }
  std::string write(const std::string &name, const std::string &text) const {
    std::string p = file(name);
    std::ofstream out(p);
    out << text;
    REQUIRE(out.good());
    return p;
  }

 private:
  fs::path path_;
};

// The message of the ConfigError `fn` throws; fails the test when it throws
// nothing.
std::string error_of(const std::function<void()> &fn) {
  try {
    fn();
  } catch (const ConfigError &e) {
    return e.what();
  }
  FAIL("expected a ConfigError");
  return "";
}

// 1-based line of the first line of `text` containing `needle`.
int line_of(const std::string &text, const std::string &needle) {
  size_t at = text.find(needle);
  REQUIRE(at != std::string::npos);
  int line = 1;
  for (size_t i = 0; i < at; ++i) line += text[i] == '\n';
  return line;
}

// A small valid training config; tests append to it or edit it.
const std::string kBase = R"([run]
name = "unit"
device = "cpu"
seed = 1

[batch]
micro = 8

[model]
plugin = "mlp"
hidden = [4]

[data.train]
plugin = "idx"
images = "train-images.gz"
labels = "train-labels.gz"

[optimizer]
plugin = "sgd"
lr = 0.1
)";

// `text` with the first `from` replaced by `to`.
std::string edit(std::string text, const std::string &from, const std::string &to) {
  size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

JobOptions options(const std::string &config, std::vector<std::string> sets = {}) {
  JobOptions o;
  o.config_path = config;
  o.sets = std::move(sets);
  o.plugin_paths = {TESSERA_TEST_PLUGIN_DIR};
  return o;
}

// Writes `text` as unit.toml and loads it for training on `world` ranks.
tessera::Job load_text(const TempDir &dir, const std::string &text,
                       std::vector<std::string> sets = {}, uint32_t world = 1) {
  return tessera::load_job(options(dir.write("unit.toml", text), std::move(sets)), world, true);
}

// The ConfigError of loading `text`, checked to name unit.toml at the line
// holding `needle` (when given).
std::string load_error(const TempDir &dir, const std::string &text, const std::string &needle,
                       std::vector<std::string> sets = {}, uint32_t world = 1) {
  std::string msg = error_of([&] { load_text(dir, text, sets, world); });
  if (!needle.empty()) {
    std::string where = dir.file("unit.toml") + ":" + std::to_string(line_of(text, needle)) + ": ";
    INFO(msg);
    CHECK(msg.rfind(where, 0) == 0);
  }
  return msg;
}

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

TEST_CASE("an unknown key in an engine section names file:line and the closest key", "[config]") {
  TempDir dir;
  SECTION("[run]") {
    std::string text = edit(kBase, "seed = 1", "sed = 1");
    std::string msg = load_error(dir, text, "sed = 1");
    CHECK_THAT(msg, Catch::Contains("unknown key 'sed' in [run]") &&
                        Catch::Contains("did you mean 'seed'?"));
  }
  SECTION("[batch]") {
    std::string text = edit(kBase, "micro = 8", "micro = 8\nacumulation = 2");
    std::string msg = load_error(dir, text, "acumulation");
    CHECK_THAT(msg, Catch::Contains("unknown key 'acumulation' in [batch]") &&
                        Catch::Contains("did you mean 'accumulation'?"));
  }
  SECTION("[data] (beside its train and eval sections)") {
    std::string text = edit(kBase, "[data.train]", "[data]\nworker = 2\n\n[data.train]");
    std::string msg = load_error(dir, text, "worker = 2");
    CHECK_THAT(msg, Catch::Contains("unknown key 'worker' in [data]") &&
                        Catch::Contains("did you mean 'workers'?"));
  }
  SECTION("nothing close: the known keys are listed") {
    std::string text = kBase + "\n[checkpoint]\nkeep = 2\nzzzzzzzz = 1\n";
    std::string msg = load_error(dir, text, "zzzzzzzz");
    CHECK_THAT(msg, Catch::Contains("unknown key 'zzzzzzzz' in [checkpoint]") &&
                        Catch::Contains("known keys:") && Catch::Contains(" keep") &&
                        Catch::Contains(" every"));
  }
}

TEST_CASE("an unknown key in a plugin section names file:line and the closest key", "[config]") {
  TempDir dir;
  SECTION("optimizer lrr") {
    std::string text = kBase + "lrr = 0.01\n";
    std::string msg = load_error(dir, text, "lrr = 0.01");
    CHECK_THAT(msg, Catch::Contains("unit.toml:" + std::to_string(line_of(text, "lrr"))));
    CHECK_THAT(msg, Catch::Contains("unknown key 'lrr' in [optimizer]") &&
                        Catch::Contains("did you mean 'lr'?"));
  }
  SECTION("a key of another plugin (adam's betas on sgd)") {
    std::string text = kBase + "betas = [0.9, 0.99]\n";
    std::string msg = load_error(dir, text, "betas");
    CHECK_THAT(msg, Catch::Contains("unknown key 'betas' in [optimizer]"));
  }
  SECTION("[data.train]") {
    std::string text = edit(kBase, "labels = ", "limt = 10\nlabels = ");
    std::string msg = load_error(dir, text, "limt = 10");
    CHECK_THAT(msg, Catch::Contains("unknown key 'limt' in [data.train]") &&
                        Catch::Contains("did you mean 'limit'?"));
  }
  SECTION("[model]") {
    std::string text = edit(kBase, "hidden = [4]", "hiden = [4]");
    std::string msg = load_error(dir, text, "hiden");
    CHECK_THAT(msg, Catch::Contains("did you mean 'hidden'?"));
  }
}

TEST_CASE("an unknown top-level section names file:line and the closest section", "[config]") {
  TempDir dir;
  SECTION("a misspelt plugin slot") {
    std::string text = edit(kBase, "[optimizer]", "[optimiser]");
    std::string msg = load_error(dir, text, "[optimiser]");
    CHECK_THAT(msg, Catch::Contains("unknown section or key 'optimiser'") &&
                        Catch::Contains("did you mean 'optimizer'?"));
  }
  SECTION("a misspelt engine section") {
    std::string text = kBase + "\n[chekpoint]\nkeep = 1\n";
    std::string msg = load_error(dir, text, "[chekpoint]");
    CHECK_THAT(msg, Catch::Contains("did you mean 'checkpoint'?"));
  }
  SECTION("a top-level key") {
    std::string text = "epochs = 3\n" + kBase;
    std::string msg = load_error(dir, text, "epochs = 3");
    CHECK_THAT(msg, Catch::Contains("unknown section or key 'epochs'"));
  }
  SECTION("an unknown data set slot") {
    std::string text = kBase + "\n[data.test]\nplugin = \"idx\"\n";
    std::string msg = load_error(dir, text, "[data.test]");
    CHECK_THAT(msg, Catch::Contains("unknown key 'test' in [data]"));
  }
}

TEST_CASE("a wrong type says what was expected", "[config]") {
  TempDir dir;
  SECTION("a string for a number") {
    std::string text = edit(kBase, "lr = 0.1", "lr = \"fast\"");
    std::string msg = load_error(dir, text, "lr = \"fast\"");
    CHECK_THAT(msg, Catch::Contains("optimizer.lr: expected a number, got \"fast\""));
  }
  SECTION("a float for an integer") {
    std::string text = edit(kBase, "seed = 1", "seed = 1.5");
    std::string msg = load_error(dir, text, "seed = 1.5");
    CHECK_THAT(msg, Catch::Contains("run.seed: expected an integer, got 1.5"));
  }
  SECTION("an integer for a boolean") {
    std::string text = kBase + "nesterov = 1\n";
    std::string msg = load_error(dir, text, "nesterov");
    CHECK_THAT(msg, Catch::Contains("optimizer.nesterov: expected a boolean"));
  }
  SECTION("a number for a string") {
    std::string text = edit(kBase, "name = \"unit\"", "name = 5");
    std::string msg = load_error(dir, text, "name = 5");
    CHECK_THAT(msg, Catch::Contains("run.name: expected a string, got 5"));
  }
  SECTION("a scalar for an array") {
    std::string text = edit(kBase, "hidden = [4]", "hidden = 4");
    std::string msg = load_error(dir, text, "hidden = 4");
    CHECK_THAT(msg, Catch::Contains("model.hidden: expected an array of integers, got 4"));
  }
  SECTION("a bad array element") {
    std::string text = edit(kBase, "hidden = [4]", "hidden = [4, \"x\"]");
    std::string msg = load_error(dir, text, "hidden = [4");
    CHECK_THAT(msg, Catch::Contains("model.hidden: expected an integer, got \"x\""));
  }
  SECTION("a value where a section belongs") {
    std::string text = "sampler = 3\n" + kBase;
    std::string msg = load_error(dir, text, "sampler = 3");
    CHECK_THAT(msg, Catch::Contains("'sampler' must be a section"));
  }
  SECTION("a plugin name that is not a string") {
    std::string text = edit(kBase, "plugin = \"sgd\"", "plugin = 3");
    std::string msg = load_error(dir, text, "plugin = 3");
    CHECK_THAT(msg, Catch::Contains("optimizer.plugin: expected a string"));
  }
}

TEST_CASE("an out-of-range value says the bound", "[config]") {
  TempDir dir;
  SECTION("negative lr") {
    std::string text = edit(kBase, "lr = 0.1", "lr = -0.1");
    std::string msg = load_error(dir, text, "lr = -0.1");
    CHECK_THAT(msg, Catch::Contains("optimizer.lr: must be >= 0, got -0.1"));
  }
  SECTION("momentum above 1") {
    std::string text = kBase + "momentum = 1.5\n";
    std::string msg = load_error(dir, text, "momentum");
    CHECK_THAT(msg, Catch::Contains("optimizer.momentum: must be <= 1, got 1.5"));
  }
  SECTION("an engine key: log_every = 0") {
    std::string text = edit(kBase, "seed = 1", "seed = 1\nlog_every = 0");
    std::string msg = load_error(dir, text, "log_every");
    CHECK_THAT(msg, Catch::Contains("run.log_every: must be >= 1, got 0"));
  }
  SECTION("an array element") {
    std::string text = edit(kBase, "hidden = [4]", "hidden = [4, 0]");
    std::string msg = load_error(dir, text, "hidden = [4, 0]");
    CHECK_THAT(msg, Catch::Contains("model.hidden: must be >= 1, got 0"));
  }
  SECTION("negative batch") {
    std::string text = edit(kBase, "micro = 8", "micro = -8");
    std::string msg = load_error(dir, text, "micro = -8");
    CHECK_THAT(msg, Catch::Contains("batch.micro: must be >= 0, got -8"));
  }
  SECTION("inf and nan") {
    std::string text = edit(kBase, "lr = 0.1", "lr = inf");
    std::string msg = load_error(dir, text, "lr = inf");
    CHECK_THAT(msg, Catch::Contains("expected a finite number"));
  }
}

TEST_CASE("a string outside its choices lists them", "[config]") {
  TempDir dir;
  SECTION("run.device") {
    std::string text = edit(kBase, "device = \"cpu\"", "device = \"gpu\"");
    std::string msg = load_error(dir, text, "device = \"gpu\"");
    CHECK_THAT(msg, Catch::Contains("run.device: \"gpu\" is not one of auto|cpu|cuda"));
  }
  SECTION("a plugin choice, with a did-you-mean") {
    std::string text = edit(kBase, "hidden = [4]", "hidden = [4]\nactivation = \"rellu\"");
    std::string msg = load_error(dir, text, "activation");
    CHECK_THAT(msg, Catch::Contains("model.activation: \"rellu\" is not one of relu|gelu|tanh") &&
                        Catch::Contains("did you mean \"relu\"?"));
  }
  SECTION("schedule.type") {
    std::string text = kBase + "\n[schedule]\ntype = \"cosine\"\n";
    std::string msg = load_error(dir, text, "type = \"cosine\"");
    CHECK_THAT(msg, Catch::Contains("schedule.type: \"cosine\" is not one of "
                                    "constant|warmup|warmup_decay|warmup_cosine|one_cycle"));
  }
}

TEST_CASE("a missing required plugin key names the section and the key", "[config]") {
  TempDir dir;
  std::string text = edit(kBase, "images = \"train-images.gz\"\n", "");
  std::string msg = load_error(dir, text, "[data.train]");
  CHECK_THAT(msg, Catch::Contains("[data.train] needs 'images' (a string)"));

  std::string eval = kBase + "\n[data.eval]\nplugin = \"idx\"\nimages = \"t10k-images.gz\"\n";
  msg = load_error(dir, eval, "[data.eval]");
  CHECK_THAT(msg, Catch::Contains("[data.eval] needs 'labels'"));
}

TEST_CASE("an unknown plugin names the plugin key's line and the closest plugin", "[config]") {
  TempDir dir;
  SECTION("optimizer") {
    std::string text = edit(kBase, "plugin = \"sgd\"", "plugin = \"adma\"");
    std::string msg = load_error(dir, text, "plugin = \"adma\"");
    CHECK_THAT(msg, Catch::Contains("[optimizer] no optimizer plugin named 'adma'") &&
                        Catch::Contains("did you mean 'adam'?") &&
                        Catch::Contains("known optimizer plugins:") && Catch::Contains("sgd"));
  }
  SECTION("model") {
    std::string text = edit(kBase, "plugin = \"mlp\"", "plugin = \"mpl\"");
    std::string msg = load_error(dir, text, "plugin = \"mpl\"");
    CHECK_THAT(msg, Catch::Contains("no model plugin named 'mpl'") &&
                        Catch::Contains("did you mean 'mlp'?"));
  }
  SECTION("a slot with a default plugin") {
    std::string text = kBase + "\n[zero]\nplugin = \"stage9\"\n";
    std::string msg = load_error(dir, text, "plugin = \"stage9\"");
    CHECK_THAT(msg, Catch::Contains("no zero plugin named 'stage9'") &&
                        Catch::Contains("did you mean 'stage0'?"));
  }
}

TEST_CASE("errors from --set name the override", "[config]") {
  TempDir dir;
  auto msg_of = [&](const std::string &set) {
    return error_of([&] { load_text(dir, kBase, {set}); });
  };
  std::string msg = msg_of("optimizer.lrr=0.1");
  CHECK(msg.rfind("--set optimizer.lrr=0.1: ", 0) == 0);
  CHECK_THAT(msg, Catch::Contains("unknown key 'lrr' in [optimizer]; did you mean 'lr'?"));

  msg = msg_of("optimizer.lr=abc");
  CHECK(msg.rfind("--set optimizer.lr=abc: ", 0) == 0);
  CHECK_THAT(msg, Catch::Contains("expected a number, got \"abc\""));

  msg = msg_of("optimizer.lr=-1");
  CHECK(msg.rfind("--set optimizer.lr=-1: ", 0) == 0);
  CHECK_THAT(msg, Catch::Contains("must be >= 0"));

  msg = msg_of("run.device=gpu");
  CHECK(msg.rfind("--set run.device=gpu: ", 0) == 0);
  CHECK_THAT(msg, Catch::Contains("is not one of auto|cpu|cuda"));

  msg = msg_of("optimizer.plugin=adma");
  CHECK(msg.rfind("--set optimizer.plugin=adma: ", 0) == 0);
  CHECK_THAT(msg, Catch::Contains("did you mean 'adam'?"));

  msg = msg_of("optimzer.lr=0.1");
  CHECK(msg.rfind("--set optimzer.lr=0.1: ", 0) == 0);
  CHECK_THAT(msg, Catch::Contains("unknown section or key 'optimzer'; did you mean 'optimizer'?"));

  msg = msg_of("run.seed=1.5");
  CHECK(msg.rfind("--set run.seed=1.5: ", 0) == 0);
  CHECK_THAT(msg, Catch::Contains("expected an integer"));
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
