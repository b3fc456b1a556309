// The rest of the command line: plugins, version, help, config check and
// convert, and the errors a user meets (each must exit non-zero and say
// what is wrong, where).
#include <toml++/toml.h>

#include <catch2/catch.hpp>
#include <regex>
#include <sstream>

#include "harness.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace itest_test_cli {

using namespace tessera::itest;

namespace {

// The 1-based line of `text` that contains `part`.
int line_of(const std::string &text, const std::string &part) {
  auto ls = lines(text);
  for (size_t i = 0; i < ls.size(); ++i)
    if (contains(ls[i], part)) return static_cast<int>(i) + 1;
  return 0;
}

// Runs a command that must fail; returns its result.
RunResult fails(const std::vector<std::string> &args) {
  RunResult r = run_cli(args);
  INFO(describe(r));
  CHECK(r.status != 0);
  CHECK(r.status < 128);  // an error, not a crash
  return r;
}

const char *kTutorialDs =
    R"({"train_batch_size": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.001, "momentum": 0.9}}})";

}  // namespace

TEST_CASE("plugins lists every shipped plugin with kind, name, version, devices and file",
          "[cli][plugins]") {
  RunResult r = run_cli({"plugins"});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  auto ls = lines(r.out);
  REQUIRE(!ls.empty());
  CHECK(contains(ls[0], "KIND"));
  CHECK(contains(ls[0], "NAME"));
  CHECK(contains(ls[0], "VERSION"));
  CHECK(contains(ls[0], "DEVICES"));
  CHECK(contains(ls[0], "FILE"));
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"model", "mlp"},          {"dataset", "idx"},   {"sampler", "distributed"},
      {"sampler", "sequential"}, {"optimizer", "sgd"}, {"optimizer", "adam"},
      {"optimizer", "adamw"},    {"zero", "stage0"},   {"offload", "none"}};
  for (const auto &[kind, name] : expected) {
    INFO(kind << " " << name);
    bool found = false;
    for (const auto &line : ls) {
      std::istringstream in(line);
      std::string k, n, version, devices, file;
      in >> k >> n >> version >> devices >> file;
      if (k != kind || n != name) continue;
      found = true;
      CHECK(version == "1.0.0");
      CHECK(contains(devices, "cpu"));
      CHECK(fs::path(file).is_absolute());
      CHECK(fs::exists(file));
      CHECK(fs::path(file).extension() == ".so");
    }
    CHECK(found);
  }
  // Every library of this build loads (a copy installed elsewhere may be
  // refused as a duplicate; that is not this build's fault).
  const std::string build_plugins =
      (fs::path(TESSERA_BINARY).parent_path().parent_path() / "lib" / "tessera" / "plugins")
          .string();
  bool refused_section = false;
  for (const auto &line : ls) {
    if (line == "refused:") refused_section = true;
    if (refused_section) CHECK(!contains(line, build_plugins));
  }
}

TEST_CASE("plugins show prints a plugin's parameters with defaults and docs", "[cli][plugins]") {
  RunResult r = run_cli({"plugins", "show", "adam"});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "optimizer adam 1.0.0"));
  const std::vector<std::pair<std::string, std::string>> params = {{"lr", "0.001"},
                                                                   {"betas", "[0.9, 0.999]"},
                                                                   {"eps", "1e-8"},
                                                                   {"weight_decay", "0.0"},
                                                                   {"adamw", "false"}};
  auto ls = lines(r.out);
  for (const auto &[name, def] : params) {
    INFO(name);
    int at = 0;
    for (size_t i = 0; i < ls.size(); ++i) {
      std::istringstream in(ls[i]);
      std::string first;
      in >> first;
      if (first == name) at = static_cast<int>(i);
    }
    REQUIRE(at > 0);
    CHECK(contains(ls[static_cast<size_t>(at)], "default " + def));
    // The doc line follows and says something.
    REQUIRE(static_cast<size_t>(at) + 1 < ls.size());
    CHECK(ls[static_cast<size_t>(at) + 1].find_first_not_of(' ') >= 4);
    CHECK(ls[static_cast<size_t>(at) + 1].size() > 10);
  }

  RunResult bad = fails({"plugins", "show", "adma"});
  CHECK(contains(bad.err, "adma"));
  CHECK(contains(bad.err, "did you mean 'adam'"));
}

