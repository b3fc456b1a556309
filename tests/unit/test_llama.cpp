// The llama model plugin, loaded from the build tree the way a run loads it.
//
// Reference (not computed by the code under test): tests/data/llama3_L2_C64
// and qwen2_L2_C64 (README.golden.md), randomly initialised Hugging Face
// LlamaForCausalLM (GQA 4/2, untied, llama3 rope scaling) and
// Qwen2ForCausalLM (q/k/v biases, tied, GQA 4/1) with their float64
// forward and backward on a batch of token ids (some targets -100).
//
// In fp32 on the CPU: every logit row within 1e-5 relative (through
// predict on each prefix: attention is causal, so the prefix ending at t
// gives row t), the mean loss within 1e-6 relative, every gradient within
// 1e-4 relative, with both config.json forms (transformers 5's
// rope_parameters, transformers 4's rope_theta/rope_scaling) and with TOML
// keys alone. Also: init_from through the engine's loader (F64 tensors),
// recompute, freeze (frozen parameters get no gradient, the others still
// Hugging Face's), refusals naming key and file, and the export's names, shapes
// and dtypes against the golden model.safetensors.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <tessera/cpp/formats/safetensors.hpp>
#include <vector>

#include "gpt2_support.hpp"
#include "llama_support.hpp"
#include "plugin/layout.hpp"
#include "support/fixture.hpp"
#include "support/safetensors_read.hpp"
#include "train/init_from.hpp"
#include "util/safetensors.hpp"

