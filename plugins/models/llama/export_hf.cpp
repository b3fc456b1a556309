// The llama plugin's Hugging Face export (TSR_EXT_MODEL_EXPORT_HF): the
// parameters under their own names (Hugging Face's already, in its
// layouts; no lm_head.weight when tied) in model.safetensors, or, past
// max_shard_bytes (default 5 GB, save_pretrained's), in shards
// model-0000k-of-0000n.safetensors with model.safetensors.index.json; the
// config.json save_pretrained writes for this architecture, in
// transformers 5's form (rope_parameters) with transformers 4's rope_theta
// and rope_scaling beside it, so either version loads it; and the
// tokenizer files of the directory the run's model came from. LoRA
// adapters are left out, folded in (TSR_EXPORT_MERGED) or written alone
// for PEFT (TSR_EXPORT_PEFT) by lora_export.cpp.
#include <algorithm>
#include <cstddef>
#include <cstdio>
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

constexpr uint64_t kDefaultShardBytes = 5'000'000'000;  // save_pretrained's "5GB"

// What a Hugging Face directory carries beside the weights for its
// tokenizer (and generation defaults): copied from the run's source
// directory when there.
constexpr const char *kTokenizerFiles[] = {"tokenizer.json",
                                           "tokenizer_config.json",
                                           "special_tokens_map.json",
                                           "added_tokens.json",
                                           "vocab.json",
                                           "merges.txt",
                                           "tokenizer.model",
                                           "chat_template.jinja",
                                           "generation_config.json"};

uint64_t param_bytes(const tsr_param_info &p, size_t esize) {
  uint64_t bytes = esize;
  for (int32_t k = 0; k < p.ndim; ++k) bytes *= static_cast<uint64_t>(p.shape[k]);
  return bytes;
}

// The parameters in declaration order, split into runs of at most
// max_bytes (a larger tensor gets a file of its own), as save_pretrained
// splits them.
std::vector<std::vector<size_t>> plan_shards(const Llama &m, size_t esize, uint64_t max_bytes) {
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0;
  for (size_t i = 0; i < m.infos.size(); ++i) {
    if (m.lora.is_adapter(i)) continue;  // never in the Hugging Face model
    const uint64_t bytes = param_bytes(m.infos[i], esize);
    if (!shards.back().empty() && in_shard + bytes > max_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes;
  }
  return shards;
}

std::string shard_name(size_t k, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k + 1, n);
  return buf;
}

// Where the files go: -o DIR (created), or -o FILE.safetensors (one file,
// config.json beside it). Weights files of an earlier export there are
// removed, so from_pretrained cannot pick up another export's.
struct Outputs {
  fs::path dir, single;  // single: the FILE.safetensors form
};

Outputs output_files(const std::string &out, size_t num_shards) {
  std::error_code ec;
  if (out.ends_with(".safetensors")) {
    if (num_shards > 1)
      throw Error(TSR_ERR_INVALID, "llama export: -o " + out +
                                       " names one file, but the model is " +
                                       std::to_string(num_shards) +
                                       " shards at this --shard-size; give a directory");
    const fs::path w(out);
    return {w.parent_path().empty() ? fs::path(".") : w.parent_path(), w};
  }
  if (fs::exists(out, ec) && !fs::is_directory(out, ec))
    throw Error(TSR_ERR_IO, "llama export: " + out +
                                " is a file; -o names a directory for a Hugging Face export "
                                "(or a .safetensors file)");
  fs::create_directories(out, ec);
  if (ec) throw Error(TSR_ERR_IO, "llama export: " + out + ": cannot create: " + ec.message());
  for (const auto &e : fs::directory_iterator(out, ec)) {
    const std::string n = e.path().filename().string();
    if (n == "model.safetensors" || n == "model.safetensors.index.json" ||
        (n.starts_with("model-") && n.find("-of-") != std::string::npos &&
         n.ends_with(".safetensors")))
      fs::remove(e.path(), ec);
  }
  return {fs::path(out), {}};
}

// One weights file: parameters `ids`, F32 or rounded to BF16 (only this
// file's tensors are converted at a time).
void write_shard(const Llama &m, const tsr_export_args &args, const std::vector<size_t> &ids,
                 const fs::path &file) {
  const bool bf16 = args.bf16 != 0;
  std::vector<st::Tensor> tensors;
  std::vector<std::vector<uint16_t>> halves;
  std::vector<std::vector<float>> merged(ids.size());
  halves.reserve(ids.size());
  for (size_t k = 0; k < ids.size(); ++k) {
    const size_t i = ids[k];
    const tsr_param_info &p = m.infos[i];
    const std::vector<int64_t> shape(p.shape, p.shape + p.ndim);
    size_t n = 1;
    for (int64_t s : shape) n *= static_cast<size_t>(s);
    const float *values = lora_export_values(m, args, i, merged[k]);
    if (!bf16) {
      tensors.push_back(st::Tensor{p.name, "F32", shape, values, n * 4});
    } else {
      halves.emplace_back(n);
      for (size_t j = 0; j < n; ++j) halves.back()[j] = sdk::float_to_bf16(values[j]);
      tensors.push_back(st::Tensor{p.name, "BF16", shape, halves.back().data(), n * 2});
    }
  }
  st::write(
      file.string(), tensors,
      {{"format", "pt"}, {"tessera_model", "llama"}, {"tessera_step", std::to_string(args.step)}});
}

