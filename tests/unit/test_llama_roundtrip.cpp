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

// Token windows (uint16, llm.c's format) and the run's config.
std::string run_config(const TempDir &d, const std::string &hf) {
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
  return d.write("run.toml",
                 "[run]\nname = \"roundtrip\"\ndevice = \"cpu\"\nseed = 5\nsteps = 5\n"
                 "log_every = 1\ndir = \"" +
                     d.file("run") + "\"\n\n[batch]\nmicro = 2\n\n[model]\n" +
                     "plugin = \"llama\"\ninit_from = \"" + hf +
                     "\"\n\n[data.train]\nplugin = \"tokens\"\nfiles = \"" +
                     d.file("tok_train_000000.bin") + "\"\ncontext = " + std::to_string(kT) +
                     "\nvocab = " + std::to_string(kVocab) +
                     "\n\n[optimizer]\nplugin = \"adam\"\nlr = 1e-3\n\n[log]\n" + "plot = false\n");
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
  tsr_step *step = m.f.host.step_handle(&s.hooks);
  std::vector<float> all(static_cast<size_t>(B * kT * kVocab));
  for (int64_t t = 0; t < kT; ++t) {
    std::vector<int32_t> x;
    for (int64_t b = 0; b < B; ++b)
      x.insert(x.end(), ids.begin() + b * kT, ids.begin() + b * kT + t + 1);
    Batch batch(x, {}, B, t + 1);
    tsr_batch *bp = const_cast<tsr_batch *>(batch.get());
    bp->targets = DLTensor{};
    std::vector<float> out(static_cast<size_t>(B * kVocab));
    int64_t shape[2] = {B, kVocab};
    DLTensor logits{out.data(), DLDevice{kDLCPU, 0}, 2, DLDataType{kDLFloat, 32, 1}, shape, nullptr,
                    0};
    INFO(m.f.host.last_error());
    REQUIRE(m.vt->predict(m.self, step, bp, &logits) == TSR_OK);
    for (int64_t b = 0; b < B; ++b)
      std::copy(out.begin() + b * kVocab, out.begin() + (b + 1) * kVocab,
                all.begin() + (b * kT + t) * kVocab);
  }
  return all;
}

// Imports the golden directory, trains 5 steps, exports in shards; the
// export's directory.
fs::path make_export(const TempDir &d, std::string *hf) {
  *hf = hf_dir(d);
  const std::string cfg = run_config(d, *hf);
  const std::string bin = std::string("'") + TESSERA_BINARY + "'";
  const int ran = shell(bin + " run " + q(cfg), d.file("run.log"));
  INFO(read_text(d.file("run.log")));
  REQUIRE(ran == 0);
  const fs::path out = d.path() / "export";
  const int rc = shell(bin + " ckpt export " + q(d.file("run/ckpt")) + " -o " + q(out.string()) +
                           " --shard-size 100KB",
                       d.file("export.log"));
  INFO(read_text(d.file("export.log")));
  REQUIRE(rc == 0);
  return out;
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

}  // namespace unit_test_llama_roundtrip
