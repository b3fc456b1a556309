// The gpt2 -> Hugging Face export's pieces (engine/ckpt/export_hf.cpp): the
// dimension rule (the gpt2 plugin's, reimplemented: a non-zero [model] key,
// else init_from's config.json, else GPT-2 small), the parameter table, the
// config.json, bf16 rounding. The reference is tests/data/gpt2_L2_C64, a real
// save_pretrained directory (transformers 5.17). That the exporter and the
// plugin resolve the same dimensions end to end is checked in
// tests/integration/test_export_hf.cpp.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>

#include "ckpt/export_hf.hpp"
#include "support/fixture.hpp"
#include "util/error.hpp"
#include "util/safetensors.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_export_hf {

namespace fs = std::filesystem;
using tessera::gpt2_dims_from_config;
using tessera::Gpt2Dims;

namespace {

const std::string kGolden = tessera::test::data_path("gpt2_L2_C64");

std::string model_toml(const std::string &body) {
  return "[run]\nname = \"x\"\n\n[model]\nplugin = \"gpt2\"\n" + body;
}

nlohmann::json golden_config() {
  std::ifstream in(kGolden + "/config.json");
  return nlohmann::json::parse(in);
}

// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("tessera-export-hf-" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("gpt2 export dims: init_from's config.json fills every key left at 0", "[export_hf]") {
  Gpt2Dims d = gpt2_dims_from_config(model_toml("init_from = \"" + kGolden + "\"\n"), "/nowhere");
  CHECK(d.layers == 2);
  CHECK(d.heads == 4);
  CHECK(d.width == 64);
  CHECK(d.context == 32);
  CHECK(d.vocab == 96);
  CHECK(d.vocab_pad_to == 64);  // the plugin's default
  CHECK(d.padded_vocab == 128);
  CHECK(d.init_from_config == kGolden + "/config.json");

  // An explicit key that agrees is fine; one that disagrees is refused, as
  // the plugin refuses it.
  d = gpt2_dims_from_config(
      model_toml("init_from = \"" + kGolden + "\"\nheads = 4\nvocab_pad_to = 32\n"), "/nowhere");
  CHECK(d.heads == 4);
  CHECK(d.padded_vocab == 96);
  CHECK_THROWS_WITH(
      gpt2_dims_from_config(model_toml("init_from = \"" + kGolden + "\"\nheads = 8\n"), "/x"),
      Catch::Contains("model.heads = 8") && Catch::Contains("n_head = 4"));
  // init_from naming the safetensors file reads config.json beside it.
  d = gpt2_dims_from_config(model_toml("init_from = \"" + kGolden + "/model.safetensors\"\n"),
                            "/nowhere");
  CHECK(d.vocab == 96);
}

TEST_CASE("gpt2 export dims: without init_from, unset keys are GPT-2 small's", "[export_hf]") {
  Gpt2Dims d = gpt2_dims_from_config(model_toml(""), "/nowhere");
  CHECK(d.layers == 12);
  CHECK(d.heads == 12);
  CHECK(d.width == 768);
  CHECK(d.context == 1024);
  CHECK(d.vocab == 50257);
  CHECK(d.padded_vocab == 50304);
  d = gpt2_dims_from_config(model_toml("layers = 1\nwidth = 24\nvocab_pad_to = 1\n"), "/x");
  CHECK(d.layers == 1);
  CHECK(d.heads == 12);
  CHECK(d.width == 24);
  CHECK(d.padded_vocab == 50257);
  CHECK_THROWS_WITH(gpt2_dims_from_config(model_toml("width = 100\n"), "/x"),
                    Catch::Contains("width 100 is not a multiple of heads 12"));
  CHECK_THROWS_WITH(gpt2_dims_from_config(model_toml("vocab = -3\n"), "/x"),
                    Catch::Contains("negative"));
  CHECK_THROWS_WITH(gpt2_dims_from_config(model_toml("vocab_pad_to = 0\n"), "/x"),
                    Catch::Contains("below 1"));
}