// The source directory's tokenizer files into `dir`; returns how many.
int copy_tokenizer(const Llama &m, const fs::path &dir) {
  if (m.source_dir.empty()) return 0;
  std::error_code ec;
  if (fs::equivalent(m.source_dir, dir, ec)) return 0;
  int copied = 0;
  for (const char *name : kTokenizerFiles) {
    const fs::path from = fs::path(m.source_dir) / name;
    if (!fs::is_regular_file(from, ec)) continue;
    fs::copy_file(from, dir / name, fs::copy_options::overwrite_existing, ec);
    if (ec)
      throw Error(TSR_ERR_IO, "llama export: cannot copy " + from.string() + " to " + dir.string() +
                                  ": " + ec.message());
    ++copied;
  }
  return copied;
}

void write_export(const Llama &m, const tsr_export_args &args) {
  if (args.struct_size < tsr_export_args_STRUCT_SIZE_1_2 || !args.out || !args.params)
    throw Error(TSR_ERR_INVALID, "llama export: the host's export arguments are incomplete");
  if (args.num_params != m.infos.size())
    throw Error(TSR_ERR_INVALID, "llama export: " + std::to_string(args.num_params) +
                                     " parameters handed over; this model has " +
                                     std::to_string(m.infos.size()));
  const int64_t adapters = export_adapters(m, args);
  if (adapters == TSR_EXPORT_PEFT) return lora_write_peft(m, args);
  const bool bf16 = args.bf16 != 0;
  const uint64_t max_bytes =
      args.struct_size >= offsetof(tsr_export_args, max_shard_bytes) + sizeof(uint64_t) &&
              args.max_shard_bytes > 0
          ? args.max_shard_bytes
          : kDefaultShardBytes;
  const auto shards = plan_shards(m, bf16 ? 2 : 4, max_bytes);
  const Outputs out = output_files(args.out, shards.size());
  std::string weights;
  if (shards.size() == 1) {
    const fs::path file = out.single.empty() ? out.dir / "model.safetensors" : out.single;
    write_shard(m, args, shards[0], file);
    weights = file.string();
  } else {
    json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
    uint64_t total = 0;
    for (size_t k = 0; k < shards.size(); ++k) {
      const std::string name = shard_name(k, shards.size());
      write_shard(m, args, shards[k], out.dir / name);
      for (size_t i : shards[k]) {
        total += param_bytes(m.infos[i], bf16 ? 2 : 4);
        index["weight_map"][m.infos[i].name] = name;
      }
    }
    index["metadata"]["total_size"] = total;
    sdk::write_file_synced(out.dir / "model.safetensors.index.json", index.dump(2) + "\n");
    weights = std::to_string(shards.size()) + " shards and " +
              (out.dir / "model.safetensors.index.json").string();
  }
  const fs::path config = out.dir / "config.json";
  sdk::write_file_synced(config, hf_config(m, bf16).dump(2) + "\n");
  const int tok = copy_tokenizer(m, out.dir);
  size_t written = 0;
  for (const auto &shard : shards) written += shard.size();
  std::string lora_note;
  if (m.lora.enabled() && adapters == TSR_EXPORT_MERGED)
    lora_note = " with the LoRA adapters (" + m.lora.targets_text() + ") merged";
  if (m.lora.enabled() && adapters == TSR_EXPORT_BASE) {
    lora_note = " (the base without its LoRA adapters)";
    const std::string warn =
        "llama export: the model has LoRA adapters (rank " + std::to_string(m.lora.rank) + " on " +
        m.lora.targets_text() +
        "); this export is the base model without them (LoRA keeps it frozen): --merge folds "
        "them into the weights, --lora-format peft writes them for PEFT";
    m.host->log(m.host->ctx, TSR_LOG_WARN, warn.c_str());
  }
  const std::string line =
      std::to_string(written) + " tensors (" + (bf16 ? "bf16" : "fp32") + ") as a Hugging Face " +
      m.a.architecture + " (" + std::to_string(m.a.layers) + " layers, width " +
      std::to_string(m.a.width) + ")" + lora_note + ": " + weights + ", " + config.string() +
      (tok ? " and " + std::to_string(tok) + " tokenizer files from " + m.source_dir : "");
  export_summary(args, line);
}

}  // namespace

void export_summary(const tsr_export_args &args, const std::string &line) {
  if (!args.summary || args.summary_cap == 0) return;
  const size_t k = std::min(line.size(), args.summary_cap - 1);
  std::copy_n(line.data(), k, args.summary);
  args.summary[k] = '\0';
}

tsr_status export_hf(void *self, const tsr_export_args *args) {
  const Llama *m = static_cast<const Llama *>(self);
  return sdk::guard(m ? m->host : nullptr, [&] {
    if (!m || !args) throw Error(TSR_ERR_INVALID, "llama export: no instance or no arguments");
    write_export(*m, *args);
  });
}

}  // namespace tessera::llama
