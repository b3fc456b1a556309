// Reading a Hugging Face config.json of a Llama, Qwen2 or Qwen3 model into
// an Arch, refusing what the plugin does not compute, and a safetensors
// header (hf_config.hpp).
#include "hf_config.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <tessera/cpp/regular_file.hpp>

namespace tessera::llama {

using nlohmann::json;

json read_json(const std::string &path) {
  std::string text, why;
  bool refused = false;
  if (!sdk::read_regular_file(path, &text, &why, uint64_t{16} << 20, &refused))
    throw Error(refused ? TSR_ERR_INVALID : TSR_ERR_IO,
                refused ? "llama: " + path + " " + why : "llama: cannot open " + path + ": " + why);
  try {
    return json::parse(text);
  } catch (const json::exception &e) {
    throw Error(TSR_ERR_INVALID, "llama: " + path + ": " + e.what());
  }
}

namespace {

int64_t get_int(const json &j, const char *key, const std::string &file) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer())
    throw Error(TSR_ERR_INVALID, "llama: " + file + " has no integer '" + key + "'");
  return it->get<int64_t>();
}

double get_num(const json &j, const char *key, const std::string &file) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number())
    throw Error(TSR_ERR_INVALID, "llama: " + file + " has no number '" + key + "'");
  return it->get<double>();
}

// A key whose presence with a value other than null, false or 0 means a
// feature the plugin does not compute.
bool in_use(const json &j, const char *key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return false;
  if (it->is_boolean()) return it->get<bool>();
  if (it->is_number()) return it->get<double>() != 0;
  if (it->is_array() || it->is_object()) return !it->empty();
  return true;
}

[[noreturn]] void refuse(const std::string &file, const std::string &key, const std::string &why) {
  throw Error(TSR_ERR_UNSUPPORTED, "llama: " + file + ": '" + key + "' " + why);
}

// The rope: transformers 5's rope_parameters {rope_type, rope_theta, ...} or
// transformers 4's top-level rope_theta and rope_scaling (null: default).
tsr_rope_params read_rope(const json &cfg, const std::string &file) {
  tsr_rope_params r{};
  r.struct_size = tsr_rope_params_STRUCT_SIZE;
  const json *p = nullptr;
  std::string where;
  if (cfg.contains("rope_parameters") && cfg["rope_parameters"].is_object()) {
    p = &cfg["rope_parameters"];
    where = "rope_parameters";
    r.theta = get_num(*p, "rope_theta", file + " (rope_parameters)");
  } else {
    r.theta = cfg.contains("rope_theta") ? get_num(cfg, "rope_theta", file) : 10000.0;
    if (cfg.contains("rope_scaling") && cfg["rope_scaling"].is_object()) {
      p = &cfg["rope_scaling"];
      where = "rope_scaling";
    }
  }
  std::string type = "default";
  if (p) {
    if (p->contains("rope_type"))
      type = (*p)["rope_type"].get<std::string>();
    else if (p->contains("type"))
      type = (*p)["type"].get<std::string>();
  }
  if (type == "default") {
    r.type = TSR_ROPE_DEFAULT;
  } else if (type == "llama3") {
    const std::string f = file + " (" + where + ")";
    r.type = TSR_ROPE_LLAMA3;
    r.factor = get_num(*p, "factor", f);
    r.low_freq_factor = get_num(*p, "low_freq_factor", f);
    r.high_freq_factor = get_num(*p, "high_freq_factor", f);
    r.original_max_position_embeddings = get_int(*p, "original_max_position_embeddings", f);
  } else {
    refuse(file, where + ".rope_type",
           "is '" + type +
               "'; the llama plugin computes the rope "
               "types 'default' and 'llama3'");
  }
  return r;
}

}  // namespace

const char *rope_type_name(tsr_rope_type t) {
  return t == TSR_ROPE_LLAMA3 ? "llama3" : "default";
}

