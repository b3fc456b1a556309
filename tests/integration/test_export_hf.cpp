// tessera ckpt export of a gpt2 checkpoint as a Hugging Face directory
// (the gpt2 plugin's TSR_EXT_MODEL_EXPORT_HF), end to end on the CPU: a gpt2 starting from
// tests/data/gpt2_L2_C64 (a real save_pretrained directory: 2 layers, 4
// heads, width 64, context 32, vocab 96, wte padded to 128 rows by
// vocab_pad_to = 64) trains a few steps on a token shard written here, and
// the export must have exactly that directory's tensor names, shapes and
// config.json keys; its values are the checkpoint's. With lr = 0 the export
// reproduces the Hugging Face file bit for bit. And the dimensions the
// exporter resolves are the ones the plugin logged for the run.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>

#include "harness.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace itest_test_export_hf {

using namespace tessera::itest;

namespace {

const fs::path kGolden = fs::path(TESSERA_SOURCE_DIR) / "tests/data/gpt2_L2_C64";

// A token shard in llm.c's format: 256 int32 header (magic 20240520,
// version 1, count), then uint16 tokens.
void write_shard(const fs::path &p, const std::vector<uint16_t> &tokens) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = static_cast<int32_t>(tokens.size());
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char *>(header.data()), 1024);
  out.write(reinterpret_cast<const char *>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * 2));
}

// 40 windows of 32 + 1 tokens below 80, from a fixed generator.
fs::path write_tokens(const fs::path &dir) {
  fs::create_directories(dir);
  std::vector<uint16_t> t(40 * 32 + 1);
  uint32_t x = 12345;
  for (auto &v : t) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<uint16_t>((x >> 16) % 80);
  }
  const fs::path p = dir / "tok_train_000000.bin";
  write_shard(p, t);
  return p;
}

// A gpt2 run on the CPU; `model` and `optimizer` are the sections' bodies.
fs::path write_config(const std::string &name, const fs::path &run_dir, const fs::path &tokens,
                      const std::string &model, const std::string &optimizer, int steps = 3) {
  const fs::path cfg = scratch() / (name + ".toml");
  write_text(cfg, "[run]\nname = \"" + name + "\"\ndevice = \"cpu\"\nseed = 7\nsteps = " +
                      std::to_string(steps) + "\nlog_every = 1\ndir = \"" + run_dir.string() +
                      "\"\n\n[batch]\nmicro = 4\n\n[model]\nplugin = \"gpt2\"\n" + model +
                      "\n[data.train]\nplugin = \"tokens\"\nfiles = \"" + tokens.string() +
                      "\"\ncontext = 16\nvocab = 80\n\n[optimizer]\n" + optimizer +
                      "\n[log]\nplot = false\n");
  return cfg;
}

// Every tensor of a safetensors file as float (F32, or BF16 widened), with
// its dtype.
struct AnyTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<float> data;
};
std::map<std::string, AnyTensor> read_tensors(const fs::path &p, nlohmann::json *meta = nullptr) {
  const std::string bytes = read_text(p);
  REQUIRE(bytes.size() >= 8);
  uint64_t len = 0;
  std::memcpy(&len, bytes.data(), 8);
  REQUIRE(len <= bytes.size() - 8);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, len));
  std::map<std::string, AnyTensor> out;
  for (const auto &[name, t] : header.items()) {
    if (name == "__metadata__") {
      if (meta) *meta = t;
      continue;
    }
    AnyTensor x;
    x.dtype = t.at("dtype").get<std::string>();
    x.shape = t.at("shape").get<std::vector<int64_t>>();
    size_t n = 1;
    for (int64_t d : x.shape) n *= static_cast<size_t>(d);
    const size_t b = t.at("data_offsets").at(0).get<size_t>();
    const size_t e = t.at("data_offsets").at(1).get<size_t>();
    const char *src = bytes.data() + 8 + len + b;
    x.data.resize(n);
    if (x.dtype == "F32") {
      REQUIRE(e - b == n * 4);
      std::memcpy(x.data.data(), src, n * 4);
    } else {
      REQUIRE(x.dtype == "BF16");
      REQUIRE(e - b == n * 2);
      for (size_t i = 0; i < n; ++i) {
        uint32_t u = 0;
        std::memcpy(reinterpret_cast<char *>(&u) + 2, src + i * 2, 2);
        std::memcpy(&x.data[i], &u, 4);
      }
    }
    out.emplace(name, std::move(x));
  }
  return out;
}