TEST_CASE("version prints the version and the plugin ABI", "[cli]") {
  for (const char *cmd : {"version", "--version"}) {
    RunResult r = run_cli({cmd});
    INFO(describe(r));
    CHECK(r.status == 0);
    CHECK(std::regex_search(r.out, std::regex(R"(^tessera \d+\.\d+\.\d+)")));
    // Major 1, any minor: the minor counts up as the ABI grows.
    CHECK(std::regex_search(r.out, std::regex(R"(\(plugin ABI 1\.\d+\)\n)")));
  }
}

TEST_CASE("commands refuse arguments they do not take", "[cli][errors]") {
  const std::vector<std::vector<std::string>> cases = {
      {"version", "foo"},  {"version", "--json"},        {"config"},
      {"config", "check"}, {"config", "lint", "x.toml"}, {"config", "convert"},
      {"plugins", "list"}, {"plugins", "show"}};
  for (const auto &args : cases) {
    RunResult r = run_cli(args);
    std::string cmd;
    for (const auto &a : args) cmd += " " + a;
    INFO("tessera" << cmd << "\n" << describe(r));
    CHECK(r.status == 2);
    CHECK(contains(r.err, "usage: tessera " + args[0]));
    CHECK(r.out.empty());
  }
}

TEST_CASE("help: --help works for tessera and every command", "[cli][help]") {
  const std::vector<std::vector<std::string>> cases = {{"--help"},
                                                       {"-h"},
                                                       {"help"},
                                                       {"run", "--help"},
                                                       {"eval", "--help"},
                                                       {"plugins", "--help"},
                                                       {"config", "--help"},
                                                       {"version", "--help"},
                                                       {"generate", "--help"},
                                                       {"run", "-h"}};
  for (const auto &args : cases) {
    RunResult r = run_cli(args);
    INFO(args[0] << (args.size() > 1 ? " " + args[1] : "") << "\n" << describe(r));
    CHECK(r.status == 0);
    CHECK(contains(r.out, "usage: tessera"));
    CHECK(r.err.empty());
  }
  RunResult top = run_cli({"--help"});
  for (const char *cmd : {"run", "eval", "generate", "plugins", "config", "version"})
    CHECK(contains(top.out, std::string("  ") + cmd));
  // Help on a command wins over its missing arguments.
  CHECK(contains(run_cli({"run", "--help"}).out, "--set"));
  CHECK(contains(run_cli({"eval", "--help"}).out, "--ckpt"));
  CHECK(contains(run_cli({"generate", "--help"}).out, "--top-k"));
  // No arguments at all: usage on stderr, exit 2.
  RunResult none = run_cli({});
  CHECK(none.status == 2);
  CHECK(contains(none.err, "usage: tessera"));
}

TEST_CASE("generate names the flag or file that is wrong", "[cli][generate]") {
  RunResult r = run_cli({"generate", "--ckpt", (scratch() / "none").string()});
  CHECK(r.status == 2);
  CHECK(contains(r.err, "--prompt"));
  r = run_cli({"generate", "--ckpt", (scratch() / "none").string(), "--prompt", "x"});
  CHECK(r.status == 1);
  CHECK(contains(r.err, (scratch() / "none").string()));
  r = run_cli({"generate", "--ckpt", "x", "--prompt", "x", "--top-k", "-1"});
  CHECK(r.status == 2);
  CHECK(contains(r.err, "--top-k"));
  r = run_cli({"generate", "--ckpt", "x", "--prompt", "x", "--encoder", "e.json"});
  CHECK(r.status == 2);
  CHECK(contains(r.err, "--bpe"));
}

