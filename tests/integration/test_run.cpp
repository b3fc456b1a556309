// tessera run / eval end to end: what a run prints and writes, determinism,
// overrides, DeepSpeed configs, launcher flags, checkpoints and evaluation.
#include <toml++/toml.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <fstream>

#include "harness.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace itest_test_run {

using namespace tessera::itest;
using nlohmann::json;

namespace {

// `key = "value"` on a line of its own in TOML text (either string form).
bool has_string_key(const std::string &text, const std::string &key, const std::string &value) {
  for (const auto &line : lines(text)) {
    auto at = line.find_first_not_of(' ');
    if (at == std::string::npos) continue;
    std::string l = line.substr(at);
    if (l == key + " = \"" + value + "\"" || l == key + " = '" + value + "'") return true;
  }
  return false;
}

// Runs `tessera run CFG [args]` and requires success.
RunResult run_ok(const fs::path &config, std::vector<std::string> args = {},
                 const RunOptions &opts = {}) {
  args.insert(args.begin(), {"run", config.string()});
  RunResult r = run_cli(args, opts);
  INFO(describe(r));
  REQUIRE(r.status == 0);
  return r;
}

toml::table parse_toml(const fs::path &p) {
  try {
    return toml::parse_file(p.string());
  } catch (const toml::parse_error &e) {
    FAIL(p.string() << " does not parse as TOML: " << e.description() << "\n" << read_text(p));
  }
  return {};
}

// The JSON object a command prints on a line of its own (the last one).
json json_line(const std::string &out) {
  json found;
  for (const auto &line : lines(out))
    if (!line.empty() && line[0] == '{') found = json::parse(line);
  return found;
}

// Header of a safetensors file: 8-byte little-endian length, then JSON.
json safetensors_header(const fs::path &p) {
  std::ifstream in(p, std::ios::binary);
  uint8_t len_bytes[8] = {};
  in.read(reinterpret_cast<char *>(len_bytes), 8);
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | len_bytes[i];
  REQUIRE(in);
  REQUIRE(len > 0);
  REQUIRE(len < (1u << 20));
  std::string header(len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(len));
  REQUIRE(in);
  return json::parse(header);
}

}  // namespace

