// A round trip through Hugging Face's files (issue 51): the golden Llama
// (tests/data/llama3_L2_C64, with the golden tokenizer.json beside it)
// imported by `tessera run` through init_from, trained 5 steps, and
// exported by `tessera ckpt export` in shards (--shard-size 100KB).
//
// Without Python (CI): the export's tensor names, shapes and dtypes are
// exactly those of the golden directory's own model.safetensors header
// (Hugging Face's layout) in F32; the index maps every tensor to the
// shard that holds it and its total_size is their bytes; config.json and
// the tokenizer file are there; and tessera reads the sharded export back
// to the checkpoint's values. Then, where transformers and torch are
// importable, hf_llama_logits.py loads the export with
// AutoModelForCausalLM.from_pretrained and its fp32 logits must equal
// tessera's (predict on each prefix) within 1e-5 relative per row;
// elsewhere the test prints "SKIPPED:" (ctest reports it skipped).
// TESSERA_PYTHON names the interpreter (default python3).
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <tessera/cpp/formats/safetensors.hpp>
#include <tessera/cpp/formats/token_shard.hpp>
#include <vector>

#include "gpt2_support.hpp"
#include "llama_support.hpp"
#include "plugin/layout.hpp"
#include "support/fixture.hpp"
#include "support/safetensors_read.hpp"
#include "support/temp_dir.hpp"
#include "train/init_from.hpp"
#include "train/model_file.hpp"
#include "util/safetensors.hpp"