TEST_CASE("config check prints the resolved config", "[cli][config]") {
  Setup s = setup();
  RunResult r = run_cli({"config", "check", s.config.string()});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  toml::table t;
  try {
    t = toml::parse(r.out);
  } catch (const toml::parse_error &e) {
    FAIL("config check output is not TOML: " << e.description());
  }
  CHECK(t["model"]["plugin"].value_or(std::string()) == "mlp");
  CHECK(t["data"]["workers"].is_integer());
  CHECK(t["optimizer"]["eps"].is_number());
  CHECK(t["zero"]["plugin"].value_or(std::string()) == "stage0");
  CHECK(t["run"]["steps"].value_or(int64_t{0}) == 60);
  // It does not train.
  CHECK(!fs::exists(s.run_dir / "summary.json"));

  SECTION("with --set and --deepspeed_config") {
    fs::path ds = scratch() / "ds.json";
    write_text(ds, kTutorialDs);
    RunResult r2 = run_cli({"config", "check", s.config.string(), "--deepspeed_config", ds.string(),
                            "--set", "run.steps=7"});
    INFO(describe(r2));
    REQUIRE(r2.status == 0);
    toml::table t2 = toml::parse(r2.out);
    CHECK(t2["optimizer"]["plugin"].value_or(std::string()) == "sgd");
    CHECK(t2["batch"]["global"].value_or(int64_t{0}) == 4);
    CHECK(t2["run"]["steps"].value_or(int64_t{0}) == 7);
  }
  SECTION("a broken config fails") {
    fs::path broken = scratch() / "broken.toml";
    write_text(broken, read_text(s.config) + "\n[model\n");
    RunResult b = fails({"config", "check", broken.string()});
    CHECK(contains(b.err, broken.string()));
  }
  SECTION("an invalid value fails") {
    RunResult b = fails({"config", "check", s.config.string(), "--set", "optimizer.lr=-1"});
    CHECK(contains(b.err, "lr"));
  }
}

TEST_CASE("config convert prints the TOML of a DeepSpeed JSON", "[cli][config]") {
  fs::path ds = scratch() / "ds.json";
  write_text(ds, kTutorialDs);
  RunResult r = run_cli({"config", "convert", ds.string()});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "[optimizer]"));
  // The value as TOML writes it ("sgd" or 'sgd').
  CHECK((contains(r.out, "plugin = \"sgd\"") || contains(r.out, "plugin = 'sgd'")));
  toml::table t = toml::parse(r.out);
  CHECK(t["optimizer"]["plugin"].value_or(std::string()) == "sgd");
  CHECK(t["optimizer"]["momentum"].value_or(0.0) == Approx(0.9));
  CHECK(t["optimizer"]["lr"].value_or(0.0) == Approx(0.001));
  CHECK(t["batch"]["global"].value_or(int64_t{0}) == 4);

  fs::path missing = scratch() / "missing.json";
  RunResult m = fails({"config", "convert", missing.string()});
  CHECK(contains(m.err, missing.string()));
}