TEST_CASE("run trains the synthetic task and writes config, metrics and summary", "[run]") {
  Setup s = setup();
  RunResult r = run_ok(s.config);

  {  // progress, eval and summary on stdout
    int progress = 0;
    for (const auto &line : lines(r.out))
      if (line.rfind("step", 0) == 0 && contains(line, "loss") && contains(line, "samples/s") &&
          contains(line, "ETA"))
        ++progress;
    INFO(r.out);
    CHECK(progress == 6);  // steps 10, 20, ..., 60
    CHECK(contains(r.out, "step 60/60"));
    CHECK(contains(r.out, "eval at step 60"));
    CHECK(contains(r.out, "accuracy"));
    CHECK(contains(r.out, "== summary =="));
    CHECK(contains(r.out, "eval accuracy"));
    CHECK(contains(r.out, "run directory    " + s.run_dir.string()));
  }

  {  // config.toml is the resolved config
    fs::path p = s.run_dir / "config.toml";
    REQUIRE(fs::exists(p));
    CHECK(has_string_key(read_text(p), "plugin", "mlp"));
    toml::table t = parse_toml(p);
    CHECK(t["model"]["plugin"].value_or(std::string()) == "mlp");
    CHECK(t["run"]["steps"].value_or(int64_t{0}) == 60);
    CHECK(t["batch"]["micro"].value_or(int64_t{0}) == 32);
    // Defaults filled in: engine keys and plugin parameters alike.
    CHECK(t["data"]["workers"].is_integer());
    CHECK(t["data"]["prefetch"].is_integer());
    CHECK(t["batch"]["global"].value_or(int64_t{0}) == 32);
    CHECK(t["batch"]["accumulation"].value_or(int64_t{0}) == 1);
    CHECK(t["sampler"]["plugin"].value_or(std::string()) == "distributed");
    CHECK(t["zero"]["plugin"].value_or(std::string()) == "stage0");
    CHECK(t["offload"]["plugin"].value_or(std::string()) == "none");
    CHECK(t["model"]["activation"].value_or(std::string()) == "relu");
    CHECK(t["optimizer"]["betas"].is_array());
    CHECK(t["optimizer"]["lr"].value_or(0.0) == Approx(0.01));
    CHECK(t["data"]["train"]["normalize"].value_or(false) == true);
  }

  {  // metrics.jsonl has train and eval lines
    auto metrics = read_jsonl(s.run_dir / "metrics.jsonl");
    std::vector<int64_t> train_steps;
    int evals = 0;
    for (const auto &m : metrics) {
      INFO(m.dump());
      std::string type = m.value("type", "");
      if (type == "train") {
        train_steps.push_back(m.at("step").get<int64_t>());
        CHECK(m.at("loss").is_number());
        CHECK(m.at("lr").get<double>() == Approx(0.01));
        CHECK(m.at("samples_per_s").get<double>() > 0);
      } else if (type == "eval") {
        ++evals;
        CHECK(m.at("eval_loss").is_number());
        double acc = m.at("eval_accuracy").get<double>();
        CHECK(acc >= 0);
        CHECK(acc <= 1);
        CHECK(m.at("samples").get<int64_t>() == 256);
      } else {
        FAIL("unexpected metrics line " << m.dump());
      }
    }
    CHECK(train_steps == std::vector<int64_t>{10, 20, 30, 40, 50, 60});
    CHECK(evals >= 1);
  }

  {  // summary.json, and the task is learned
    json sum = read_json(s.run_dir / "summary.json");
    INFO(sum.dump(2));
    for (const char *k : {"steps", "train_loss", "eval_loss", "eval_accuracy", "samples_per_s",
                          "wall_s", "peak_memory_bytes"})
      CHECK(sum.at(k).is_number());
    CHECK(sum["steps"].get<int64_t>() == 60);
    CHECK(sum["samples"].get<int64_t>() == 60 * 32);
    CHECK(sum["samples_per_s"].get<double>() > 0);
    CHECK(sum["wall_s"].get<double>() > 0);
    CHECK(sum["peak_memory_bytes"].get<double>() > 0);
    // 4 classes: chance is 0.25.
    CHECK(sum["eval_accuracy"].get<double>() > 0.9);

    auto metrics = read_jsonl(s.run_dir / "metrics.jsonl");
    auto losses = train_losses(metrics);
    REQUIRE(losses.size() == 6);
    CHECK(losses.back() < 0.5 * losses.front());
    // The summary reports the final evaluation.
    json last_eval;
    for (const auto &m : metrics)
      if (m.value("type", "") == "eval") last_eval = m;
    REQUIRE(last_eval.is_object());
    CHECK(last_eval["step"].get<int64_t>() == 60);
    CHECK(last_eval["eval_accuracy"].get<double>() == Approx(sum["eval_accuracy"].get<double>()));
    CHECK(last_eval["eval_loss"].get<double>() == Approx(sum["eval_loss"].get<double>()));
  }

  {  // a final checkpoint
    fs::path ckpt = s.run_dir / "ckpt";
    REQUIRE(fs::exists(ckpt / "latest"));
    CHECK(lines(read_text(ckpt / "latest")).at(0) == "step_00000060");
    CHECK(fs::exists(ckpt / "step_00000060" / "rank_00000.safetensors"));
    CHECK(fs::exists(ckpt / "step_00000060" / "manifest.json"));
  }
}

TEST_CASE("run is deterministic for a seed, and another seed changes it", "[run]") {
  Setup s = setup();
  run_ok(s.config, {"--set", "run.dir=" + (scratch() / "a").string()});
  run_ok(s.config, {"--set", "run.dir=" + (scratch() / "b").string()});
  run_ok(s.config, {"--set", "run.dir=" + (scratch() / "c").string(), "--set", "run.seed=7"});
  auto a = read_jsonl(scratch() / "a" / "metrics.jsonl");
  auto b = read_jsonl(scratch() / "b" / "metrics.jsonl");
  auto c = read_jsonl(scratch() / "c" / "metrics.jsonl");
  auto la = train_losses(a), lb = train_losses(b), lc = train_losses(c);
  REQUIRE(la.size() == 6);
  CHECK(la == lb);  // bit for bit
  REQUIRE(lc.size() == la.size());
  CHECK(la != lc);
  // Evaluations agree too.
  auto eval_losses = [](const std::vector<json> &m) {
    std::vector<double> v;
    for (const auto &x : m)
      if (x.value("type", "") == "eval") v.push_back(x["eval_loss"].get<double>());
    return v;
  };
  CHECK(eval_losses(a) == eval_losses(b));
  CHECK(eval_losses(a) != eval_losses(c));
  CHECK(read_json(scratch() / "a" / "summary.json")["train_loss"] ==
        read_json(scratch() / "b" / "summary.json")["train_loss"]);
  CHECK(parse_toml(scratch() / "c" / "config.toml")["run"]["seed"].value_or(int64_t{0}) == 7);
}

