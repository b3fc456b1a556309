// A partly frozen llama for the frozen-parameter tests (CPU:
// test_frozen.cpp; two GPUs: tests/gpu/jobs/test_frozen_gpu.cpp): the
// golden Llama's shape with weights drawn here, so a test knows each frozen
// tensor's initial bits, and the `freeze` list with its rule written out.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "harness.hpp"

namespace tessera::itest::frozen_llama {

// The golden Llama's architecture (tests/data/llama3_L2_C64/config.json:
// 2 layers, hidden 64, 4 heads of 16, 2 key-value heads, intermediate 176,
// vocab 256, untied head): every tensor's name and shape, as transformers
// names them.
struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
};

inline std::vector<Tensor> llama_tensors() {
  std::vector<Tensor> t = {{"model.embed_tokens.weight", {256, 64}}};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back({p + "input_layernorm.weight", {64}});
    t.push_back({p + "self_attn.q_proj.weight", {64, 64}});
    t.push_back({p + "self_attn.k_proj.weight", {32, 64}});
    t.push_back({p + "self_attn.v_proj.weight", {32, 64}});
    t.push_back({p + "self_attn.o_proj.weight", {64, 64}});
    t.push_back({p + "post_attention_layernorm.weight", {64}});
    t.push_back({p + "mlp.gate_proj.weight", {176, 64}});
    t.push_back({p + "mlp.up_proj.weight", {176, 64}});
    t.push_back({p + "mlp.down_proj.weight", {64, 176}});
  }
  t.push_back({"model.norm.weight", {64}});
  t.push_back({"lm_head.weight", {256, 64}});
  return t;
}

inline size_t numel(const Tensor &t) {
  size_t n = 1;
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  return n;
}

// The embeddings, every attention projection, layer 0's MLP and layer 1's
// gate and up projections are frozen: the norms, layer 1's down projection
// and the head train (a split inside every layer's group).
inline const char *kFreeze =
    "freeze = [\"model.embed_tokens.weight\", \"model.layers.*.self_attn.*_proj.weight\", "
    "\"model.layers.0.mlp.*\", \"model.layers.1.mlp.gate_proj.weight\", "
    "\"model.layers.1.mlp.up_proj.weight\"]\n";

// The same rule, written out by hand.
inline bool trains(const std::string &name) {
  const std::string norm = "norm.weight";
  const bool is_norm =
      name.size() >= norm.size() && name.compare(name.size() - norm.size(), norm.size(), norm) == 0;
  return is_norm || name == "lm_head.weight" || name == "model.layers.1.mlp.down_proj.weight";
}

// init_from: a directory with the golden model's config.json and fp32
// weights drawn here (norms near 1, matrices small), so the test knows each
// frozen tensor's initial bits.
inline std::map<std::string, std::vector<float>> write_base(const fs::path &dir) {
  fs::create_directories(dir);
  fs::copy_file(fs::path(TESSERA_SOURCE_DIR) / "tests/data/llama3_L2_C64/config.json",
                dir / "config.json", fs::copy_options::overwrite_existing);
  std::map<std::string, std::vector<float>> values;
  nlohmann::json header = nlohmann::json::object();
  size_t offset = 0;
  uint64_t state = 0x9e3779b97f4a7c15ULL;
  for (const Tensor &t : llama_tensors()) {
    std::vector<float> v(numel(t));
    const bool norm = t.shape.size() == 1;
    for (float &x : v) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      const float u = static_cast<float>(state >> 40) / static_cast<float>(1 << 24) - 0.5f;
      x = norm ? 1.0f + 0.2f * u : 0.1f * u;
    }
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + v.size() * 4}}};
    offset += v.size() * 4;
    values[t.name] = std::move(v);
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  const uint64_t len = h.size();
  out.write(reinterpret_cast<const char *>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const Tensor &t : llama_tensors())
    out.write(reinterpret_cast<const char *>(values[t.name].data()),
              static_cast<std::streamsize>(values[t.name].size() * 4));
  return values;
}

// [model] (the partly frozen llama from `base`) and [data.train] (token
// windows of 16).
inline std::string sections(const std::string &tag, const fs::path &base) {
  const fs::path tokens = scratch() / (tag + "_tokens") / "tok_train_000000.bin";
  write_token_shard(tokens, 200 * 16 + 1, 256, 4244);
  return "[model]\nplugin = \"llama\"\ninit_from = \"" + base.string() + "\"\nmax_seq = 16\n" +
         kFreeze + "\n[data.train]\nplugin = \"tokens\"\nfiles = \"" + tokens.string() +
         "\"\ncontext = 16\nvocab = 256\n";
}

}  // namespace tessera::itest::frozen_llama
