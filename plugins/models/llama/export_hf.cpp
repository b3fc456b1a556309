// The llama plugin's Hugging Face export (TSR_EXT_MODEL_EXPORT_HF): the
// parameters under their own names (Hugging Face's already, in its
// layouts; no lm_head.weight when tied) in model.safetensors, and the
// config.json save_pretrained writes for this architecture, in
// transformers 5's form (rope_parameters) with transformers 4's rope_theta
// and rope_scaling beside it, so either version loads it.
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <tessera/cpp/formats/safetensors.hpp>
#include <tessera/cpp/half.hpp>
#include <tessera/cpp/synced_file.hpp>
#include <vector>

#include "hf_config.hpp"
#include "llama.hpp"

namespace tessera::llama {

namespace {

namespace fs = std::filesystem;
namespace st = formats::safetensors;
using nlohmann::json;

json rope_json(const Arch &a, bool with_theta) {
  json r = {{"rope_type", rope_type_name(a.rope.type)}};
  if (with_theta) r["rope_theta"] = a.rope.theta;
  if (a.rope.type == TSR_ROPE_LLAMA3) {
    r["factor"] = a.rope.factor;
    r["low_freq_factor"] = a.rope.low_freq_factor;
    r["high_freq_factor"] = a.rope.high_freq_factor;
    r["original_max_position_embeddings"] = a.rope.original_max_position_embeddings;
  }
  return r;
}

json hf_config(const Llama &m, bool bf16) {
  const Arch &a = m.a;
  const std::string type = a.architecture == "Qwen2ForCausalLM"   ? "qwen2"
                           : a.architecture == "Qwen3ForCausalLM" ? "qwen3"
                                                                  : "llama";
  json c = {
      {"architectures", json::array({a.architecture})},
      {"model_type", type},
      {"attention_dropout", 0.0},
      {"dtype", bf16 ? "bfloat16" : "float32"},
      {"torch_dtype", bf16 ? "bfloat16" : "float32"},
      {"head_dim", a.head_dim},
      {"hidden_act", "silu"},
      {"hidden_size", a.width},
      {"initializer_range", a.init_std},
      {"intermediate_size", a.intermediate},
      {"max_position_embeddings", a.max_seq},
      {"num_attention_heads", a.heads},
      {"num_hidden_layers", a.layers},
      {"num_key_value_heads", a.kv_heads},
      {"rms_norm_eps", a.rms_eps},
      {"rope_parameters", rope_json(a, true)},
      {"rope_theta", a.rope.theta},
      {"rope_scaling", a.rope.type == TSR_ROPE_DEFAULT ? json(nullptr) : rope_json(a, false)},
      {"tie_word_embeddings", a.tie},
      {"use_cache", true},
      {"vocab_size", a.vocab},
  };
  if (type == "llama") {
    c["attention_bias"] = false;
    c["mlp_bias"] = false;
    c["pretraining_tp"] = 1;
  } else {
    c["use_sliding_window"] = false;
    c["sliding_window"] = nullptr;
    c["max_window_layers"] = a.layers;
    c["layer_types"] = json::array();
    for (int64_t l = 0; l < a.layers; ++l) c["layer_types"].push_back("full_attention");
    if (type == "qwen3") c["attention_bias"] = false;
  }
  return c;
}

// -o DIR: DIR/model.safetensors and DIR/config.json; -o FILE.safetensors:
// that file, config.json beside it.
std::pair<fs::path, fs::path> output_files(const std::string &out) {
  if (out.ends_with(".safetensors")) {
    const fs::path w(out);
    return {w, w.parent_path().empty() ? fs::path("config.json") : w.parent_path() / "config.json"};
  }
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec))
    throw Error(TSR_ERR_IO, "llama export: " + out +
                                " is a file; -o names a directory for a Hugging Face export "
                                "(or a .safetensors file)");
  fs::create_directories(out, ec);
  if (ec) throw Error(TSR_ERR_IO, "llama export: " + out + ": cannot create: " + ec.message());
  return {fs::path(out) / "model.safetensors", fs::path(out) / "config.json"};
}

void write_export(const Llama &m, const tsr_export_args &args) {
  if (args.struct_size < tsr_export_args_STRUCT_SIZE || !args.out || !args.params)
    throw Error(TSR_ERR_INVALID, "llama export: the host's export arguments are incomplete");
  if (args.num_params != m.infos.size())
    throw Error(TSR_ERR_INVALID, "llama export: " + std::to_string(args.num_params) +
                                     " parameters handed over; this model has " +
                                     std::to_string(m.infos.size()));
  const bool bf16 = args.bf16 != 0;
  std::vector<st::Tensor> tensors;
  std::vector<std::vector<uint16_t>> halves;
  halves.reserve(m.infos.size());
  for (size_t i = 0; i < m.infos.size(); ++i) {
    const tsr_param_info &p = m.infos[i];
    const std::vector<int64_t> shape(p.shape, p.shape + p.ndim);
    size_t n = 1;
    for (int64_t s : shape) n *= static_cast<size_t>(s);
    if (!args.params[i])
      throw Error(TSR_ERR_INVALID, std::string("llama export: no values for ") + p.name);
    if (!bf16) {
      tensors.push_back(st::Tensor{p.name, "F32", shape, args.params[i], n * 4});
    } else {
      halves.emplace_back(n);
      for (size_t j = 0; j < n; ++j) halves.back()[j] = sdk::float_to_bf16(args.params[i][j]);
      tensors.push_back(st::Tensor{p.name, "BF16", shape, halves.back().data(), n * 2});
    }
  }
  const auto [weights, config] = output_files(args.out);
  st::write(
      weights.string(), tensors,
      {{"format", "pt"}, {"tessera_model", "llama"}, {"tessera_step", std::to_string(args.step)}});
  sdk::write_file_synced(config, hf_config(m, bf16).dump(2) + "\n");
  const std::string line = std::to_string(tensors.size()) + " tensors (" +
                           (bf16 ? "bf16" : "fp32") + ") as a Hugging Face " + m.a.architecture +
                           " (" + std::to_string(m.a.layers) + " layers, width " +
                           std::to_string(m.a.width) + "): " + weights.string() + " and " +
                           config.string();
  if (args.summary && args.summary_cap > 0) {
    const size_t k = std::min(line.size(), args.summary_cap - 1);
    std::copy_n(line.data(), k, args.summary);
    args.summary[k] = '\0';
  }
}

}  // namespace

tsr_status export_hf(void *self, const tsr_export_args *args) {
  const Llama *m = static_cast<const Llama *>(self);
  return sdk::guard(m ? m->host : nullptr, [&] {
    if (!m || !args) throw Error(TSR_ERR_INVALID, "llama export: no instance or no arguments");
    write_export(*m, *args);
  });
}

}  // namespace tessera::llama