TEST_CASE("run --set overrides config keys", "[run]") {
  Setup s = setup();
  run_ok(s.config, {"--set", "run.steps=20", "--set", "optimizer.lr=0.5", "--set=run.log_every=5",
                    "--set", "run.eval_every=10"});
  json sum = read_json(s.run_dir / "summary.json");
  CHECK(sum["steps"].get<int64_t>() == 20);
  toml::table t = parse_toml(s.run_dir / "config.toml");
  CHECK(t["optimizer"]["lr"].value_or(0.0) == Approx(0.5));
  CHECK(t["run"]["steps"].value_or(int64_t{0}) == 20);
  std::vector<int64_t> steps;
  for (const auto &m : read_jsonl(s.run_dir / "metrics.jsonl"))
    if (m.value("type", "") == "train") {
      steps.push_back(m["step"].get<int64_t>());
      CHECK(m["lr"].get<double>() == Approx(0.5));
    }
  CHECK(steps == std::vector<int64_t>{5, 10, 15, 20});
  // run.eval_every = 10 evaluates every 10 steps instead of every epoch.
  std::vector<int64_t> evals;
  for (const auto &m : read_jsonl(s.run_dir / "metrics.jsonl"))
    if (m.value("type", "") == "eval") evals.push_back(m["step"].get<int64_t>());
  CHECK(evals == std::vector<int64_t>{10, 20});
}

TEST_CASE("run --deepspeed_config layers a DeepSpeed JSON over the config", "[run][deepspeed]") {
  Setup s = setup();
  fs::path ds = scratch() / "ds.json";
  write_text(ds, R"({"train_batch_size": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.001, )"
                 R"("momentum": 0.9}}})");
  auto check_run = [](const fs::path &run_dir) {
    toml::table t = parse_toml(run_dir / "config.toml");
    const std::string text = read_text(run_dir / "config.toml");
    INFO(text);
    CHECK(has_string_key(text, "plugin", "sgd"));
    CHECK(t["optimizer"]["plugin"].value_or(std::string()) == "sgd");
    CHECK(t["optimizer"]["momentum"].value_or(0.0) == Approx(0.9));
    CHECK(t["optimizer"]["lr"].value_or(0.0) == Approx(0.001));
    CHECK(!t["optimizer"]["betas"]);  // adam's parameters are gone with it
    CHECK(t["batch"]["global"].value_or(int64_t{0}) == 4);
    CHECK(t["batch"]["micro"].value_or(int64_t{0}) == 4);
    CHECK(t["batch"]["accumulation"].value_or(int64_t{0}) == 1);
    json sum = read_json(run_dir / "summary.json");
    CHECK(sum["steps"].get<int64_t>() == 60);
    CHECK(sum["samples"].get<int64_t>() == 60 * 4);
  };
  for (const char *flag : {"--deepspeed_config", "--deepspeed"}) {
    INFO(flag);
    fs::path dir = scratch() / (std::string("run") + flag);
    run_ok(s.config, {flag, ds.string(), "--set", "run.dir=" + dir.string()});
    check_run(dir);
  }
  // run.deepspeed in the config names a JSON relative to the config file,
  // whatever the working directory.
  fs::path cfg = scratch() / "with_ds.toml";
  fs::path dir = scratch() / "run_with_ds";
  std::string text = config_text(s.data, dir);
  text.insert(text.find("steps = 60"), "deepspeed = \"ds.json\"\n");
  write_text(cfg, text);
  RunOptions o;
  o.cwd = fs::temp_directory_path();
  run_ok(cfg, {}, o);
  check_run(dir);
}