TEST_CASE("errors exit non-zero and say what is wrong, where", "[errors]") {
  Setup s = setup();
  const std::string base = read_text(s.config);

  SECTION("missing config file") {
    fs::path missing = scratch() / "nope.toml";
    RunResult r = fails({"run", missing.string()});
    CHECK(contains(r.err, missing.string()));
    CHECK(!fs::exists(s.run_dir));
  }
  SECTION("unknown key in a plugin section: file:line and did-you-mean") {
    std::string text = base + "momentun = 0.9\n";  // appended to [optimizer]
    fs::path cfg = scratch() / "typo.toml";
    write_text(cfg, text);
    RunResult r = fails({"run", cfg.string()});
    int line = line_of(text, "momentun");
    CHECK(contains(r.err, cfg.string() + ":" + std::to_string(line)));
    CHECK(contains(r.err, "'momentun'"));
    CHECK(contains(r.err, "[optimizer]"));
    // adam has no parameter near it: the known ones are listed instead.
    CHECK(contains(r.err, "weight_decay"));
    CHECK(!fs::exists(s.run_dir / "summary.json"));
  }
  SECTION("misspelt plugin parameter: did-you-mean") {
    std::string text = base + "weight_decai = 0.1\n";
    fs::path cfg = scratch() / "typo.toml";
    write_text(cfg, text);
    RunResult r = fails({"run", cfg.string()});
    CHECK(contains(r.err, cfg.string() + ":" + std::to_string(line_of(text, "weight_decai"))));
    CHECK(contains(r.err, "did you mean 'weight_decay'"));
  }
  SECTION("unknown key in an engine section") {
    std::string text = base;
    text.insert(text.find("steps = 60"), "setps = 60\n");
    fs::path cfg = scratch() / "typo.toml";
    write_text(cfg, text);
    RunResult r = fails({"run", cfg.string()});
    CHECK(contains(r.err, cfg.string() + ":" + std::to_string(line_of(text, "setps"))));
    CHECK(contains(r.err, "'setps'"));
    CHECK(contains(r.err, "did you mean 'steps'"));
  }
  SECTION("unknown section") {
    std::string text = base + "\n[optimiser]\nlr = 0.1\n";
    fs::path cfg = scratch() / "typo.toml";
    write_text(cfg, text);
    RunResult r = fails({"run", cfg.string()});
    CHECK(contains(r.err, cfg.string() + ":"));
    CHECK(contains(r.err, "did you mean 'optimizer'"));
  }
  SECTION("unknown key through --set") {
    RunResult r = fails({"run", s.config.string(), "--set", "optimizer.lrr=0.1"});
    CHECK(contains(r.err, "lrr"));
    CHECK(contains(r.err, "did you mean 'lr'"));
  }
  SECTION("bad plugin name") {
    std::string text = base;
    text.replace(text.find("plugin = \"mlp\""), 14, "plugin = \"mpl\"");
    fs::path cfg = scratch() / "bad_plugin.toml";
    write_text(cfg, text);
    RunResult r = fails({"run", cfg.string()});
    CHECK(contains(r.err, "'mpl'"));
    CHECK(contains(r.err, "mlp"));  // suggested
    CHECK(contains(r.err, cfg.string() + ":" + std::to_string(line_of(text, "\"mpl\""))));
  }
  SECTION("a plugin of the wrong kind") {
    RunResult r = fails({"run", s.config.string(), "--set", "optimizer.plugin=\"mlp\""});
    CHECK(contains(r.err, "mlp"));
    CHECK(contains(r.err, "optimizer"));
  }
  SECTION("images file missing") {
    fs::path gone = s.data.train_images;
    fs::remove(gone);
    RunResult r = fails({"run", s.config.string()});
    CHECK(contains(r.err, gone.string()));
    CHECK(contains(r.err, "images"));
    // The run had started (its directory exists): its summary says it failed.
    auto sum = read_json(s.run_dir / "summary.json");
    CHECK(sum.at("status") == "failed");
    CHECK(contains(sum.at("reason").get<std::string>(), gone.string()));
  }
  SECTION("labels that do not match the images") {
    RunResult r = fails({"run", s.config.string(), "--set",
                         "data.train.labels=\"" + s.data.eval_labels.string() + "\""});
    CHECK(contains(r.err, s.data.eval_labels.string()));
  }
  SECTION("unknown option") {
    RunResult r = fails({"run", s.config.string(), "--bogus"});
    CHECK(r.status == 2);
    CHECK(contains(r.err, "'--bogus'"));
    CHECK(contains(r.err, "usage: tessera run"));
  }
  SECTION("run without a config") {
    RunResult r = fails({"run"});
    CHECK(r.status == 2);
    CHECK(contains(r.err, "CONFIG"));
    CHECK(contains(r.err, "usage: tessera run"));
  }
  SECTION("run with two configs") {
    RunResult r = fails({"run", s.config.string(), s.config.string()});
    CHECK(r.status == 2);
  }
  SECTION("--set without a value") {
    RunResult r = fails({"run", s.config.string(), "--set"});
    CHECK(r.status == 2);
    CHECK(contains(r.err, "--set"));
  }
  SECTION("a malformed --set") {
    RunResult r = fails({"run", s.config.string(), "--set", "run.steps"});
    CHECK(contains(r.err, "run.steps"));
  }
  SECTION("unknown command") {
    RunResult r = fails({"trian", s.config.string()});
    CHECK(r.status == 2);
    CHECK(contains(r.err, "'trian'"));
  }
  SECTION("a DeepSpeed batch that does not fit") {
    fs::path ds = scratch() / "ds.json";
    write_text(ds, R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4})");
    RunResult r = fails({"run", s.config.string(), "--deepspeed_config", ds.string()});
    CHECK(contains(r.err, "10"));
    CHECK(contains(r.err, "4"));
  }
  SECTION("a missing DeepSpeed JSON") {
    fs::path ds = scratch() / "nope.json";
    RunResult r = fails({"run", s.config.string(), "--deepspeed_config", ds.string()});
    CHECK(contains(r.err, ds.string()));
  }
}

}  // namespace itest_test_cli