namespace unit_test_llama_roundtrip {

namespace fs = std::filesystem;
using nlohmann::json;
using tessera::test::Fixture;
using tessera::test::TempDir;
using tessera::test::gpt2_support::Batch;
using tessera::test::gpt2_support::Model;
using tessera::test::gpt2_support::State;
using tessera::test::gpt2_support::token_data;
using tessera::test::llama_support::prefix_logits;

namespace {

constexpr int64_t kT = 48, kVocab = 256;

std::string q(const std::string &s) {
  return "'" + s + "'";
}

// The command's exit status; its output in `log`.
int shell(const std::string &cmd, const std::string &log) {
  const int rc = std::system((cmd + " > " + q(log) + " 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

std::string read_text(const std::string &path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The golden directory with the golden tokenizer.json beside it: what a
// user's Hugging Face directory holds.
std::string hf_dir(const TempDir &d) {
  const std::string golden = tessera::test::data_path("llama3_L2_C64");
  const fs::path dir = d.path() / "hf";
  fs::create_directories(dir);
  for (const char *f : {"config.json", "generation_config.json", "model.safetensors"})
    fs::copy_file(fs::path(golden) / f, dir / f);
  fs::copy_file(tessera::test::data_path("bpe_tokenizer") + "/tokenizer.json",
                dir / "tokenizer.json");
  return dir.string();
}

// Token windows (uint16, llm.c's format) and the run's config, with
// `model_keys` added to [model].
std::string run_config(const TempDir &d, const std::string &hf, const std::string &model_keys = "",
                       const std::string &lr = "1e-3") {
  std::vector<uint16_t> tokens(kT * 16 + 1);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<uint16_t>((i * 37 + 11) % kVocab);
  const auto head = tessera::formats::token_shard::header(2, static_cast<int64_t>(tokens.size()));
  {
    std::ofstream out(d.file("tok_train_000000.bin"), std::ios::binary);
    out.write(reinterpret_cast<const char *>(head.data()), sizeof head);
    out.write(reinterpret_cast<const char *>(tokens.data()),
              static_cast<std::streamsize>(tokens.size() * 2));
  }
  return d.write(
      "run.toml",
      "[run]\nname = \"roundtrip\"\ndevice = \"cpu\"\nseed = 5\nsteps = 5\n"
      "log_every = 1\ndir = \"" +
          d.file("run") + "\"\n\n[batch]\nmicro = 2\n\n[model]\n" +
          "plugin = \"llama\"\ninit_from = \"" + hf + "\"\n" + model_keys +
          "\n[data.train]\nplugin = \"tokens\"\nfiles = \"" + d.file("tok_train_000000.bin") +
          "\"\ncontext = " + std::to_string(kT) + "\nvocab = " + std::to_string(kVocab) +
          "\n\n[optimizer]\nplugin = \"adam\"\nlr = " + lr + "\n\n[log]\n" + "plot = false\n");
}

// The export against the golden header: the same names, shapes, F32, each
// in the shard the index names, the index's total_size their bytes.
void check_layout(const std::string &golden_file, const fs::path &out) {
  const tessera::SafetensorsFile golden(golden_file);
  const json index = json::parse(read_text((out / "model.safetensors.index.json").string()));
  const json &map = index.at("weight_map");
  CHECK(!fs::exists(out / "model.safetensors"));
  std::set<std::string> mapped, shards;
  for (const auto &[name, file] : map.items()) {
    mapped.insert(name);
    shards.insert(file.get<std::string>());
  }
  std::set<std::string> want;
  for (const auto &[name, t] : golden.tensors()) want.insert(name);
  CHECK(mapped == want);
  REQUIRE(shards.size() >= 2);
  const std::regex shard_re("model-(\\d{5})-of-(\\d{5})\\.safetensors");
  size_t bytes = 0, seen = 0;
  for (const std::string &file : shards) {
    INFO(file);
    std::smatch mt;
    REQUIRE(std::regex_match(file, mt, shard_re));
    CHECK(std::stoul(mt[2].str()) == shards.size());
    const tessera::SafetensorsFile shard((out / file).string());
    for (const auto &[name, t] : shard.tensors()) {
      INFO(name);
      REQUIRE(map.contains(name));
      CHECK(map[name] == file);
      const tessera::StTensor &g = golden.get(name);
      CHECK(t.shape == g.shape);
      CHECK(t.dtype == "F32");
      bytes += t.bytes;
      ++seen;
    }
  }
  CHECK(seen == want.size());
  CHECK(index.at("metadata").at("total_size").get<size_t>() == bytes);
}

// Every logit row of the model with `flat`'s values, through predict on
// each prefix of the golden batch: [B, T, V].
std::vector<float> tessera_logits(Model &m, const tessera::Layout &layout,
                                  const std::vector<float> &flat, const std::vector<int32_t> &ids,
                                  int64_t B) {
  State s(m);
  for (size_t i = 0; i < s.info.size(); ++i)
    for (size_t j = 0; j < layout.params[i].numel; ++j)
      s.value[i][j] = flat[layout.params[i].offset + j];
  std::vector<float> all(static_cast<size_t>(B * kT * kVocab));
  for (int64_t t = 0; t < kT; ++t) {
    const std::vector<float> out = prefix_logits(m, s, ids, B, kT, kVocab, t);
    for (int64_t b = 0; b < B; ++b)
      std::copy(out.begin() + b * kVocab, out.begin() + (b + 1) * kVocab,
                all.begin() + (b * kT + t) * kVocab);
  }
  return all;
}

std::string binary() {
  return std::string("'") + TESSERA_BINARY + "'";
}

// Imports the golden directory and trains 5 steps (`model_keys` added).
void train(const TempDir &d, std::string *hf, const std::string &model_keys = "",
           const std::string &lr = "1e-3") {
  *hf = hf_dir(d);
  const std::string cfg = run_config(d, *hf, model_keys, lr);
  const int ran = shell(binary() + " run " + q(cfg), d.file("run.log"));
  INFO(read_text(d.file("run.log")));
  REQUIRE(ran == 0);
}

// `tessera ckpt export` of the run's checkpoint into d/NAME with `flags`;
// its exit status, its output in d/NAME.log.
int export_run(const TempDir &d, const std::string &name, const std::string &flags) {
  return shell(binary() + " ckpt export " + q(d.file("run/ckpt")) + " -o " +
                   q((d.path() / name).string()) + " " + flags,
               d.file(name + ".log"));
}

// Imports the golden directory, trains 5 steps, exports in shards; the
// export's directory.
fs::path make_export(const TempDir &d, std::string *hf) {
  train(d, hf);
  const int rc = export_run(d, "export", "--shard-size 100KB");
  INFO(read_text(d.file("export.log")));
  REQUIRE(rc == 0);
  return d.path() / "export";
}

std::string python() {
  const char *py = std::getenv("TESSERA_PYTHON");
  return py && *py ? py : "python3";
}

}  // namespace

TEST_CASE("llama round trip: golden import, 5 steps, sharded export in Hugging Face's layout",
          "[llama][export]") {
  TempDir d("tessera-llama-roundtrip");
  std::string hf;
  const fs::path out = make_export(d, &hf);
  check_layout(hf + "/model.safetensors", out);
  const json config = json::parse(read_text((out / "config.json").string()));
  CHECK(config.at("architectures") == json::array({"LlamaForCausalLM"}));
  CHECK(config.at("torch_dtype") == "float32");
  CHECK(read_text((out / "tokenizer.json").string()) == read_text(hf + "/tokenizer.json"));
  CHECK(fs::exists(out / "generation_config.json"));

  // tessera reads its own sharded export back to the checkpoint's values,
  // which 5 steps moved away from the golden ones.
  Fixture f;
  Model m(f, "llama");
  REQUIRE(m.create(f.config("model", "llama", "init_from = \"" + out.string() + "\"\n"),
                   token_data(kT, kVocab), 1) == TSR_OK);
  const tessera::Layout layout = tessera::make_layout(m.vt, m.self, 1, "llama");
  std::vector<float> exported(layout.total), saved(layout.total), golden(layout.total);
  CHECK_THAT(tessera::init_from_safetensors(out.string(), layout, exported.data()),
             Catch::Contains("shards"));
  tessera::load_model_params(d.file("run/ckpt"), layout, saved.data());
  tessera::init_from_safetensors(hf, layout, golden.data());
  CHECK(exported == saved);
  CHECK(exported != golden);
}

TEST_CASE("llama round trip: transformers loads the export, its logits equal tessera's",
          "[llama][export]") {
  TempDir d("tessera-llama-roundtrip-hf");
  // First whether this machine can run the other side at all.
  const int can =
      shell(python() + " -c 'import torch, transformers, safetensors'", d.file("import.log"));
  if (can != 0) {
    std::printf("SKIPPED: torch, transformers or safetensors is not importable by %s: %s\n",
                python().c_str(), read_text(d.file("import.log")).c_str());
    return;
  }
  std::string hf;
  const fs::path out = make_export(d, &hf);
  const auto ref = tessera::test::read_safetensors(tessera::test::data_path("llama3_L2_C64") +
                                                   "/reference.safetensors");
  const int64_t B = ref.at("input_ids").shape.at(0);
  Fixture f;
  Model m(f, "llama");
  REQUIRE(m.create(f.config("model", "llama", "init_from = \"" + out.string() + "\"\n"),
                   token_data(kT, kVocab), B) == TSR_OK);
  const tessera::Layout layout = tessera::make_layout(m.vt, m.self, 1, "llama");
  std::vector<float> exported(layout.total);
  tessera::init_from_safetensors(out.string(), layout, exported.data());
  std::vector<int32_t> ids;
  std::vector<int64_t> ids64;
  for (double v : ref.at("input_ids").data) {
    ids.push_back(static_cast<int32_t>(v));
    ids64.push_back(static_cast<int64_t>(v));
  }
  const std::vector<float> logits = tessera_logits(m, layout, exported, ids, B);
  const std::string logits_file = d.file("tessera_logits.safetensors");
  tessera::formats::safetensors::write(
      logits_file, {{"input_ids", "I64", {B, kT}, ids64.data(), ids64.size() * 8},
                    {"logits", "F32", {B, kT, kVocab}, logits.data(), logits.size() * 4}});
  const std::string script = std::string(TESSERA_SOURCE_DIR) + "/tests/unit/hf_llama_logits.py";
  const int status = shell(
      python() + " " + q(script) + " " + q(out.string()) + " " + q(logits_file), d.file("hf.log"));
  const std::string log = read_text(d.file("hf.log"));
  std::printf("%s", log.c_str());
  INFO(log);
  CHECK(status == 0);
}

// ---- LoRA: the adapters out to PEFT, merged, and the base left as it was ----

namespace {

const char *const kLora =
    "lora.rank = 4\nlora.alpha = 8.0\n"
    "lora.targets = [\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\"]\n";
constexpr double kScale = 2.0;  // alpha / rank

// The LoRA model of the run (init_from the golden directory) and its
// checkpoint's values.
struct LoraRun {
  Fixture f;
  Model m{f, "llama"};
  tessera::Layout layout;
  std::vector<float> saved;
  LoraRun(const TempDir &d, const std::string &hf, int64_t B) {
    REQUIRE(m.create(f.config("model", "llama", "init_from = \"" + hf + "\"\n" + kLora),
                     token_data(kT, kVocab), B) == TSR_OK);
    layout = tessera::make_layout(m.vt, m.self, 1, "llama");
    saved.resize(layout.total);
    tessera::load_model_params(d.file("run/ckpt"), layout, saved.data());
  }
  const tessera::ParamSlot &slot(const std::string &name) const {
    for (const auto &p : layout.params)
      if (p.name == name) return p;
    FAIL("no parameter " << name);
    return layout.params.front();
  }
  std::vector<float> values(const std::string &name) const {
    const tessera::ParamSlot &p = slot(name);
    return std::vector<float>(saved.begin() + p.offset, saved.begin() + p.offset + p.numel);
  }
};

std::vector<float> floats(const tessera::test::RefTensor &t) {
  return std::vector<float>(t.data.begin(), t.data.end());
}

}  // namespace

TEST_CASE("llama LoRA export: the base as it was, the adapters for PEFT, the merge W + s B A",
          "[llama][export][lora]") {
  TempDir d("tessera-llama-lora-export");
  std::string hf;
  train(d, &hf, kLora, "1e-2");
  const LoraRun run(d, hf, 1);
  const auto golden = tessera::test::read_safetensors(hf + "/model.safetensors");

  // Plain: the base model, frozen, so the golden weights themselves; a warning.
  REQUIRE(export_run(d, "base", "") == 0);
  CHECK_THAT(read_text(d.file("base.log")), Catch::Contains("LoRA adapters"));
  const auto base = tessera::test::read_safetensors(d.file("base/model.safetensors"));
  REQUIRE(base.size() == golden.size());
  for (const auto &[name, t] : golden) {
    INFO(name);
    REQUIRE(base.count(name) == 1);
    CHECK(floats(base.at(name)) == floats(t));
  }

  // PEFT: adapter_config.json and the adapters under PEFT's names.
  REQUIRE(export_run(d, "peft", "--lora-format peft") == 0);
  const json cfg = json::parse(read_text(d.file("peft/adapter_config.json")));
  CHECK(cfg.at("peft_type") == "LORA");
  CHECK(cfg.at("task_type") == "CAUSAL_LM");
  CHECK(cfg.at("r") == 4);
  CHECK(cfg.at("lora_alpha") == 8);
  CHECK(cfg.at("lora_dropout") == 0.0);
  CHECK(cfg.at("bias") == "none");
  CHECK(cfg.at("base_model_name_or_path") == hf);
  CHECK(cfg.at("target_modules") ==
        json::array({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
  const auto peft = tessera::test::read_safetensors(d.file("peft/adapter_model.safetensors"));
  CHECK(peft.size() == 2 * 2 * 7);
  bool moved = false;
  for (const auto &p : run.layout.params) {
    if (p.name.find(".lora_") == std::string::npos) continue;
    INFO(p.name);
    const auto &t = peft.at("base_model.model." + p.name);
    CHECK(t.shape == p.shape);
    CHECK(floats(t) == run.values(p.name));
    if (p.name.find("lora_B") != std::string::npos)
      for (float v : run.values(p.name)) moved |= v != 0.0f;
  }
  CHECK(moved);  // B left zero would test nothing

  // Merged: each adapted weight W + s B A, computed here in double.
  REQUIRE(export_run(d, "merged", "--merge") == 0);
  const auto merged = tessera::test::read_safetensors(d.file("merged/model.safetensors"));
  REQUIRE(merged.size() == golden.size());
  size_t adapted = 0;
  for (const auto &[name, t] : golden) {
    INFO(name);
    const std::string pre = name.substr(0, name.size() - std::string(".weight").size());
    std::vector<double> want = t.data;
    if (name.ends_with("_proj.weight")) {
      ++adapted;
      const std::vector<float> a = run.values(pre + ".lora_A.weight"),
                               b = run.values(pre + ".lora_B.weight");
      const int64_t out = t.shape[0], in = t.shape[1], r = 4;
      for (int64_t o = 0; o < out; ++o)
        for (int64_t c = 0; c < in; ++c)
          for (int64_t j = 0; j < r; ++j) want[o * in + c] += kScale * b[o * r + j] * a[j * in + c];
    }
    const std::vector<double> &got = merged.at(name).data;
    REQUIRE(got.size() == want.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      num += (got[i] - want[i]) * (got[i] - want[i]);
      den += want[i] * want[i];
    }
    CHECK(std::sqrt(num / den) <= 1e-6);
  }
  CHECK(adapted == 2 * 7);

  // Refusals.
  CHECK(export_run(d, "both", "--merge --lora-format peft") != 0);
  CHECK_THAT(read_text(d.file("both.log")), Catch::Contains("give one"));
  CHECK(export_run(d, "onnx", "--lora-format onnx") != 0);
  CHECK_THAT(read_text(d.file("onnx.log")), Catch::Contains("--lora-format must be peft"));
  CHECK(export_run(d, "own.safetensors", "--format tessera --merge") != 0);
  CHECK(export_run(d, "peft.safetensors", "--lora-format peft") != 0);
  CHECK_THAT(read_text(d.file("peft.safetensors.log")), Catch::Contains("names a file"));
}

TEST_CASE("llama LoRA export: PEFT loads the adapter onto the base, its logits equal tessera's",
          "[llama][export][lora]") {
  TempDir d("tessera-llama-lora-peft");
  const int can =
      shell(python() + " -c 'import torch, transformers, peft, safetensors'", d.file("import.log"));
  if (can != 0) {
    std::printf("SKIPPED: torch, transformers, peft or safetensors is not importable by %s: %s\n",
                python().c_str(), read_text(d.file("import.log")).c_str());
    return;
  }
  std::string hf;
  train(d, &hf, kLora, "1e-2");
  for (const auto &[name, flags] : {std::pair<std::string, std::string>{"base", ""},
                                    {"peft", "--lora-format peft"},
                                    {"merged", "--merge"}}) {
    INFO(read_text(d.file(name + ".log")));
    REQUIRE(export_run(d, name, flags) == 0);
  }
  const auto ref = tessera::test::read_safetensors(tessera::test::data_path("llama3_L2_C64") +
                                                   "/reference.safetensors");
  const int64_t B = ref.at("input_ids").shape.at(0);
  LoraRun run(d, hf, B);
  std::vector<int32_t> ids;
  std::vector<int64_t> ids64;
  for (double v : ref.at("input_ids").data) {
    ids.push_back(static_cast<int32_t>(v));
    ids64.push_back(static_cast<int64_t>(v));
  }
  const std::vector<float> logits = tessera_logits(run.m, run.layout, run.saved, ids, B);
  const std::string logits_file = d.file("tessera_logits.safetensors");
  tessera::formats::safetensors::write(
      logits_file, {{"input_ids", "I64", {B, kT}, ids64.data(), ids64.size() * 8},
                    {"logits", "F32", {B, kT, kVocab}, logits.data(), logits.size() * 4}});
  const std::string script = std::string(TESSERA_SOURCE_DIR) + "/tests/unit/peft_llama_logits.py";
  const int status = shell(python() + " " + q(script) + " " + q(d.file("base")) + " " +
                               q(d.file("peft")) + " " + q(d.file("merged")) + " " + q(logits_file),
                           d.file("peft_check.log"));
  const std::string log = read_text(d.file("peft_check.log"));
  std::printf("%s", log.c_str());
  INFO(log);
  CHECK(status == 0);
}

}  // namespace unit_test_llama_roundtrip