TEST_CASE("run accepts --local_rank and LOCAL_RANK as DeepSpeed launchers pass them", "[run]") {
  Setup s = setup("", "run");
  const std::vector<std::string> fast = {"--set", "run.steps=10"};
  SECTION("--local_rank 0") {
    auto args = fast;
    args.insert(args.end(), {"--local_rank", "0"});
    run_ok(s.config, args);
    CHECK(read_json(s.run_dir / "summary.json")["steps"] == 10);
  }
  SECTION("--local_rank=0 and --local-rank 0") {
    auto args = fast;
    args.push_back("--local_rank=0");
    run_ok(s.config, args);
    args = fast;
    args.insert(args.end(), {"--local-rank", "0"});
    run_ok(s.config, args);
  }
  SECTION("LOCAL_RANK=0 in the environment") {
    RunOptions o;
    o.env["LOCAL_RANK"] = "0";
    run_ok(s.config, fast, o);
    CHECK(read_json(s.run_dir / "summary.json")["steps"] == 10);
  }
  SECTION("a malformed --local_rank is refused") {
    auto args = fast;
    args.insert(args.begin(), {"run", s.config.string()});
    args.insert(args.end(), {"--local_rank", "abc"});
    RunResult r = run_cli(args);
    INFO(describe(r));
    CHECK(r.status != 0);
    CHECK(contains(r.err, "abc"));
  }
}

TEST_CASE("eval reproduces the run's accuracy from its checkpoint, frozen", "[eval]") {
  Setup s = setup();
  run_ok(s.config);
  json sum = read_json(s.run_dir / "summary.json");
  const double acc = sum.at("eval_accuracy").get<double>();
  const double loss = sum.at("eval_loss").get<double>();
  const fs::path root = s.run_dir / "ckpt";

  // A checkpoint root (through 'latest'), a step directory, or the
  // consolidated file `tessera ckpt export` writes.
  const fs::path exported = scratch() / "exported.safetensors";
  REQUIRE(run_cli({"ckpt", "export", root.string(), "-o", exported.string()}).status == 0);
  for (const fs::path &ckpt : {root, root / "step_00000060", exported}) {
    INFO("--ckpt " << ckpt);
    RunResult r = run_cli({"eval", s.config.string(), "--ckpt", ckpt.string()});
    INFO(describe(r));
    REQUIRE(r.status == 0);
    json j = json_line(r.out);
    REQUIRE(j.is_object());
    CHECK(j.at("eval_accuracy").get<double>() == Approx(acc).margin(1e-6));
    CHECK(j.at("eval_loss").get<double>() == Approx(loss).margin(1e-5));
    CHECK(j.at("samples").get<int64_t>() == 256);
    CHECK(j.at("optimizer_state_bytes").get<int64_t>() == 0);
    if (ckpt != exported) CHECK(contains(j.at("checkpoint").get<std::string>(), "step_00000060"));
    // The printed line carries the same accuracy.
    char buf[64];
    std::snprintf(buf, sizeof buf, "accuracy %.4f", acc);
    CHECK(contains(r.out, buf));
  }
  // Evaluation writes nothing into the run.
  CHECK(entries(root, "step_") == std::vector<std::string>{"step_00000060"});
}

TEST_CASE("eval needs an existing checkpoint", "[eval][errors]") {
  Setup s = setup();
  SECTION("a missing directory is named") {
    fs::path missing = scratch() / "no-such-ckpt";
    RunResult r = run_cli({"eval", s.config.string(), "--ckpt", missing.string()});
    INFO(describe(r));
    CHECK(r.status != 0);
    CHECK(contains(r.err, missing.string()));
  }
  SECTION("--ckpt is required") {
    RunResult r = run_cli({"eval", s.config.string()});
    INFO(describe(r));
    CHECK(r.status == 2);
    CHECK(contains(r.err, "--ckpt"));
  }
}