std::map<std::string, std::vector<int64_t>> shapes_of(const std::map<std::string, AnyTensor> &m) {
  std::map<std::string, std::vector<int64_t>> s;
  for (const auto &[name, t] : m) s[name] = t.shape;
  return s;
}

// The dimensions the gpt2 plugin logged when the run created it.
struct Logged {
  int64_t layers = 0, heads = 0, width = 0, context = 0, vocab = 0, padded = 0;
};
Logged plugin_dims(const std::string &output) {
  std::smatch m;
  const std::regex re(
      R"(gpt2: (\d+) layers, (\d+) heads, width (\d+), context (\d+), vocab (\d+) \(padded to (\d+)\))");
  REQUIRE(std::regex_search(output, m, re));
  return {std::stoll(m[1]), std::stoll(m[2]), std::stoll(m[3]),
          std::stoll(m[4]), std::stoll(m[5]), std::stoll(m[6])};
}

// The exported config.json says what the plugin built, and wte has `vocab`
// rows.
void check_agrees(const Logged &p, const fs::path &export_dir) {
  const nlohmann::json c = read_json(export_dir / "config.json");
  CHECK(c.at("n_layer") == p.layers);
  CHECK(c.at("n_head") == p.heads);
  CHECK(c.at("n_embd") == p.width);
  CHECK(c.at("n_positions") == p.context);
  CHECK(c.at("vocab_size") == p.vocab);
  const auto t = read_tensors(export_dir / "model.safetensors");
  CHECK(t.at("transformer.wte.weight").shape == std::vector<int64_t>{p.vocab, p.width});
  CHECK(t.at("transformer.wpe.weight").shape == std::vector<int64_t>{p.context, p.width});
}

const char *kAdam = "plugin = \"adam\"\nlr = 0.01\n";

}  // namespace

