// The gpt2 plugin's Hugging Face export (TSR_EXT_MODEL_EXPORT_HF): the
// weights as the directory transformers' GPT2LMHeadModel.from_pretrained
// loads. model.safetensors takes the parameters under their own names (they
// are Hugging Face's already, in its Conv1D layouts), wte trimmed to the real
// vocabulary (the padding rows dropped); config.json has the keys
// save_pretrained writes for a GPT2Config, with this instance's dimensions,
// which create() resolved from the run's config (and init_from's
// config.json) by the plugin's one rule.
#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <tessera/cpp/formats/safetensors.hpp>
#include <tessera/cpp/half.hpp>
#include <tessera/cpp/plugin.hpp>
#include <tessera/cpp/synced_file.hpp>
#include <vector>

#include "gpt2.hpp"

namespace tessera::gpt2 {

namespace {

namespace fs = std::filesystem;
namespace st = formats::safetensors;

nlohmann::json hf_config(const Gpt2 &m, bool bf16) {
  const Dims &d = m.d;
  // GPT-2's BPE has <|endoftext|> = 50256 as both; another vocabulary has no
  // known special tokens.
  const nlohmann::json special = d.vocab == 50257 ? nlohmann::json(50256) : nlohmann::json(nullptr);
  // What the plugin computes: tanh GELU, eps 1e-5, 4C MLP, tied head, scaled
  // attention, no dropout.
  return {
      {"activation_function", "gelu_new"},
      {"add_cross_attention", false},
      {"architectures", nlohmann::json::array({"GPT2LMHeadModel"})},
      {"attn_pdrop", 0.0},
      {"bos_token_id", special},
      {"dtype", bf16 ? "bfloat16" : "float32"},
      {"embd_pdrop", 0.0},
      {"eos_token_id", special},
      {"initializer_range", m.init_std},
      {"layer_norm_epsilon", 1e-5},  // kLayerNormEps, as the double HF writes
      {"model_type", "gpt2"},
      {"n_embd", d.width},
      {"n_head", d.heads},
      {"n_inner", nullptr},
      {"n_layer", d.layers},
      {"n_positions", d.context},
      {"pad_token_id", nullptr},
      {"reorder_and_upcast_attn", false},
      {"resid_pdrop", 0.0},
      {"scale_attn_by_inverse_layer_idx", false},
      {"scale_attn_weights", true},
      {"summary_activation", nullptr},
      {"summary_first_dropout", 0.1},
      {"summary_proj_to_labels", true},
      {"summary_type", "cls_index"},
      {"summary_use_proj", true},
      {"tie_word_embeddings", true},
      {"use_cache", true},
      {"vocab_size", d.vocab},
  };
}

// -o DIR: DIR/model.safetensors and DIR/config.json (what save_pretrained
// writes); -o FILE.safetensors: that file, config.json beside it.
std::pair<fs::path, fs::path> output_files(const std::string &out) {
  if (out.ends_with(".safetensors")) {
    const fs::path w(out);
    return {w, w.parent_path().empty() ? fs::path("config.json") : w.parent_path() / "config.json"};
  }
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec))
    throw Error(TSR_ERR_IO, "gpt2 export: " + out +
                                " is a file; -o names a directory for a Hugging Face export "
                                "(or a .safetensors file)");
  fs::create_directories(out, ec);
  if (ec) throw Error(TSR_ERR_IO, "gpt2 export: " + out + ": cannot create: " + ec.message());
  return {fs::path(out) / "model.safetensors", fs::path(out) / "config.json"};
}

void write_export(const Gpt2 &m, const tsr_export_args &a) {
  if (a.struct_size < tsr_export_args_STRUCT_SIZE_1_2 || !a.out || !a.params)
    throw Error(TSR_ERR_INVALID, "gpt2 export: the host's export arguments are incomplete");
  if (a.num_params != m.infos.size())
    throw Error(TSR_ERR_INVALID, "gpt2 export: " + std::to_string(a.num_params) +
                                     " parameters handed over; this gpt2 has " +
                                     std::to_string(m.infos.size()));
  if (a.struct_size >= offsetof(tsr_export_args, adapters) + sizeof(a.adapters) &&
      a.adapters != TSR_EXPORT_BASE)
    throw Error(TSR_ERR_INVALID,
                "gpt2 export: --merge / --lora-format: the gpt2 model has no LoRA adapters");
  const bool bf16 = a.bf16 != 0;
  std::vector<st::Tensor> tensors;
  std::vector<std::vector<uint16_t>> halves;
  halves.reserve(m.infos.size());
  for (size_t i = 0; i < m.infos.size(); ++i) {
    const tsr_param_info &p = m.infos[i];
    std::vector<int64_t> shape(p.shape, p.shape + p.ndim);
    // wte keeps its first `vocab` rows (row-major: a prefix of the tensor).
    if (std::string(p.name) == "transformer.wte.weight") shape[0] = m.d.vocab;
    size_t n = 1;
    for (int64_t s : shape) n *= static_cast<size_t>(s);
    if (!a.params[i])
      throw Error(TSR_ERR_INVALID, std::string("gpt2 export: no values for ") + p.name);
    if (!bf16) {
      tensors.push_back(st::Tensor{p.name, "F32", shape, a.params[i], n * 4});
    } else {
      halves.emplace_back(n);
      for (size_t j = 0; j < n; ++j) halves.back()[j] = sdk::float_to_bf16(a.params[i][j]);
      tensors.push_back(st::Tensor{p.name, "BF16", shape, halves.back().data(), n * 2});
    }
  }
  const auto [weights, config] = output_files(a.out);
  st::write(
      weights.string(), tensors,
      {{"format", "pt"}, {"tessera_model", "gpt2"}, {"tessera_step", std::to_string(a.step)}});
  sdk::write_file_synced(config, hf_config(m, bf16).dump(2) + "\n");
  const Dims &d = m.d;
  const std::string line =
      std::to_string(tensors.size()) + " tensors (" + (bf16 ? "bf16" : "fp32") +
      ") as a Hugging Face GPT-2 (" + std::to_string(d.layers) + " layers, " +
      std::to_string(d.heads) + " heads, width " + std::to_string(d.width) + ", context " +
      std::to_string(d.context) + ", vocab " + std::to_string(d.vocab) + ", wte " +
      std::to_string(d.vocab) + " of " + std::to_string(d.padded_vocab) +
      " rows): " + weights.string() + " and " + config.string();
  if (a.summary && a.summary_cap > 0) {
    const size_t k = std::min(line.size(), a.summary_cap - 1);
    std::copy_n(line.data(), k, a.summary);
    a.summary[k] = '\0';
  }
}

}  // namespace

tsr_status export_hf(void *self, const tsr_export_args *args) {
  const Gpt2 *m = static_cast<const Gpt2 *>(self);
  return sdk::guard(m ? m->host : nullptr, [&] {
    if (!m || !args) throw Error(TSR_ERR_INVALID, "gpt2 export: no instance or no arguments");
    write_export(*m, *args);
  });
}

}  // namespace tessera::gpt2
