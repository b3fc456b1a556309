// The gpt2 plugin's Hugging Face export (TSR_EXT_MODEL_EXPORT_HF,
// plugins/models/gpt2/export_hf.cpp) called as the engine calls it, and
// the SDK's safetensors writer and bf16 rounding it uses. The reference is
// tests/data/gpt2_L2_C64, a real save_pretrained directory (transformers
// 5.17): the export of its own weights must have exactly its names, shapes,
// values and config.json keys. The whole `tessera ckpt export` of trained
// checkpoints is in tests/integration/test_export_hf.cpp.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <tessera/cpp/half.hpp>

#include "gpt2_support.hpp"
#include "util/safetensors.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_export_hf {

namespace fs = std::filesystem;
using namespace tessera::test::gpt2_support;

namespace {

const std::string kGolden = tessera::test::data_path("gpt2_L2_C64");

nlohmann::json read_json(const fs::path &p) {
  std::ifstream in(p);
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

const tsr_ext_model_export_hf *export_ext(tessera::test::Fixture &f) {
  const auto *e = f.registry.find("model", "gpt2");
  REQUIRE(e != nullptr);
  const auto *x = e->extension<tsr_ext_model_export_hf>(TSR_EXT_MODEL_EXPORT_HF);
  REQUIRE(x != nullptr);
  REQUIRE(x->struct_size >= tsr_ext_model_export_hf_STRUCT_SIZE);
  return x;
}

// Values for each declared parameter: the golden model's own weights
// (golden, for the golden dimensions), padded as the plugin declares them
// (wte's padding rows hold garbage, which the export must drop); else a
// count.
struct Weights {
  std::vector<std::vector<float>> values;
  std::vector<const float *> ptrs;
  explicit Weights(const Model &m, bool golden = true) {
    for (const tsr_param_info &p : m.infos()) {
      size_t n = 1;
      for (int32_t d = 0; d < p.ndim; ++d) n *= static_cast<size_t>(p.shape[d]);
      std::vector<float> v(n, 12345.0f);
      if (golden) {
        const RefTensor &r = ref("model.safetensors", p.name);
        REQUIRE(r.data.size() <= n);
        std::copy(r.data.begin(), r.data.end(), v.begin());
      } else {
        for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 97) / 97.0f;
      }
      values.push_back(std::move(v));
    }
    for (const auto &v : values) ptrs.push_back(v.data());
  }
};

tsr_export_args args(const std::string &out, bool bf16, Weights &w, std::string &summary) {
  summary.assign(1024, '\0');
  tsr_export_args a{};
  a.struct_size = tsr_export_args_STRUCT_SIZE;
  a.out = out.c_str();
  a.bf16 = bf16;
  a.step = 7;
  a.num_params = w.ptrs.size();
  a.params = w.ptrs.data();
  a.summary = summary.data();
  a.summary_cap = summary.size();
  return a;
}

}  // namespace

TEST_CASE("gpt2 exports the Hugging Face file it was built from: names, shapes, values, config",
          "[export_hf]") {
  tessera::test::Fixture f;
  Model m(f);
  REQUIRE(m.create(f.config("model", "gpt2", "init_from = \"" + kGolden + "\"\n"), token_data(kT),
                   1) == TSR_OK);
  const auto *ext = export_ext(f);
  Weights w(m);
  TempDir tmp;
  const std::string out = (tmp.path / "hf").string();
  std::string summary;
  tsr_export_args a = args(out, false, w, summary);
  REQUIRE(ext->write(m.self, &a) == TSR_OK);
  CHECK(std::string(summary.c_str()).find("wte 96 of 128 rows") != std::string::npos);

  tessera::SafetensorsFile ours(out + "/model.safetensors"), hf(kGolden + "/model.safetensors");
  REQUIRE(ours.tensors().size() == hf.tensors().size());
  for (const auto &[name, t] : hf.tensors()) {
    INFO(name);
    const tessera::StTensor &o = ours.get(name);
    CHECK(o.shape == t.shape);
    CHECK(o.dtype == "F32");
    REQUIRE(o.bytes == t.bytes);
    CHECK(std::memcmp(o.data, t.data, t.bytes) == 0);
  }
  CHECK(ours.metadata().at("tessera_step") == "7");

  nlohmann::json cfg = read_json(out + "/config.json"),
                 golden = read_json(kGolden + "/config.json");
  golden.erase("transformers_version");  // transformers' own stamp
  std::set<std::string> ours_keys, golden_keys;
  for (auto &[k, v] : cfg.items()) ours_keys.insert(k);
  for (auto &[k, v] : golden.items()) golden_keys.insert(k);
  CHECK(ours_keys == golden_keys);
  for (const auto &k : golden_keys) {
    if (k == "bos_token_id" || k == "eos_token_id") continue;  // 50256 only for GPT-2's BPE
    INFO(k);
    CHECK(cfg[k] == golden[k]);
  }
  CHECK(cfg["bos_token_id"].is_null());
}