TEST_CASE("ckpt export writes a trained gpt2 as a Hugging Face directory", "[export][gpt2]") {
  const fs::path tokens = write_tokens(scratch() / "data");
  const fs::path run_dir = scratch() / "run";
  const fs::path cfg =
      write_config("g", run_dir, tokens, "init_from = \"" + kGolden.string() + "\"\n", kAdam);
  RunResult r = run_cli({"run", cfg.string()}, RunOptions{{}, {}, {}, 120});
  REQUIRE(r.status == 0);
  INFO(describe(r));
  const Logged logged = plugin_dims(r.all());
  CHECK(logged.vocab == 96);
  CHECK(logged.padded == 128);
  const fs::path ckpt = run_dir / "ckpt";

  // fp32: a directory; the tessera format alongside, as the reference.
  const fs::path hf = scratch() / "hf";
  r = run_cli({"ckpt", "export", ckpt.string(), "-o", hf.string()});
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "as a Hugging Face GPT-2"));
  CHECK(contains(r.out, "wte 96 of 128 rows"));
  const fs::path native = scratch() / "native.safetensors";
  r = run_cli({"ckpt", "export", ckpt.string(), "-o", native.string(), "--format", "tessera"});
  REQUIRE(r.status == 0);
  check_agrees(logged, hf);

  // config.json: save_pretrained's keys; GPT-2's constants and these dims.
  const nlohmann::json ours = read_json(hf / "config.json");
  nlohmann::json golden = read_json(kGolden / "config.json");
  golden.erase("transformers_version");
  std::set<std::string> ours_keys, golden_keys;
  for (auto &[k, v] : ours.items()) ours_keys.insert(k);
  for (auto &[k, v] : golden.items()) golden_keys.insert(k);
  CHECK(ours_keys == golden_keys);
  for (const auto &k : golden_keys)
    if (k != "bos_token_id" && k != "eos_token_id") {
      INFO(k);
      CHECK(ours.at(k) == golden.at(k));
    }
  CHECK(ours.at("model_type") == "gpt2");
  CHECK(ours.at("architectures") == nlohmann::json::array({"GPT2LMHeadModel"}));
  CHECK(ours.at("activation_function") == "gelu_new");
  CHECK(ours.at("n_inner").is_null());
  CHECK(ours.at("tie_word_embeddings") == true);
  CHECK(ours.at("layer_norm_epsilon") == 1e-5);
  CHECK(ours.at("bos_token_id").is_null());  // vocab 96 is not GPT-2's BPE

  // model.safetensors: exactly the Hugging Face file's names and shapes.
  nlohmann::json meta;
  const auto exported = read_tensors(hf / "model.safetensors", &meta);
  const auto reference = read_tensors(kGolden / "model.safetensors");
  CHECK(shapes_of(exported) == shapes_of(reference));
  CHECK(meta.at("format") == "pt");
  CHECK(meta.at("tessera_step") == "3");

  // Values: the checkpoint's master weights, wte's first 96 rows; and they
  // moved in training.
  const auto canon = read_tensors(native);
  CHECK(canon.at("transformer.wte.weight").shape == std::vector<int64_t>{128, 64});
  bool moved = false;
  for (const auto &[name, t] : exported) {
    INFO(name);
    REQUIRE(t.dtype == "F32");
    const auto &c = canon.at(name).data;
    REQUIRE(c.size() >= t.data.size());
    CHECK(std::equal(t.data.begin(), t.data.end(), c.begin()));
    if (t.data != reference.at(name).data) moved = true;
  }
  CHECK(moved);

  // bf16: the same tensors, each rounded (relative error at most 2^-8).
  const fs::path hf16 = scratch() / "hf16";
  r = run_cli({"ckpt", "export", ckpt.string(), "-o", hf16.string(), "--dtype", "bf16"});
  REQUIRE(r.status == 0);
  CHECK(read_json(hf16 / "config.json").at("dtype") == "bfloat16");
  const auto half = read_tensors(hf16 / "model.safetensors");
  CHECK(shapes_of(half) == shapes_of(reference));
  double worst = 0;
  for (const auto &[name, t] : half) {
    REQUIRE(t.dtype == "BF16");
    const auto &f = exported.at(name).data;
    for (size_t i = 0; i < t.data.size(); ++i)
      worst = std::max(
          worst, std::abs(double(t.data[i]) - f[i]) / std::max(std::abs(double(f[i])), 1e-30));
  }
  CHECK(worst <= std::ldexp(1.0, -8));
  CHECK(worst > 0);

  // -o FILE.safetensors: that file, config.json beside it.
  fs::create_directories(scratch() / "asfile");
  const fs::path file = scratch() / "asfile" / "model.safetensors";
  r = run_cli({"ckpt", "export", ckpt.string(), "-o", file.string()});
  REQUIRE(r.status == 0);
  CHECK(shapes_of(read_tensors(file)) == shapes_of(reference));
  CHECK(read_json(scratch() / "asfile" / "config.json") == ours);
}