Arch arch_from_hf_config(const std::string &path) {
  const json cfg = read_json(path);
  Arch a;
  std::string arch;
  if (cfg.contains("architectures") && cfg["architectures"].is_array() &&
      !cfg["architectures"].empty())
    arch = cfg["architectures"][0].get<std::string>();
  if (arch != "LlamaForCausalLM" && arch != "Qwen2ForCausalLM" && arch != "Qwen3ForCausalLM")
    refuse(path, "architectures",
           "is '" + arch +
               "'; the llama plugin takes LlamaForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM");
  a.architecture = arch;
  for (const char *k : {"num_experts", "num_local_experts", "n_routed_experts",
                        "moe_intermediate_size", "num_experts_per_tok"})
    if (in_use(cfg, k)) refuse(path, k, "asks for a mixture of experts, which is not supported");
  if (in_use(cfg, "use_sliding_window"))
    refuse(path, "use_sliding_window", "is true; sliding-window attention is not supported");
  if (arch == "LlamaForCausalLM" && in_use(cfg, "sliding_window"))
    refuse(path, "sliding_window", "is set; sliding-window attention is not supported");
  if (cfg.contains("layer_types") && cfg["layer_types"].is_array())
    for (const json &t : cfg["layer_types"])
      if (t != "full_attention")
        refuse(path, "layer_types",
               "has '" + t.get<std::string>() + "'; only full_attention layers are supported");
  if (cfg.contains("hidden_act") && cfg["hidden_act"] != "silu")
    refuse(path, "hidden_act", "is " + cfg["hidden_act"].dump() + "; the MLP is SwiGLU (silu)");
  if (in_use(cfg, "mlp_bias")) refuse(path, "mlp_bias", "is true; the MLP has no biases here");
  if (cfg.contains("pretraining_tp") && cfg["pretraining_tp"].is_number_integer() &&
      cfg["pretraining_tp"].get<int64_t>() > 1)
    refuse(path, "pretraining_tp", "is above 1, which is not supported");

  a.layers = get_int(cfg, "num_hidden_layers", path);
  a.width = get_int(cfg, "hidden_size", path);
  a.heads = get_int(cfg, "num_attention_heads", path);
  a.kv_heads = cfg.contains("num_key_value_heads") && !cfg["num_key_value_heads"].is_null()
                   ? get_int(cfg, "num_key_value_heads", path)
                   : a.heads;
  a.head_dim = cfg.contains("head_dim") && !cfg["head_dim"].is_null()
                   ? get_int(cfg, "head_dim", path)
                   : (a.heads > 0 ? a.width / a.heads : 0);
  a.intermediate = get_int(cfg, "intermediate_size", path);
  a.vocab = get_int(cfg, "vocab_size", path);
  a.max_seq = get_int(cfg, "max_position_embeddings", path);
  a.rms_eps = get_num(cfg, "rms_norm_eps", path);
  a.tie = cfg.value("tie_word_embeddings", false);
  // Qwen2 always has q/k/v biases; Llama and Qwen3 say so in attention_bias
  // (which covers o_proj too: refused, o_proj has none here).
  a.attention_bias = arch == "Qwen2ForCausalLM" || in_use(cfg, "attention_bias");
  if (arch != "Qwen2ForCausalLM" && in_use(cfg, "attention_bias"))
    refuse(path, "attention_bias",
           "is true: that gives o_proj a bias too, which is not supported (Qwen2's q/k/v biases "
           "are)");
  a.qk_norm = arch == "Qwen3ForCausalLM";
  if (cfg.contains("initializer_range") && cfg["initializer_range"].is_number())
    a.init_std = cfg["initializer_range"].get<double>();
  a.rope = read_rope(cfg, path);
  return a;
}

nlohmann::json safetensors_header(const std::string &path) {
  sdk::RegularFile f = sdk::open_regular_file(path);
  if (f.refused) throw Error(TSR_ERR_INVALID, "llama: " + path + " " + f.why);
  if (!f) throw Error(TSR_ERR_IO, "llama: cannot open " + path);
  auto read_at = [&](void *dst, size_t n, uint64_t off) {
    size_t got = 0;
    while (got < n) {
      const ssize_t r =
          ::pread(f.fd, static_cast<char *>(dst) + got, n - got, static_cast<off_t>(off + got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  };
  unsigned char len8[8] = {0};
  if (!read_at(len8, 8, 0)) throw Error(TSR_ERR_INVALID, "llama: " + path + " is too short");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len8[i];
  if (n > (uint64_t{100} << 20) || n > f.size - 8)
    throw Error(TSR_ERR_INVALID,
                "llama: " + path + ": implausible safetensors header length " + std::to_string(n));
  std::string text(static_cast<size_t>(n), '\0');
  if (!read_at(text.data(), text.size(), 8))
    throw Error(TSR_ERR_INVALID, "llama: " + path + ": truncated safetensors header");
  try {
    return json::parse(text);
  } catch (const json::exception &e) {
    throw Error(TSR_ERR_INVALID, "llama: " + path + ": " + e.what());
  }
}

}  // namespace tessera::llama