namespace unit_test_llama {

namespace fs = std::filesystem;
using tessera::test::Fixture;
using tessera::test::RefTensor;
using tessera::test::gpt2_support::Batch;
using tessera::test::gpt2_support::fresh_result;
using tessera::test::gpt2_support::Model;
using tessera::test::gpt2_support::State;
using tessera::test::gpt2_support::token_data;
using tessera::test::gpt2_support::train_step;
using tessera::test::llama_support::Golden;
using tessera::test::llama_support::prefix_logits;
using tessera::test::llama_support::rel_err;

namespace {

std::string q(const std::string &s) {
  return "\"" + s + "\"";
}

// One training step on the reference batch: the loss and every gradient.
void check_step(Model &m, const Golden &g) {
  State s(m);
  REQUIRE(s.info.size() == g.weights.size());
  g.load(s);
  Batch batch = g.batch();
  const tsr_forward_result r = train_step(m, s, batch);
  int64_t counted = 0;
  for (int32_t t : g.ids("targets")) counted += t >= 0;
  CHECK(r.count == counted);
  const double got = r.loss_sum / static_cast<double>(r.count);
  INFO("loss " << got << ", Hugging Face " << g.loss());
  CHECK(std::fabs(got - g.loss()) <= 1e-6 * std::fabs(g.loss()));
  for (size_t i = 0; i < s.info.size(); ++i) {
    const std::string name = s.info[i].name;
    const double e = rel_err(s.grad[i], g.ref.at("grad." + name).data);
    INFO(name << ": relative error " << e);
    CHECK(e <= 1e-4);
  }
  CHECK(s.done == std::vector<uint32_t>{3, 2, 1, 0});
  CHECK(s.params_released == std::vector<uint32_t>{1, 2, 3, 0});
}

// Every logit row through predict on the prefix ending at it.
void check_logits(Model &m, const Golden &g) {
  State s(m);
  g.load(s);
  const std::vector<int32_t> ids = g.ids("input_ids");
  const RefTensor &z = g.ref.at("logits");
  double worst = 0;
  for (int64_t t = 0; t < g.T; ++t) {
    const std::vector<float> out = prefix_logits(m, s, ids, g.B, g.T, g.V, t);
    for (int64_t b = 0; b < g.B; ++b) {
      const auto row = z.data.begin() + (b * g.T + t) * g.V;
      const std::vector<double> want(row, row + g.V);
      const std::vector<float> have(out.begin() + b * g.V, out.begin() + (b + 1) * g.V);
      worst = std::max(worst, rel_err(have, want));
    }
  }
  INFO("worst row's relative error " << worst);
  CHECK(worst <= 1e-5);
}

}  // namespace

TEST_CASE("llama matches Hugging Face's LlamaForCausalLM with both config.json forms", "[llama]") {
  const Golden g("llama3_L2_C64");
  for (const char *file : {"config.json", "config.transformers4.json"}) {
    INFO(file);
    Fixture f;
    Model m(f, "llama");
    const std::string cfg = "hf_config = " + q(g.dir + "/" + file) + "\n";
    REQUIRE(m.create(f.config("model", "llama", cfg), token_data(g.T, g.V), g.B) == TSR_OK);
    check_step(m, g);
    check_logits(m, g);
  }
}

TEST_CASE("llama matches Hugging Face's Qwen2ForCausalLM (q/k/v biases, tied head)", "[llama]") {
  const Golden g("qwen2_L2_C64");
  Fixture f;
  Model m(f, "llama");
  const std::string cfg = "hf_config = " + q(g.dir + "/config.json") + "\n";
  REQUIRE(m.create(f.config("model", "llama", cfg), token_data(g.T, g.V), g.B) == TSR_OK);
  check_step(m, g);
  check_logits(m, g);
}

// recompute_swiglu = "always" (the default on GPUs): one SwiGLU output for
// both layers, layer 0's computed again in backward; the same gradients.
TEST_CASE("llama with one SwiGLU buffer for all layers matches Hugging Face", "[llama]") {
  const Golden g("llama3_L2_C64");
  Fixture f;
  Model m(f, "llama");
  const std::string cfg =
      "hf_config = " + q(g.dir + "/config.json") + "\nrecompute_swiglu = \"always\"\n";
  REQUIRE(m.create(f.config("model", "llama", cfg), token_data(g.T, g.V), g.B) == TSR_OK);
  check_step(m, g);
}

TEST_CASE("llama from TOML keys alone, with recompute, equals the config.json model", "[llama]") {
  const Golden g("llama3_L2_C64");
  Fixture f;
  Model m(f, "llama");
  const std::string cfg =
      "layers = 2\nwidth = 64\nheads = 4\nkv_heads = 2\nhead_dim = 16\nintermediate = 176\n"
      "vocab = 256\nmax_seq = 128\nrope_theta = 500000.0\nrope_type = \"llama3\"\n"
      "rope_factor = 8.0\nrope_low_freq_factor = 1.0\nrope_high_freq_factor = 4.0\n"
      "rope_original_max = 32\nrms_eps = 1e-5\nrecompute = true\n";
  REQUIRE(m.create(f.config("model", "llama", cfg), token_data(g.T, g.V), g.B) == TSR_OK);
  check_step(m, g);
}

TEST_CASE("llama init_from through the engine's loader (F64 tensors)", "[llama]") {
  const Golden g("qwen2_L2_C64");
  Fixture f;
  Model m(f, "llama");
  REQUIRE(m.create(f.config("model", "llama", "init_from = " + q(g.dir) + "\n"),
                   token_data(g.T, g.V), g.B) == TSR_OK);
  const tessera::Layout layout = tessera::make_layout(m.vt, m.self, 1, "llama");
  std::vector<float> flat(layout.total);
  tessera::init_params(layout, flat.data(), 1234);
  tessera::init_from_safetensors(g.dir, layout, flat.data());
  State s(m);
  for (size_t i = 0; i < s.info.size(); ++i) {
    const tessera::ParamSlot &p = layout.params[i];
    const RefTensor &hf = g.weights.at(p.name);
    for (size_t j = 0; j < p.numel; ++j) s.value[i][j] = flat[p.offset + j];
    INFO(p.name);
    for (size_t j = 0; j < hf.data.size(); ++j)
      REQUIRE(s.value[i][j] == static_cast<float>(hf.data[j]));
  }
  Batch batch = g.batch();
  const tsr_forward_result r = train_step(m, s, batch);
  CHECK(std::fabs(r.loss_sum / static_cast<double>(r.count) - g.loss()) <= 1e-6 * g.loss());
}

TEST_CASE("llama init_from reads sharded checkpoints through their index", "[llama]") {
  // The golden Llama split over two shard files with a Hugging Face
  // model.safetensors.index.json, as save_pretrained writes large models.
  const Golden g("llama3_L2_C64");
  const fs::path dir =
      fs::temp_directory_path() / ("tessera-llama-shards-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(g.dir + "/config.json", dir / "config.json");
  tessera::SafetensorsFile whole(g.dir + "/model.safetensors");
  std::vector<tessera::formats::safetensors::Tensor> shard[2];
  nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                          {"weight_map", nlohmann::json::object()}};
  int k = 0;
  for (const auto &[name, t] : whole.tensors()) {
    const int s = k++ % 2;
    shard[s].push_back({name, t.dtype, t.shape, t.data, t.bytes});
    index["weight_map"][name] = "model-0000" + std::to_string(s + 1) + "-of-00002.safetensors";
  }
  for (int s = 0; s < 2; ++s)
    tessera::formats::safetensors::write(
        (dir / ("model-0000" + std::to_string(s + 1) + "-of-00002.safetensors")).string(), shard[s],
        {{"format", "pt"}});
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();

  Fixture f;
  Model m(f, "llama");
  REQUIRE(m.create(f.config("model", "llama", "init_from = " + q(dir.string()) + "\n"),
                   token_data(g.T, g.V), g.B) == TSR_OK);
  const tessera::Layout layout = tessera::make_layout(m.vt, m.self, 1, "llama");
  std::vector<float> flat(layout.total);
  tessera::init_params(layout, flat.data(), 1234);
  const auto *ext = f.registry.find("model", "llama")
                        ->extension<tsr_ext_model_init_from>(TSR_EXT_MODEL_INIT_FROM);
  REQUIRE(ext != nullptr);
  const char *weights = ext->weights_file(m.self);
  REQUIRE(weights != nullptr);
  CHECK_THAT(weights, Catch::EndsWith("model.safetensors.index.json"));
  CHECK_THAT(tessera::init_from_safetensors(weights, layout, flat.data()),
             Catch::Contains("2 shards"));
  State s(m);
  for (size_t i = 0; i < s.info.size(); ++i) {
    const tessera::ParamSlot &p = layout.params[i];
    for (size_t j = 0; j < p.numel; ++j) s.value[i][j] = flat[p.offset + j];
    const RefTensor &hf = g.weights.at(p.name);
    INFO(p.name);
    for (size_t j = 0; j < hf.data.size(); ++j)
      REQUIRE(s.value[i][j] == static_cast<float>(hf.data[j]));
  }
  Batch batch = g.batch();
  const tsr_forward_result r = train_step(m, s, batch);
  CHECK(std::fabs(r.loss_sum / static_cast<double>(r.count) - g.loss()) <= 1e-6 * g.loss());
  // A shard the index names but the directory lacks: create says which.
  fs::remove(dir / "model-00002-of-00002.safetensors");
  Fixture f2;
  Model m2(f2, "llama");
  CHECK(m2.create(f2.config("model", "llama", "init_from = " + q(dir.string()) + "\n"),
                  token_data(g.T, g.V), g.B) != TSR_OK);
  CHECK_THAT(f2.host.last_error(), Catch::Contains("model-00002-of-00002.safetensors"));
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST_CASE("llama refuses what it does not compute, naming the key and the file", "[llama]") {
  const Golden g("llama3_L2_C64");
  const fs::path dir = fs::temp_directory_path() / ("tessera-llama-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ifstream in(g.dir + "/config.json");
  const nlohmann::json base = nlohmann::json::parse(in);
  auto refused = [&](const std::function<void(nlohmann::json &)> &edit, const std::string &key) {
    nlohmann::json c = base;
    edit(c);
    const std::string path = (dir / "config.json").string();
    std::ofstream(path) << c.dump();
    Fixture f;
    Model m(f, "llama");
    CHECK(m.create(f.config("model", "llama", "hf_config = " + q(path) + "\n"),
                   token_data(g.T, g.V), g.B) != TSR_OK);
    CHECK_THAT(f.host.last_error(), Catch::Contains(key) && Catch::Contains(path));
  };
  refused([](auto &c) { c["rope_parameters"]["rope_type"] = "yarn"; }, "rope_type");
  refused([](auto &c) { c["architectures"] = {"MistralForCausalLM"}; }, "architectures");
  refused([](auto &c) { c["sliding_window"] = 4096; }, "sliding_window");
  refused([](auto &c) { c["num_local_experts"] = 8; }, "num_local_experts");
  refused([](auto &c) { c["hidden_act"] = "gelu"; }, "hidden_act");
  refused([](auto &c) { c["attention_bias"] = true; }, "attention_bias");
  SECTION("a TOML key that disagrees with config.json") {
    Fixture f;
    Model m(f, "llama");
    CHECK(m.create(f.config("model", "llama",
                            "hf_config = " + q(g.dir + "/config.json") + "\nkv_heads = 4\n"),
                   token_data(g.T, g.V), g.B) == TSR_ERR_CONFIG);
    CHECK_THAT(f.host.last_error(), Catch::Contains("kv_heads"));
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST_CASE("llama reads a Qwen3ForCausalLM config.json: per-head q/k norms, no biases", "[llama]") {
  const Golden g("llama3_L2_C64");
  std::ifstream in(g.dir + "/config.json");
  nlohmann::json c = nlohmann::json::parse(in);
  c["architectures"] = {"Qwen3ForCausalLM"};
  c["model_type"] = "qwen3";
  c["tie_word_embeddings"] = true;
  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  const fs::path path =
      fs::temp_directory_path() / ("tessera-llama-qwen3-" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << c.dump();
  Fixture f;
  Model m(f, "llama");
  REQUIRE(m.create(f.config("model", "llama", "hf_config = " + q(path.string()) + "\n"),
                   token_data(g.T, g.V), g.B) == TSR_OK);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const tsr_param_info &p : m.infos())
    shapes[p.name] = std::vector<int64_t>(p.shape, p.shape + p.ndim);
  CHECK(shapes.at("model.layers.1.self_attn.q_norm.weight") == std::vector<int64_t>{16});
  CHECK(shapes.at("model.layers.1.self_attn.k_norm.weight") == std::vector<int64_t>{16});
  CHECK(shapes.count("model.layers.0.self_attn.q_proj.bias") == 0);
  CHECK(shapes.count("lm_head.weight") == 0);  // tied
  CHECK(shapes.size() == 1 + 2 * 11 + 1);
  fs::remove(path);
}

TEST_CASE("llama exports the golden layout: names, shapes, F32 values, config.json", "[llama]") {
  for (const char *name : {"llama3_L2_C64", "qwen2_L2_C64"}) {
    INFO(name);
    const Golden g(name);
    Fixture f;
    Model m(f, "llama");
    REQUIRE(m.create(f.config("model", "llama", "init_from = " + q(g.dir) + "\n"),
                     token_data(g.T, g.V), 1) == TSR_OK);
    const auto *e = f.registry.find("model", "llama");
    REQUIRE(e != nullptr);
    const auto *ext = e->extension<tsr_ext_model_export_hf>(TSR_EXT_MODEL_EXPORT_HF);
    REQUIRE(ext != nullptr);
    State s(m);
    g.load(s);
    std::vector<const float *> ptrs;
    for (const auto &v : s.value) ptrs.push_back(v.data());
    const fs::path out =
        fs::temp_directory_path() / ("tessera-llama-export-" + std::to_string(::getpid()));
    fs::remove_all(out);
    tsr_export_args a{};
    a.struct_size = tsr_export_args_STRUCT_SIZE;
    const std::string out_s = out.string();
    a.out = out_s.c_str();
    a.num_params = ptrs.size();
    a.params = ptrs.data();
    REQUIRE(ext->write(m.self, &a) == TSR_OK);
    tessera::SafetensorsFile ours(out_s + "/model.safetensors"), hf(g.dir + "/model.safetensors");
    REQUIRE(ours.tensors().size() == hf.tensors().size());
    for (const auto &[n, t] : hf.tensors()) {
      INFO(n);
      const tessera::StTensor &o = ours.get(n);
      CHECK(o.shape == t.shape);
      CHECK(t.dtype == "F64");  // the reference model is float64; the export fp32
      CHECK(o.dtype == "F32");
    }
    // The export configures the same model again.
    Fixture f2;
    Model m2(f2, "llama");
    REQUIRE(m2.create(f2.config("model", "llama", "hf_config = " + q(out_s + "/config.json")),
                      token_data(g.T, g.V), g.B) == TSR_OK);
    check_step(m2, g);
    std::error_code ec;
    fs::remove_all(out, ec);
  }
}

TEST_CASE("llama freeze: frozen parameters get no gradient, the others Hugging Face's", "[llama]") {
  const Golden g("llama3_L2_C64");
  const std::string base = "hf_config = " + q(g.dir + "/config.json") + "\n";
  auto starts = [](const std::string &n, const char *prefix) { return n.rfind(prefix, 0) == 0; };
  struct Case {
    const char *freeze;
    std::function<bool(const std::string &)> frozen;  // which names it freezes
  };
  const Case cases[] = {
      // A LoRA-style base: everything but layer 1's attention projections.
      {R"(["model.embed_tokens.weight", "model.layers.0.*", "*layernorm*", "*mlp*", "model.norm.weight", "lm_head.weight"])",
       [&](const std::string &n) { return !starts(n, "model.layers.1.self_attn."); }},
      // Everything below layer 1: backward stops there.
      {R"(["model.embed_tokens.*", "model.layers.0.*"])",
       [&](const std::string &n) {
         return starts(n, "model.embed_tokens.") || starts(n, "model.layers.0.");
       }},
      // Only the head trains.
      {R"(["model.embed_tokens.weight", "model.layers.*"])",
       [&](const std::string &n) { return !starts(n, "lm_head.") && n != "model.norm.weight"; }},
      {R"(["*norm*"])", [](const std::string &n) { return n.find("norm") != std::string::npos; }},
      {R"(["*"])", [](const std::string &) { return true; }},
  };
  for (const Case &c : cases) {
    DYNAMIC_SECTION("freeze = " << c.freeze) {
      Fixture f;
      Model m(f, "llama");
      REQUIRE(m.create(f.config("model", "llama", base + "freeze = " + c.freeze + "\n"),
                       token_data(g.T, g.V), g.B) == TSR_OK);
      State s(m);
      g.load(s);
      Batch batch = g.batch();
      const tsr_forward_result r = train_step(m, s, batch);
      CHECK(std::fabs(r.loss_sum / static_cast<double>(r.count) - g.loss()) <=
            1e-6 * std::fabs(g.loss()));
      CHECK(s.done == std::vector<uint32_t>{3, 2, 1, 0});
      for (size_t i = 0; i < s.info.size(); ++i) {
        const std::string name = s.info[i].name;
        INFO(name);
        const bool frozen = c.frozen(name);
        CHECK(s.info[i].trainable == (frozen ? 0 : 1));
        if (frozen) {
          CHECK(s.grads_asked.count(static_cast<uint32_t>(i)) == 0);
          CHECK(std::all_of(s.grad[i].begin(), s.grad[i].end(), [](float e) { return e == 0; }));
        } else {
          CHECK(rel_err(s.grad[i], g.ref.at("grad." + name).data) <= 1e-4);
        }
      }
    }
  }
  SECTION("a pattern that matches nothing is an error naming it") {
    Fixture f;
    Model m(f, "llama");
    CHECK(m.create(f.config("model", "llama", base + "freeze = [\"layers.0.*\"]\n"),
                   token_data(g.T, g.V), g.B) == TSR_ERR_CONFIG);
    CHECK_THAT(f.host.last_error(), Catch::Contains("'layers.0.*' matches no parameter"));
  }
}

}  // namespace unit_test_llama