TEST_CASE("checkpoint.keep keeps the newest checkpoints and latest names the last",
          "[checkpoint]") {
  Setup s = setup("\n[checkpoint]\nevery = 10\nkeep = 2\n");
  run_ok(s.config);
  fs::path root = s.run_dir / "ckpt";
  REQUIRE(fs::is_directory(root));
  CHECK(entries(root, "step_") == std::vector<std::string>{"step_00000050", "step_00000060"});
  CHECK(lines(read_text(root / "latest")).at(0) == "step_00000060");
  // No temporary files are left behind.
  for (const auto &e : fs::recursive_directory_iterator(root))
    CHECK(e.path().extension() != ".tmp");

  for (int step : {50, 60}) {
    char name[32];
    std::snprintf(name, sizeof name, "step_%08d", step);
    fs::path dir = root / name;
    INFO(dir);
    json manifest = read_json(dir / "manifest.json");
    CHECK(manifest.at("step").get<int64_t>() == step);
    REQUIRE(manifest.at("params").is_array());
    // Every rank's shard is listed, and each holds tensors of the
    // canonical layout with their checksums.
    REQUIRE(manifest.at("files").size() == 1);
    for (const auto &f : manifest["files"]) {
      json header = safetensors_header(dir / f.at("name").get<std::string>());
      for (const auto &t : f.at("tensors")) {
        INFO(t.dump());
        REQUIRE(header.contains(t.at("name").get<std::string>()));
        CHECK(header[t.at("name").get<std::string>()]["dtype"] == "F32");
        CHECK(!t.at("block_crc32").empty());
      }
    }
    CHECK(run_cli({"ckpt", "verify", dir.string()}).status == 0);
  }
  json sum = read_json(s.run_dir / "summary.json");
  CHECK(contains(sum.at("checkpoint").get<std::string>(), "step_00000060"));

  // A checkpoint dir of its own: checkpoint.dir is honoured.
  fs::path own = scratch() / "elsewhere";
  run_ok(s.config, {"--set", "checkpoint.dir=" + own.string(), "--set", "run.steps=20"});
  CHECK(entries(own, "step_") == std::vector<std::string>{"step_00000010", "step_00000020"});
  CHECK(lines(read_text(own / "latest")).at(0) == "step_00000020");
}

TEST_CASE("the binary finds its own plugins from any working directory", "[run][layout]") {
  Setup s = setup();
  RunOptions o;
  o.cwd = fs::temp_directory_path();
  run_ok(s.config, {"--set", "run.steps=10"}, o);
  CHECK(read_json(s.run_dir / "summary.json")["steps"] == 10);

  RunResult r = run_cli({"plugins"}, o);
  INFO(describe(r));
  CHECK(r.status == 0);
  CHECK(contains(r.out, "libtsr_model_mlp.so"));
}

TEST_CASE("the shipped configs are valid, and the quickstart trains on other data", "[configs]") {
  const fs::path configs = fs::path(TESSERA_SOURCE_DIR) / "configs";
  int checked = 0;
  for (const auto &e : fs::directory_iterator(configs)) {
    if (e.path().extension() != ".toml") continue;
    // Model and data only, for a DeepSpeed JSON to complete: checked with
    // the tutorial's JSON in test_deepspeed_cli.cpp.
    if (e.path().filename() == "deepspeed-tutorial.toml") continue;
    ++checked;
    RunResult r = run_cli({"config", "check", e.path().string()});
    INFO(describe(r));
    CHECK(r.status == 0);
  }
  CHECK(checked >= 1);

  // configs/quickstart.toml with its data swapped for the synthetic set.
  Dataset d = write_dataset(scratch() / "data");
  fs::path dir = scratch() / "quickstart";
  run_ok(configs / "quickstart.toml",
         {"--set", "run.steps=32", "--set", "run.dir=" + dir.string(), "--set",
          "data.train.images=\"" + d.train_images.string() + "\"", "--set",
          "data.train.labels=\"" + d.train_labels.string() + "\"", "--set",
          "data.eval.images=\"" + d.eval_images.string() + "\"", "--set",
          "data.eval.labels=\"" + d.eval_labels.string() + "\""});
  json sum = read_json(dir / "summary.json");
  CHECK(sum["steps"].get<int64_t>() == 32);
  CHECK(sum["eval_accuracy"].get<double>() > 0.9);
  CHECK(parse_toml(dir / "config.toml")["model"]["hidden"].is_array());
}

}  // namespace itest_test_run
