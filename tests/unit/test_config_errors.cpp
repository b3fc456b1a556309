// Config: validation errors of whole jobs (load_job on TOML files written
// here) against the engine's schema and each plugin's declared parameters:
// unknown keys and sections with file:line and did-you-mean, wrong types,
// ranges, choices, missing required keys, unknown plugins, and errors from
// --set naming the override.
#include <catch2/catch.hpp>
#include <string>

#include "config_support.hpp"
#include "train/job.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_config_errors {

using namespace tessera::test::config_support;

// ---------------------------------------------------------------------------
// Validation of whole jobs: errors

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

}  // namespace unit_test_config_errors