TEST_CASE("gpt2's export: bf16, a .safetensors path, GPT-2's special tokens, bad arguments",
          "[export_hf]") {
  tessera::test::Fixture f;
  Model m(f);
  REQUIRE(m.create(f.config("model", "gpt2", golden_config()), token_data(kT), 1) == TSR_OK);
  const auto *ext = export_ext(f);
  Weights w(m);
  TempDir tmp;
  std::string summary;
  const std::string file = (tmp.path / "w.safetensors").string();
  tsr_export_args a = args(file, true, w, summary);
  REQUIRE(ext->write(m.self, &a) == TSR_OK);
  tessera::SafetensorsFile half(file);
  CHECK(half.get("transformer.wte.weight").dtype == "BF16");
  CHECK(half.get("transformer.wte.weight").shape == std::vector<int64_t>{kVocab, kWidth});
  CHECK(read_json(tmp.path / "config.json").at("dtype") == "bfloat16");

  // A parameter count that is not the model's, and -o naming a plain file.
  a.num_params = w.ptrs.size() - 1;
  CHECK(ext->write(m.self, &a) == TSR_ERR_INVALID);
  CHECK(f.host.last_error().find("parameters handed over") != std::string::npos);
  std::ofstream(tmp.path / "plain") << "x";
  const std::string plain = (tmp.path / "plain").string();
  a = args(plain, false, w, summary);
  CHECK(ext->write(m.self, &a) == TSR_ERR_IO);
  CHECK(f.host.last_error().find("-o names a directory") != std::string::npos);

  // GPT-2's own vocabulary gets <|endoftext|> as bos and eos.
  Model big(f);
  REQUIRE(big.create(f.config("model", "gpt2", "layers = 1\nwidth = 8\nheads = 2\ncontext = 4\n"),
                     token_data(4, 50257), 1) == TSR_OK);
  Weights wb(big, false);
  const std::string dir = (tmp.path / "big").string();
  a = args(dir, false, wb, summary);
  REQUIRE(ext->write(big.self, &a) == TSR_OK);
  const nlohmann::json c = read_json(tmp.path / "big" / "config.json");
  CHECK(c.at("bos_token_id") == 50256);
  CHECK(c.at("eos_token_id") == 50256);
  CHECK(c.at("vocab_size") == 50257);
}

TEST_CASE("bf16 export rounds to nearest even", "[export_hf]") {
  const auto bf16_from_fp32 = tessera::sdk::float_to_bf16;  // what the exports round with
  CHECK(bf16_from_fp32(1.0f) == 0x3f80);
  CHECK(bf16_from_fp32(-2.0f) == 0xc000);
  CHECK(bf16_from_fp32(1.0f + 1.0f / 256) == 0x3f80);  // a tie: to even (down)
  CHECK(bf16_from_fp32(1.0f + 3.0f / 256) == 0x3f82);  // a tie: to even (up)
  CHECK(bf16_from_fp32(1.0f + 1.5f / 256) == 0x3f81);  // above the tie
  CHECK((bf16_from_fp32(std::numeric_limits<float>::quiet_NaN()) & 0x7fc0) == 0x7fc0);
}

}  // namespace unit_test_export_hf
