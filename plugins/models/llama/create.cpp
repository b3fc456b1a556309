// Creating a llama model (llama_create): the architecture from the TOML keys
// and/or a Hugging Face config.json, the dataset checked, the parameters
// declared (Hugging Face names and shapes), init_from's tensors checked, and
// the activation memory planned and allocated.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <tessera/cpp/name_pattern.hpp>
#include <tessera/cpp/regular_file.hpp>
#include <utility>
#include <vector>

#include "hf_config.hpp"
#include "llama.hpp"

namespace tessera::llama {

namespace {

DLDataType compute_dtype(const tsr_run_info &run) {
  if (run.device.device_type == kDLCPU || run.device.device_type == kDLCUDAHost)
    return sdk::dtype_f32();
  if (run.precision == TSR_PRECISION_BF16) return DLDataType{kDLBfloat, 16, 1};
  if (run.precision == TSR_PRECISION_FP16) return DLDataType{kDLFloat, 16, 1};
  return sdk::dtype_f32();
}

// A TOML value over the file's: unset (0) takes the file's, else they must agree.
template <typename T>
void merge(T &toml, T file, bool have_file, const char *key, const char *hf_key,
           const std::string &path) {
  if (!have_file) return;
  if (toml != T{} && toml != file)
    throw Error(TSR_ERR_CONFIG, std::string("llama: model.") + key + " disagrees with " + path +
                                    " (" + hf_key + "); leave the key out to take the file's");
  toml = file;
}

// The architecture: TOML keys over hf_config's or init_from's config.json.
Arch resolve_arch(const sdk::Config &c, const std::string &config_path) {
  const bool file = !config_path.empty();
  const Arch f = file ? arch_from_hf_config(config_path) : Arch{};
  Arch a;
  a.architecture = c.get_string("architecture");
  a.layers = c.get_int("layers");
  a.width = c.get_int("width");
  a.heads = c.get_int("heads");
  a.kv_heads = c.get_int("kv_heads");
  a.head_dim = c.get_int("head_dim");
  a.intermediate = c.get_int("intermediate");
  a.vocab = c.get_int("vocab");
  a.max_seq = c.get_int("max_seq");
  a.rms_eps = c.get_float("rms_eps");
  a.tie = c.get_bool("tie_embeddings");
  a.attention_bias = c.get_bool("attention_bias");
  a.qk_norm = c.get_bool("qk_norm");
  a.init_std = c.get_float("init_std");
  std::string rope_type = c.get_string("rope_type");
  a.rope.struct_size = tsr_rope_params_STRUCT_SIZE;
  a.rope.theta = c.get_float("rope_theta");
  a.rope.factor = c.get_float("rope_factor");
  a.rope.low_freq_factor = c.get_float("rope_low_freq_factor");
  a.rope.high_freq_factor = c.get_float("rope_high_freq_factor");
  a.rope.original_max_position_embeddings = c.get_int("rope_original_max");
  const std::string &p = config_path;
  merge(a.architecture, f.architecture, file, "architecture", "architectures", p);
  merge(a.layers, f.layers, file, "layers", "num_hidden_layers", p);
  merge(a.width, f.width, file, "width", "hidden_size", p);
  merge(a.heads, f.heads, file, "heads", "num_attention_heads", p);
  merge(a.kv_heads, f.kv_heads, file, "kv_heads", "num_key_value_heads", p);
  merge(a.head_dim, f.head_dim, file, "head_dim", "head_dim", p);
  merge(a.intermediate, f.intermediate, file, "intermediate", "intermediate_size", p);
  merge(a.vocab, f.vocab, file, "vocab", "vocab_size", p);
  merge(a.rms_eps, f.rms_eps, file, "rms_eps", "rms_norm_eps", p);
  merge(a.tie, f.tie, file, "tie_embeddings", "tie_word_embeddings", p);
  merge(a.attention_bias, f.attention_bias, file, "attention_bias", "attention_bias", p);
  merge(a.qk_norm, f.qk_norm, file, "qk_norm", "architectures (Qwen3)", p);
  merge(rope_type, std::string(rope_type_name(f.rope.type)), file, "rope_type", "rope_type", p);
  merge(a.rope.theta, f.rope.theta, file, "rope_theta", "rope_theta", p);
  merge(a.rope.factor, f.rope.factor, file, "rope_factor", "factor", p);
  merge(a.rope.low_freq_factor, f.rope.low_freq_factor, file, "rope_low_freq_factor",
        "low_freq_factor", p);
  merge(a.rope.high_freq_factor, f.rope.high_freq_factor, file, "rope_high_freq_factor",
        "high_freq_factor", p);
  merge(a.rope.original_max_position_embeddings, f.rope.original_max_position_embeddings, file,
        "rope_original_max", "original_max_position_embeddings", p);
  // max_seq may be shorter than the file's (it sizes the activations).
  if (a.max_seq == 0) a.max_seq = file ? f.max_seq : 2048;
  if (a.init_std == 0) a.init_std = file ? f.init_std : 0.02;
  if (a.architecture.empty()) a.architecture = "LlamaForCausalLM";
  if (a.architecture == "Qwen2ForCausalLM") a.attention_bias = true;
  if (a.attention_bias && a.architecture != "Qwen2ForCausalLM")
    throw Error(TSR_ERR_CONFIG,
                "llama: model.attention_bias = true with " + a.architecture +
                    ": Hugging Face's attention_bias gives o_proj a bias too there, which is not "
                    "supported; q/k/v biases alone are Qwen2ForCausalLM's");
  if (a.architecture == "Qwen3ForCausalLM") a.qk_norm = true;
  if (a.architecture != "LlamaForCausalLM" && a.architecture != "Qwen2ForCausalLM" &&
      a.architecture != "Qwen3ForCausalLM")
    throw Error(TSR_ERR_CONFIG, "llama: model.architecture = '" + a.architecture +
                                    "'; LlamaForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM");
  if (rope_type.empty() || rope_type == "default") {
    a.rope.type = TSR_ROPE_DEFAULT;
  } else if (rope_type == "llama3") {
    a.rope.type = TSR_ROPE_LLAMA3;
  } else {
    throw Error(TSR_ERR_CONFIG, "llama: model.rope_type = '" + rope_type +
                                    "'; the llama plugin computes 'default' and 'llama3'");
  }
  if (a.rope.theta == 0) a.rope.theta = 10000.0;
  if (a.rms_eps == 0) a.rms_eps = 1e-6;
  if (a.kv_heads == 0) a.kv_heads = a.heads;
  if (a.head_dim == 0 && a.heads > 0) a.head_dim = a.width / a.heads;
  return a;
}

void check_arch(const Arch &a) {
  for (const auto &[v, key] :
       {std::pair{a.layers, "layers"}, std::pair{a.width, "width"}, std::pair{a.heads, "heads"},
        std::pair{a.kv_heads, "kv_heads"}, std::pair{a.head_dim, "head_dim"},
        std::pair{a.intermediate, "intermediate"}, std::pair{a.vocab, "vocab"},
        std::pair{a.max_seq, "max_seq"}})
    if (v < 1)
      throw Error(TSR_ERR_CONFIG, std::string("llama: model.") + key +
                                      " must be at least 1 (set it, or give hf_config or "
                                      "init_from)");
  if (a.heads % a.kv_heads != 0)
    throw Error(TSR_ERR_CONFIG, "llama: heads " + std::to_string(a.heads) +
                                    " is not a multiple of kv_heads " + std::to_string(a.kv_heads));
  if (a.head_dim % 2 != 0)
    throw Error(TSR_ERR_CONFIG,
                "llama: head_dim " + std::to_string(a.head_dim) + " is odd; RoPE rotates halves");
  if (!(a.rope.theta > 0) || !std::isfinite(a.rope.theta))
    throw Error(TSR_ERR_CONFIG, "llama: rope_theta must be a positive number");
  if (a.rope.type == TSR_ROPE_LLAMA3 &&
      (!(a.rope.factor > 0) || !(a.rope.high_freq_factor > a.rope.low_freq_factor) ||
       a.rope.original_max_position_embeddings < 1))
    throw Error(TSR_ERR_CONFIG,
                "llama: rope_type llama3 needs rope_factor > 0, rope_high_freq_factor > "
                "rope_low_freq_factor and rope_original_max >= 1");
}

void declare_params(Llama &m) {
  const Arch &a = m.a;
  auto declare = [&](std::string name, std::initializer_list<int64_t> shape, uint32_t group,
                     tsr_init rule) {
    m.names.push_back(std::move(name));
    tsr_param_info p = sdk::make<tsr_param_info>();
    p.name = m.names.back().c_str();
    p.ndim = static_cast<int32_t>(shape.size());
    std::copy(shape.begin(), shape.end(), p.shape);
    p.group = group;
    p.init = rule;
    p.init_b = rule == TSR_INIT_NORMAL ? static_cast<float>(a.init_std) : 0.0f;
    p.trainable = 1;
    p.decay = p.ndim >= 2 ? 1 : 0;  // matrices and embeddings; not biases or norms
    m.infos.push_back(p);
    return static_cast<uint32_t>(m.infos.size() - 1);
  };
  const int64_t C = a.width, QD = m.QD(), KD = m.KD(), F = a.intermediate;
  m.embed = declare("model.embed_tokens.weight", {a.vocab, C}, 0, TSR_INIT_NORMAL);
  m.layer.assign(static_cast<size_t>(a.layers), {});
  for (int64_t l = 0; l < a.layers; ++l) {
    auto &ix = m.layer[static_cast<size_t>(l)];
    ix.fill(kAbsent);
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    const uint32_t g = static_cast<uint32_t>(l + 1);
    ix[kInNorm] = declare(pre + "input_layernorm.weight", {C}, g, TSR_INIT_ONES);
    const std::string at = pre + "self_attn.";
    ix[kQ] = declare(at + "q_proj.weight", {QD, C}, g, TSR_INIT_NORMAL);
    if (a.attention_bias) ix[kQBias] = declare(at + "q_proj.bias", {QD}, g, TSR_INIT_ZEROS);
    ix[kK] = declare(at + "k_proj.weight", {KD, C}, g, TSR_INIT_NORMAL);
    if (a.attention_bias) ix[kKBias] = declare(at + "k_proj.bias", {KD}, g, TSR_INIT_ZEROS);
    ix[kV] = declare(at + "v_proj.weight", {KD, C}, g, TSR_INIT_NORMAL);
    if (a.attention_bias) ix[kVBias] = declare(at + "v_proj.bias", {KD}, g, TSR_INIT_ZEROS);
    ix[kO] = declare(at + "o_proj.weight", {C, QD}, g, TSR_INIT_NORMAL);
    if (a.qk_norm) {
      ix[kQNorm] = declare(at + "q_norm.weight", {a.head_dim}, g, TSR_INIT_ONES);
      ix[kKNorm] = declare(at + "k_norm.weight", {a.head_dim}, g, TSR_INIT_ONES);
    }
    ix[kPostNorm] = declare(pre + "post_attention_layernorm.weight", {C}, g, TSR_INIT_ONES);
    ix[kGate] = declare(pre + "mlp.gate_proj.weight", {F, C}, g, TSR_INIT_NORMAL);
    ix[kUp] = declare(pre + "mlp.up_proj.weight", {F, C}, g, TSR_INIT_NORMAL);
    ix[kDown] = declare(pre + "mlp.down_proj.weight", {C, F}, g, TSR_INIT_NORMAL);
    lora_declare(m, static_cast<uint32_t>(l));
  }
  const uint32_t gf = static_cast<uint32_t>(a.layers + 1);
  m.final_norm = declare("model.norm.weight", {C}, gf, TSR_INIT_ONES);
  if (!a.tie) m.lm_head = declare("lm_head.weight", {a.vocab, C}, gf, TSR_INIT_NORMAL);
}

// freeze: every pattern must name at least one parameter; then the lowest
// backward stage (the parameter's group) that has a trainable parameter.
void apply_freeze(Llama &m, const std::vector<std::string> &freeze) {
  m.lowest_trainable_stage =
      sdk::apply_freeze(m.infos, freeze, "llama", "model.layers.0.self_attn.q_proj.weight",
                        static_cast<int64_t>(m.L()) + 2);
}

// init_from's weights: DIR/model.safetensors, else the shards of
// DIR/model.safetensors.index.json (what save_pretrained writes for a large
// model). Returns what the engine's loader is handed.
std::string weights_of(const std::string &dir) {
  const std::string one = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
  if (sdk::open_regular_file(one) || !sdk::open_regular_file(index)) return one;
  return index;
}

// Every declared parameter in init_from's weights (one file, or the shards
// its index names), in its shape, in a dtype the engine's loader converts.
void check_weights(const Llama &m, const std::string &weights) {
  std::map<std::string, std::string> where;  // tensor -> its file
  if (weights.ends_with(".index.json")) {
    const nlohmann::json index = read_json(weights);
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      throw Error(TSR_ERR_INVALID, "llama: " + weights + " has no 'weight_map' object");
    const std::string dir = weights.substr(0, weights.find_last_of('/') + 1);
    for (const auto &[name, file] : index["weight_map"].items())
      where[name] = dir + file.get<std::string>();
  }
  std::map<std::string, nlohmann::json> headers;  // by file
  for (const tsr_param_info &p : m.infos) {
    if (m.lora.is_adapter(static_cast<size_t>(&p - m.infos.data()))) continue;  // not in a base
    const std::string file = where.empty() ? weights : where[p.name];
    if (file.empty())
      throw Error(TSR_ERR_INVALID, "llama: " + weights + " maps no file to '" + p.name + "'");
    if (!headers.count(file)) headers[file] = safetensors_header(file);
    const nlohmann::json &hdr = headers[file];
    auto it = hdr.find(p.name);
    if (it == hdr.end() || !it->is_object() || !it->contains("shape"))
      throw Error(TSR_ERR_INVALID, "llama: " + file + " has no tensor '" + p.name + "'");
    const std::vector<int64_t> shape = (*it)["shape"].get<std::vector<int64_t>>();
    if (shape != std::vector<int64_t>(p.shape, p.shape + p.ndim))
      throw Error(TSR_ERR_INVALID, "llama: " + file + ": '" + p.name + "' is " +
                                       shape_str(shape.data(), static_cast<int32_t>(shape.size())) +
                                       ", the model declares " + shape_str(p.shape, p.ndim));
    const std::string dt = it->value("dtype", "");
    if (dt != "F32" && dt != "F16" && dt != "BF16" && dt != "F64")
      throw Error(TSR_ERR_UNSUPPORTED, "llama: " + file + ": '" + p.name + "' has dtype " + dt +
                                           " (F32, F16, BF16 or F64 expected)");
  }
}

void check_data(Llama &m, const tsr_model_init &init) {
  const tsr_data_info &data = *init.data;
  const DLDataType i32 = sdk::dtype_i32();
  if (data.input_ndim != 1 || !same_dtype(data.input_dtype, i32) || data.target_ndim != 1 ||
      !same_dtype(data.target_dtype, i32) || data.target_shape[0] != data.input_shape[0])
    throw Error(TSR_ERR_UNSUPPORTED,
                "llama: the dataset's samples are " + dtype_name(data.input_dtype) + " " +
                    shape_str(data.input_shape, std::clamp(data.input_ndim, 0, 8)) +
                    "; the llama model takes int32 token windows, inputs and targets [T] (the "
                    "tokens dataset)");
  m.data_T = data.input_shape[0];
  if (m.data_T < 1 || m.data_T > m.a.max_seq)
    throw Error(TSR_ERR_CONFIG, "llama: the dataset's windows have " + std::to_string(m.data_T) +
                                    " tokens; the model's max_seq is " +
                                    std::to_string(m.a.max_seq));
  if (data.num_classes > m.a.vocab)
    throw Error(TSR_ERR_CONFIG, "llama: the dataset has " + std::to_string(data.num_classes) +
                                    " token ids; the model's vocab is " +
                                    std::to_string(m.a.vocab));
  if (init.max_micro_batch < 1)
    throw Error(TSR_ERR_INVALID,
                "llama: max_micro_batch is " + std::to_string(init.max_micro_batch));
  m.max_batch = init.max_micro_batch;
}

void log_summary(const Llama &m) {
  double total = 0, frozen = 0;
  for (const tsr_param_info &p : m.infos) {
    double n = 1;
    for (int32_t k = 0; k < p.ndim; ++k) n *= static_cast<double>(p.shape[k]);
    total += n;
    if (!p.trainable) frozen += n;
  }
  const Arch &a = m.a;
  char buf[512];
  // The activations, LoRA's u and its dropout scratch included.
  const size_t act = m.act.bytes() + m.stats.bytes() + m.lora.act.bytes() + m.lora.drop.bytes();
  std::snprintf(buf, sizeof buf,
                "llama: %s, %lld layers, width %lld, %lld/%lld heads of %lld, intermediate "
                "%lld, vocab %lld (%s), rope %s theta %g, %.0f parameters (%.0f frozen), "
                "activations %.1f MiB%s",
                a.architecture.c_str(), static_cast<long long>(a.layers),
                static_cast<long long>(a.width), static_cast<long long>(a.heads),
                static_cast<long long>(a.kv_heads), static_cast<long long>(a.head_dim),
                static_cast<long long>(a.intermediate), static_cast<long long>(a.vocab),
                a.tie ? "tied" : "untied", rope_type_name(a.rope.type), a.rope.theta, total, frozen,
                static_cast<double>(act) / (1024.0 * 1024.0), m.recompute ? " (recompute)" : "");
  m.host->log(m.host->ctx, TSR_LOG_INFO, buf);
  if (m.lora.enabled()) m.host->log(m.host->ctx, TSR_LOG_INFO, lora_summary(m).c_str());
}

}  // namespace

Llama *build(const tsr_host *host, const tsr_config *cfg, const tsr_model_init *init) {
  if (!host || !host->ops || !host->run)
    throw Error(TSR_ERR_INVALID, "llama: incomplete host table");
  const tsr_ops *ops = host->ops;
  if (!TSR_HAS_FIELD(ops, tsr_ops, attention_gqa_backward) || !ops->rmsnorm_forward ||
      !ops->rmsnorm_backward || !ops->add_rmsnorm_forward || !ops->rope_forward ||
      !ops->rope_backward || !ops->swiglu_forward || !ops->swiglu_backward ||
      !ops->attention_gqa_forward || !ops->attention_gqa_backward)
    throw Error(TSR_ERR_UNSUPPORTED,
                "llama: the host's ops table lacks ABI 1.6's decoder-block ops (rmsnorm, rope, "
                "swiglu, attention_gqa) the llama model computes with");
  if (!init || !init->data) throw Error(TSR_ERR_INVALID, "llama: no model init or data info");
  sdk::Config c(host, cfg);
  auto m = std::make_unique<Llama>();
  m->host = host;
  m->ops = ops;
  m->device = host->run->device;
  m->recompute = c.get_bool("recompute");
  const std::string swiglu = c.get_string("recompute_swiglu");  // a choice, checked by the host
  m->recompute_swiglu = !m->recompute && (swiglu == "always" ||
                                          (swiglu == "auto" && m->device.device_type != kDLCPU));
  lora_configure(*m, c);
  const std::string init_from = c.get_string("init_from"), hf_config = c.get_string("hf_config");
  if (!init_from.empty() && !hf_config.empty())
    throw Error(TSR_ERR_CONFIG,
                "llama: give model.init_from (a directory: config.json and weights) or "
                "model.hf_config (a config.json: random weights), not both");
  const std::string config_path = !init_from.empty() ? init_from + "/config.json" : hf_config;
  if (const size_t slash = config_path.find_last_of('/'); !config_path.empty())
    m->source_dir = slash == std::string::npos ? "." : config_path.substr(0, slash);
  m->a = resolve_arch(c, config_path);
  check_arch(m->a);
  check_data(*m, *init);
  declare_params(*m);
  lora_freeze_base(*m);
  apply_freeze(*m, c.get_string_array("freeze"));
  if (!init_from.empty()) {
    m->init_weights = weights_of(init_from);
    check_weights(*m, m->init_weights);
    const std::string msg = "llama: init_from " + init_from + ": the architecture from " +
                            config_path + ", " + (m->lora.enabled() ? "the base's" : "all") + " " +
                            std::to_string(m->infos.size() - m->lora.targets_on * 2 * m->L()) +
                            " parameters from " + m->init_weights + " (loaded by the engine)";
    host->log(host->ctx, TSR_LOG_INFO, msg.c_str());
  }
  m->plan_memory();
  m->allocate(compute_dtype(*host->run));
  if (host->log) log_summary(*m);
  return m.release();
}

}  // namespace tessera::llama