TEST_CASE("gpt2 export dims: a relative init_from is found above the checkpoint", "[export_hf]") {
  // The run's working directory held hf/ and runs/r/ckpt/step_00000002; the
  // export runs from somewhere else.
  TempDir t;
  fs::create_directories(t.path / "hf");
  fs::copy_file(kGolden + "/config.json", t.path / "hf" / "config.json");
  const fs::path ckpt = t.path / "runs" / "r" / "ckpt" / "step_00000002";
  fs::create_directories(ckpt);
  Gpt2Dims d = gpt2_dims_from_config(model_toml("init_from = \"hf\"\n"), ckpt.string());
  CHECK(d.vocab == 96);
  CHECK(d.init_from_config == (t.path / "hf" / "config.json").string());
  CHECK_THROWS_WITH(gpt2_dims_from_config(model_toml("init_from = \"nothere\"\n"), ckpt.string()),
                    Catch::Contains("init_from 'nothere'") && Catch::Contains("config.json"));
}

TEST_CASE("gpt2 export: the parameter table is Hugging Face's, wte padded", "[export_hf]") {
  Gpt2Dims d = gpt2_dims_from_config(model_toml("init_from = \"" + kGolden + "\"\n"), "/x");
  tessera::SafetensorsFile hf(kGolden + "/model.safetensors");
  std::map<std::string, std::vector<int64_t>> ours;
  for (const auto &[name, shape] : tessera::gpt2_param_table(d)) ours[name] = shape;
  std::map<std::string, std::vector<int64_t>> theirs;
  for (const auto &[name, t] : hf.tensors()) theirs[name] = t.shape;
  CHECK(ours.size() == tessera::gpt2_param_table(d).size());  // no name twice
  REQUIRE(ours.at("transformer.wte.weight") == std::vector<int64_t>{128, 64});
  ours["transformer.wte.weight"][0] = d.vocab;  // what the export trims it to
  CHECK(ours == theirs);
}

TEST_CASE("gpt2 export: config.json has save_pretrained's keys and GPT-2's constants",
          "[export_hf]") {
  Gpt2Dims d = gpt2_dims_from_config(model_toml("init_from = \"" + kGolden + "\"\n"), "/x");
  nlohmann::json ours = tessera::gpt2_hf_config(d, "fp32");
  nlohmann::json golden = golden_config();
  std::set<std::string> ours_keys, golden_keys;
  for (auto &[k, v] : ours.items()) ours_keys.insert(k);
  for (auto &[k, v] : golden.items()) golden_keys.insert(k);
  golden_keys.erase("transformers_version");  // transformers' own stamp
  CHECK(ours_keys == golden_keys);
  for (const auto &k : golden_keys) {
    if (k == "bos_token_id" || k == "eos_token_id") continue;  // 50256 only for GPT-2's BPE
    INFO(k);
    CHECK(ours[k] == golden[k]);
  }
  CHECK(ours["bos_token_id"].is_null());
  CHECK(tessera::gpt2_hf_config(d, "bf16")["dtype"] == "bfloat16");
  Gpt2Dims small = gpt2_dims_from_config(model_toml(""), "/x");
  nlohmann::json s = tessera::gpt2_hf_config(small, "fp32");
  CHECK(s["bos_token_id"] == 50256);
  CHECK(s["eos_token_id"] == 50256);
  CHECK(s["vocab_size"] == 50257);
  CHECK(s["n_positions"] == 1024);
}

TEST_CASE("bf16 export rounds to nearest even", "[export_hf]") {
  using tessera::fp32_to_bf16;
  CHECK(fp32_to_bf16(1.0f) == 0x3f80);
  CHECK(fp32_to_bf16(-2.0f) == 0xc000);
  CHECK(fp32_to_bf16(1.0f + 1.0f / 256) == 0x3f80);  // a tie: to even (down)
  CHECK(fp32_to_bf16(1.0f + 3.0f / 256) == 0x3f82);  // a tie: to even (up)
  CHECK(fp32_to_bf16(1.0f + 1.5f / 256) == 0x3f81);  // above the tie
  CHECK((fp32_to_bf16(std::numeric_limits<float>::quiet_NaN()) & 0x7fc0) == 0x7fc0);
  CHECK(tessera::find_model_exporter("gpt2") != nullptr);
  CHECK(tessera::find_model_exporter("mlp") == nullptr);
}

}  // namespace unit_test_export_hf