TEST_CASE("an untrained gpt2 exports as the Hugging Face file it started from, bit for bit",
          "[export][gpt2]") {
  // The run starts from a copy of the Hugging Face directory given by a
  // relative path, and takes SGD steps at lr 0: the weights do not move.
  // The export runs from another directory: it finds init_from's
  // config.json above the checkpoint.
  fs::create_directories(scratch() / "work" / "hfinit");
  for (const char *f : {"config.json", "model.safetensors"})
    fs::copy_file(kGolden / f, scratch() / "work" / "hfinit" / f);
  const fs::path tokens = write_tokens(scratch() / "work" / "data");
  const fs::path cfg = write_config("z", "runs/z", tokens, "init_from = \"hfinit\"\n",
                                    "plugin = \"sgd\"\nlr = 0.0\n", 2);
  RunOptions in_work;
  in_work.cwd = scratch() / "work";
  in_work.timeout_s = 120;
  RunResult r = run_cli({"run", cfg.string()}, in_work);
  REQUIRE(r.status == 0);
  INFO(describe(r));
  fs::create_directories(scratch() / "elsewhere");
  RunOptions elsewhere;
  elsewhere.cwd = scratch() / "elsewhere";
  r = run_cli({"ckpt", "export", (scratch() / "work/runs/z/ckpt").string(), "-o", "out"},
              elsewhere);
  REQUIRE(r.status == 0);
  const fs::path out = scratch() / "elsewhere" / "out";
  const auto exported = read_tensors(out / "model.safetensors");
  const auto reference = read_tensors(kGolden / "model.safetensors");
  REQUIRE(shapes_of(exported) == shapes_of(reference));
  for (const auto &[name, t] : reference) {
    INFO(name);
    CHECK(std::memcmp(exported.at(name).data.data(), t.data.data(), t.data.size() * 4) == 0);
  }
  nlohmann::json golden = read_json(kGolden / "config.json");
  nlohmann::json ours = read_json(out / "config.json");
  for (const char *k : {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size"})
    CHECK(ours.at(k) == golden.at(k));
}

TEST_CASE("the export resolves the dimensions the gpt2 plugin resolved", "[export][gpt2]") {
  const fs::path tokens = write_tokens(scratch() / "data");
  struct Case {
    std::string name, model;
  };
  // Without init_from: heads and vocab left at 0 take GPT-2 small's (12,
  // 50257), padded to 128; with init_from, explicit keys that agree.
  const std::vector<Case> cases = {
      {"small", "layers = 1\nwidth = 24\ncontext = 16\nvocab_pad_to = 128\n"},
      {"init", "init_from = \"" + kGolden.string() + "\"\nheads = 4\nvocab_pad_to = 32\n"},
  };
  for (const auto &c : cases) {
    DYNAMIC_SECTION(c.name) {
      const fs::path run_dir = scratch() / ("run-" + c.name);
      const fs::path cfg = write_config(c.name, run_dir, tokens, c.model, kAdam, 1);
      RunResult r = run_cli({"run", cfg.string()}, RunOptions{{}, {}, {}, 120});
      REQUIRE(r.status == 0);
      const Logged logged = plugin_dims(r.all());
      const fs::path out = scratch() / ("hf-" + c.name);
      r = run_cli({"ckpt", "export", (run_dir / "ckpt").string(), "-o", out.string()});
      REQUIRE(r.status == 0);
      check_agrees(logged, out);
      if (c.name == "small") {
        CHECK(logged.heads == 12);
        CHECK(logged.vocab == 50257);
        CHECK(logged.padded == 50304);
        const nlohmann::json j = read_json(out / "config.json");
        CHECK(j.at("bos_token_id") == 50256);
        CHECK(j.at("eos_token_id") == 50256);
      } else {
        CHECK(logged.padded == 96);
      }
    }
  }
}

TEST_CASE("ckpt export: formats and outputs it refuses", "[export][errors]") {
  // A model without a Hugging Face export: --format hf is refused, auto
  // falls back to the tessera format.
  Setup s = setup("", "mlp");
  RunResult r = run_cli({"run", s.config.string(), "--set", "run.steps=2"});
  REQUIRE(r.status == 0);
  const std::string ckpt = (s.run_dir / "ckpt").string();
  r = run_cli({"ckpt", "export", ckpt, "-o", (scratch() / "m").string(), "--format", "hf"});
  CHECK(r.status != 0);
  CHECK(contains(r.err, "model 'mlp' has no Hugging Face export"));
  r = run_cli({"ckpt", "export", ckpt, "-o", (scratch() / "m.safetensors").string()});
  CHECK(r.status == 0);
  CHECK(read_tensors(scratch() / "m.safetensors").count("0.weight") == 1);
  r = run_cli({"ckpt", "export", ckpt, "-o", (scratch() / "m2").string(), "--format", "onnx"});
  CHECK(r.status != 0);
  CHECK(contains(r.err, "--format must be auto, hf or tessera"));

  // gpt2: -o naming an existing file that is not .safetensors.
  const fs::path tokens = write_tokens(scratch() / "data");
  const fs::path run_dir = scratch() / "run-g";
  const fs::path cfg =
      write_config("g", run_dir, tokens, "init_from = \"" + kGolden.string() + "\"\n", kAdam, 1);
  r = run_cli({"run", cfg.string()}, RunOptions{{}, {}, {}, 120});
  REQUIRE(r.status == 0);
  write_text(scratch() / "plain", "x");
  r = run_cli(
      {"ckpt", "export", (run_dir / "ckpt").string(), "-o", (scratch() / "plain").string()});
  CHECK(r.status != 0);
  CHECK(contains(r.err, "-o names a directory for a Hugging Face export"));

  // A model that cannot be built again (its init_from is gone): the default
  // export says why and writes the tessera format; --format hf fails with
  // the plugin's reason.
  fs::create_directories(scratch() / "gone");
  for (const char *f : {"config.json", "model.safetensors"})
    fs::copy_file(kGolden / f, scratch() / "gone" / f);
  const fs::path run_gone = scratch() / "run-gone";
  const fs::path cfg_gone =
      write_config("gone", run_gone, tokens,
                   "init_from = \"" + (scratch() / "gone").string() + "\"\n", kAdam, 1);
  r = run_cli({"run", cfg_gone.string()}, RunOptions{{}, {}, {}, 120});
  REQUIRE(r.status == 0);
  fs::remove_all(scratch() / "gone");
  const fs::path fallback = scratch() / "gone.safetensors";
  r = run_cli({"ckpt", "export", (run_gone / "ckpt").string(), "-o", fallback.string()});
  CHECK(r.status == 0);
  CHECK(contains(r.err, "cannot be built here"));
  CHECK(read_tensors(fallback).at("transformer.wte.weight").shape == std::vector<int64_t>{128, 64});
  r = run_cli({"ckpt", "export", (run_gone / "ckpt").string(), "-o", (scratch() / "g2").string(),
               "--format", "hf"});
  CHECK(r.status != 0);
  CHECK(contains(r.err, "init_from"));
}

TEST_CASE("a renamed copy of gpt2 trains, exports and generates exactly as gpt2 does",
          "[export][gpt2][extensions]") {
  // The engine knows a plugin only through the ABI and its extensions: the
  // gpt2 sources built as plugin "gpt2_renamed" (tests/plugins) must give
  // the same Hugging Face export and the same generated text.
  const std::string dir = std::string(TESSERA_TEST_PLUGIN_ROOT) + "/gpt2_renamed";
  const fs::path tokens = write_tokens(scratch() / "data");
  struct Side {
    std::string plugin;
    fs::path run, hf;
    std::string text;
  };
  std::vector<Side> sides = {{"gpt2", scratch() / "run-a", scratch() / "hf-a", ""},
                             {"gpt2_renamed", scratch() / "run-b", scratch() / "hf-b", ""}};
  for (Side &s : sides) {
    INFO(s.plugin);
    const fs::path cfg =
        write_config(s.plugin, s.run, tokens, "init_from = \"" + kGolden.string() + "\"\n", kAdam);
    RunResult r = run_cli(
        {"run", cfg.string(), "--plugin-path", dir, "--set", "model.plugin=\"" + s.plugin + "\""},
        RunOptions{{}, {}, {}, 120});
    INFO(describe(r));
    REQUIRE(r.status == 0);
    const std::string ckpt = (s.run / "ckpt").string();
    r = run_cli({"ckpt", "export", ckpt, "-o", s.hf.string(), "--plugin-path", dir});
    INFO(describe(r));
    REQUIRE(r.status == 0);
    CHECK(contains(r.out, "as a Hugging Face GPT-2"));
    r = run_cli({"generate", "--ckpt", ckpt, "--prompt", "AB", "--max-tokens", "24", "--seed", "3",
                 "--plugin-path", dir});
    INFO(describe(r));
    REQUIRE(r.status == 0);
    s.text = r.out;
  }
  CHECK(read_text(sides[0].hf / "model.safetensors") ==
        read_text(sides[1].hf / "model.safetensors"));
  CHECK(read_json(sides[0].hf / "config.json") == read_json(sides[1].hf / "config.json"));
  CHECK(sides[0].text == sides[1].text);
  CHECK(sides[0].text.size() > 2);

  // Where the model's plugin cannot be found, the default export says so
  // and writes the tessera format (its own names and shapes) instead.
  const fs::path native = scratch() / "renamed.safetensors";
  RunResult r =
      run_cli({"ckpt", "export", (sides[1].run / "ckpt").string(), "-o", native.string()});
  CHECK(r.status == 0);
  CHECK(contains(r.err, "cannot be built here"));
  CHECK(read_tensors(native).count("transformer.wte.weight") == 1);
  r = run_cli({"ckpt", "export", (sides[1].run / "ckpt").string(), "-o", (scratch() / "x").string(),
               "--format", "hf"});
  CHECK(r.status != 0);
  CHECK(contains(r.err, "gpt2_renamed"));
}

}  // namespace itest_test_export_hf
