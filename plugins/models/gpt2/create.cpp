// Creating a gpt2 model (gpt2_create): its config keys read and checked, the
// dimensions resolved (init_from's config.json, else GPT-2 small's), the
// dataset checked, the parameters declared, frozen by pattern and checked
// against init_from's tensors, and the activation memory planned and
// allocated.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <tessera/cpp/name_pattern.hpp>
#include <utility>
#include <vector>

#include "gpt2.hpp"
#include "hf_checkpoint.hpp"

namespace tessera::gpt2 {

namespace {

// A block's parameter names under transformer.h.<l>., by BlockParam.
const char *const kBlockNames[kBlockParams] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};

// The compute dtype of a run's precision (the CPU computes in float32).
DLDataType compute_dtype(const tsr_run_info &run) {
  if (run.device.device_type == kDLCPU || run.device.device_type == kDLCUDAHost)
    return sdk::dtype_f32();
  if (run.precision == TSR_PRECISION_BF16) return DLDataType{kDLBfloat, 16, 1};
  if (run.precision == TSR_PRECISION_FP16) return DLDataType{kDLFloat, 16, 1};
  return sdk::dtype_f32();
}

// The host's ops table has the ops gpt2 computes with (ABI 1.1).
void check_host(const tsr_host *host) {
  if (!host || !host->ops || !host->run)
    throw Error(TSR_ERR_INVALID, "gpt2: incomplete host table");
  if (!TSR_HAS_FIELD(host->ops, tsr_ops, attention_backward) || !host->ops->linear ||
      !host->ops->layernorm_forward || !host->ops->embedding_forward ||
      !host->ops->attention_forward)
    throw Error(TSR_ERR_UNSUPPORTED,
                "gpt2: the host's ops table lacks the ABI 1.1 ops (linear, layernorm, embedding, "
                "attention) the gpt2 model computes with");
}

// The config keys that build uses beyond the model's own fields.
struct Keys {
  int64_t pad_to = 64;
  double init_std = 0.02;
  std::string init_from;
  std::vector<std::string> freeze;
};

// Reads and range-checks the config keys: the flags and the dimensions the
// config sets (0: unset) into m, the rest returned.
Keys read_keys(Gpt2 &m, const sdk::Config &c) {
  m.recompute = c.get_bool("recompute");
  m.recompute_gelu = c.get_bool("recompute_gelu");
  // ABI 1.3's fused ops where this host has them (a 1.1 or 1.2 host's
  // table ends before them: TSR_HAS_FIELD says no, and the 1.1 sequences
  // run). `fused = false` runs those sequences anyway, for comparisons.
  const bool fused = c.get_bool("fused");
  const tsr_ops *ops = m.ops;
  m.fuse_add_ln =
      fused && TSR_HAS_FIELD(ops, tsr_ops, add_layernorm_forward) && ops->add_layernorm_forward;
  m.fuse_bias_grad =
      fused && TSR_HAS_FIELD(ops, tsr_ops, matmul_bias_grad) && ops->matmul_bias_grad;
  m.fuse_act_grad =
      fused && TSR_HAS_FIELD(ops, tsr_ops, matmul_act_backward) && ops->matmul_act_backward;
  m.fuse_ln_sum =
      fused && TSR_HAS_FIELD(ops, tsr_ops, layernorm_backward_sum) && ops->layernorm_backward_sum;
  m.ce_grad_in_forward = fused;
  Dims &d = m.d;
  d.layers = c.get_int("layers");
  d.heads = c.get_int("heads");
  d.width = c.get_int("width");
  d.context = c.get_int("context");
  d.vocab = c.get_int("vocab");
  Keys k;
  k.pad_to = c.get_int("vocab_pad_to");
  k.init_std = c.get_float("init_std");
  k.init_from = c.get_string("init_from");
  k.freeze = c.get_string_array("freeze");
  for (const auto &[v, key] :
       {std::pair{d.layers, "layers"}, std::pair{d.heads, "heads"}, std::pair{d.width, "width"},
        std::pair{d.context, "context"}, std::pair{d.vocab, "vocab"}})
    if (v < 0)
      throw Error(TSR_ERR_CONFIG,
                  std::string("gpt2: ") + key + " = " + std::to_string(v) + " is negative");
  if (k.pad_to < 1)
    throw Error(TSR_ERR_CONFIG, "gpt2: vocab_pad_to = " + std::to_string(k.pad_to) + " is below 1");
  if (!(k.init_std >= 0) || !std::isfinite(k.init_std))
    throw Error(TSR_ERR_CONFIG, "gpt2: init_std must be a finite number >= 0");
  return k;
}

// Dimensions: init_from's config.json wins; an explicit key that says
// otherwise is an error. Without init_from, unset keys are GPT-2 small's.
// Returns the opened checkpoint (NULL without init_from).
std::unique_ptr<HfCheckpoint> resolve_dims(Dims &d, const Keys &k) {
  std::unique_ptr<HfCheckpoint> ck;
  if (!k.init_from.empty()) {
    ck = std::make_unique<HfCheckpoint>(open_checkpoint(k.init_from));
    const std::string &f = ck->config_path;
    merge_dim(d.layers, ck->dims.layers, "layers", "n_layer", f);
    merge_dim(d.heads, ck->dims.heads, "heads", "n_head", f);
    merge_dim(d.width, ck->dims.width, "width", "n_embd", f);
    merge_dim(d.context, ck->dims.context, "context", "n_positions", f);
    merge_dim(d.vocab, ck->dims.vocab, "vocab", "vocab_size", f);
  } else {
    if (d.layers == 0) d.layers = 12;
    if (d.heads == 0) d.heads = 12;
    if (d.width == 0) d.width = 768;
    if (d.context == 0) d.context = 1024;
    if (d.vocab == 0) d.vocab = 50257;
  }
  for (const auto &[v, key] :
       {std::pair{d.layers, "layers"}, std::pair{d.heads, "heads"}, std::pair{d.width, "width"},
        std::pair{d.context, "context"}, std::pair{d.vocab, "vocab"}})
    if (v < 1) throw Error(TSR_ERR_CONFIG, std::string("gpt2: ") + key + " must be at least 1");
  if (d.width % d.heads != 0)
    throw Error(TSR_ERR_CONFIG, "gpt2: width " + std::to_string(d.width) +
                                    " is not a multiple of heads " + std::to_string(d.heads));
  d.padded_vocab = (d.vocab + k.pad_to - 1) / k.pad_to * k.pad_to;
  return ck;
}

// What the dataset gives: int32 token windows, inputs and targets [T],
// that fit the model's context and vocabulary.
void check_data(Gpt2 &m, const tsr_model_init &init) {
  const tsr_data_info &data = *init.data;
  const Dims &d = m.d;
  if (data.input_ndim != 1 || !is_i32(data.input_dtype))
    throw Error(TSR_ERR_UNSUPPORTED,
                "gpt2: the dataset's samples are " + dtype_name(data.input_dtype) + " " +
                    shape_str(data.input_shape, std::clamp(data.input_ndim, 0, 8)) +
                    "; the gpt2 model takes windows of int32 token ids [T] (the tokens dataset)");
  if (data.target_ndim != 1 || !is_i32(data.target_dtype) ||
      data.target_shape[0] != data.input_shape[0])
    throw Error(TSR_ERR_UNSUPPORTED,
                "gpt2: the dataset's targets are " + dtype_name(data.target_dtype) + " " +
                    shape_str(data.target_shape, std::clamp(data.target_ndim, 0, 8)) +
                    "; the gpt2 model needs one int32 target token per input token [" +
                    std::to_string(data.input_shape[0]) + "]");
  m.data_T = data.input_shape[0];
  if (m.data_T < 1 || m.data_T > d.context)
    throw Error(TSR_ERR_CONFIG, "gpt2: the dataset's windows have " + std::to_string(m.data_T) +
                                    " tokens; the model's context is " + std::to_string(d.context));
  if (data.num_classes > d.vocab)
    throw Error(TSR_ERR_CONFIG, "gpt2: the dataset has " + std::to_string(data.num_classes) +
                                    " token ids; the model's vocab is " + std::to_string(d.vocab));
  if (init.max_micro_batch < 1)
    throw Error(TSR_ERR_INVALID,
                "gpt2: max_micro_batch is " + std::to_string(init.max_micro_batch));
  m.max_batch = init.max_micro_batch;
}

// The parameters under their Hugging Face names, group g + 1 for block g
// (0: the embeddings, layers + 1: the final LayerNorm), with their
// initialisers: GPT-2's, c_proj weights scaled by 1 / sqrt(2 * layers).
void declare_params(Gpt2 &m, double init_std) {
  const Dims &d = m.d;
  const int64_t C = d.width;
  const float proj_std =
      static_cast<float>(init_std / std::sqrt(2.0 * static_cast<double>(d.layers)));
  auto declare = [&](std::string name, std::initializer_list<int64_t> shape, uint32_t group,
                     tsr_init rule, float std_) {
    m.names.push_back(std::move(name));
    tsr_param_info p = sdk::make<tsr_param_info>();
    p.name = m.names.back().c_str();
    p.ndim = static_cast<int32_t>(shape.size());
    std::copy(shape.begin(), shape.end(), p.shape);
    p.group = group;
    p.init = rule;
    p.init_a = 0.0f;
    p.init_b = rule == TSR_INIT_NORMAL ? std_ : 0.0f;
    p.trainable = 1;
    p.decay = p.ndim >= 2 ? 1 : 0;  // matrices and embeddings; not biases or norms
    m.infos.push_back(p);
  };
  const float std0 = static_cast<float>(init_std);
  // wte: [padded_vocab, C]; rows >= vocab are padding, trimmed on export.
  declare("transformer.wte.weight", {d.padded_vocab, C}, 0, TSR_INIT_NORMAL, std0);
  declare("transformer.wpe.weight", {d.context, C}, 0, TSR_INIT_NORMAL, std0);
  for (int64_t l = 0; l < d.layers; ++l) {
    const std::string pre = "transformer.h." + std::to_string(l) + ".";
    const uint32_t g = static_cast<uint32_t>(l + 1);
    declare(pre + kBlockNames[kLn1W], {C}, g, TSR_INIT_ONES, 0);
    declare(pre + kBlockNames[kLn1B], {C}, g, TSR_INIT_ZEROS, 0);
    declare(pre + kBlockNames[kQkvW], {C, 3 * C}, g, TSR_INIT_NORMAL, std0);
    declare(pre + kBlockNames[kQkvB], {3 * C}, g, TSR_INIT_ZEROS, 0);
    declare(pre + kBlockNames[kAttnProjW], {C, C}, g, TSR_INIT_NORMAL, proj_std);
    declare(pre + kBlockNames[kAttnProjB], {C}, g, TSR_INIT_ZEROS, 0);
    declare(pre + kBlockNames[kLn2W], {C}, g, TSR_INIT_ONES, 0);
    declare(pre + kBlockNames[kLn2B], {C}, g, TSR_INIT_ZEROS, 0);
    declare(pre + kBlockNames[kFcW], {C, 4 * C}, g, TSR_INIT_NORMAL, std0);
    declare(pre + kBlockNames[kFcB], {4 * C}, g, TSR_INIT_ZEROS, 0);
    declare(pre + kBlockNames[kMlpProjW], {4 * C, C}, g, TSR_INIT_NORMAL, proj_std);
    declare(pre + kBlockNames[kMlpProjB], {C}, g, TSR_INIT_ZEROS, 0);
  }
  const uint32_t gf = static_cast<uint32_t>(d.layers + 1);
  declare("transformer.ln_f.weight", {C}, gf, TSR_INIT_ONES, 0);
  declare("transformer.ln_f.bias", {C}, gf, TSR_INIT_ZEROS, 0);
}

// freeze: every pattern must name at least one parameter. Then the lowest
// backward stage with a trainable parameter (wte counts for the embeddings,
// stage 0; the LM head always runs when anything trains).
void apply_freeze(Gpt2 &m, const std::vector<std::string> &freeze) {
  m.lowest_trainable_stage = sdk::apply_freeze(
      m.infos, freeze, "gpt2", "transformer.h.0.attn.c_attn.weight", m.d.layers + 2);
}

// init_from: the engine overlays the file's tensors on the declared
// initialisers by parameter name (engine/train/init_from.cpp: a tensor with
// fewer rows fills the first rows, so wte's padding keeps its initialiser).
// Checked here too, so a wrong checkpoint fails at create with the model's
// view of it: every parameter present under its Hugging Face name, in the
// Hugging Face shape (wte unpadded or already padded), in a dtype the
// engine converts.
void check_checkpoint(Gpt2 &m, const HfCheckpoint &ck) {
  m.init_weights = ck.weights_path;
  const auto &hdr = ck.header;
  for (const tsr_param_info &p : m.infos) {
    const std::string name = p.name;
    auto it = hdr.find(name);
    if (it == hdr.end() || !it->is_object() || !it->contains("shape")) {
      const std::string bare = name.substr(std::strlen("transformer."));
      throw Error(TSR_ERR_INVALID,
                  "gpt2: " + ck.weights_path + " has no tensor '" + name + "'" +
                      (hdr.contains(bare)
                           ? " (it has '" + bare +
                                 "': a GPT2Model checkpoint without the 'transformer.' prefix, "
                                 "which init_from does not rename)"
                           : std::string()));
    }
    const std::vector<int64_t> shape = (*it)["shape"].get<std::vector<int64_t>>();
    const std::vector<int64_t> declared(p.shape, p.shape + p.ndim);
    std::vector<int64_t> hf = declared;
    if (name == "transformer.wte.weight") hf[0] = m.d.vocab;
    if (shape != hf && shape != declared)
      throw Error(TSR_ERR_INVALID, "gpt2: " + ck.weights_path + ": '" + name + "' is " +
                                       shape_str(shape.data(), static_cast<int32_t>(shape.size())) +
                                       ", the model declares " + shape_str(hf.data(), p.ndim));
    const std::string dt = it->value("dtype", "");
    if (dt != "F32" && dt != "F16" && dt != "BF16")
      throw Error(TSR_ERR_UNSUPPORTED, "gpt2: " + ck.weights_path + ": '" + name + "' has dtype " +
                                           dt + " (F32, F16 or BF16 expected)");
  }
  const std::string msg = "gpt2: init_from " + ck.dir +
                          ": dimensions from config.json; the weights of model.safetensors "
                          "(all " +
                          std::to_string(m.infos.size()) +
                          " parameters present) are loaded "
                          "over the initialisers by the engine";
  m.host->log(m.host->ctx, TSR_LOG_INFO, msg.c_str());
}

// The start-up line: dimensions, parameters (frozen among them) and the
// activation memory.
void log_summary(const Gpt2 &m) {
  const Dims &d = m.d;
  double total = 0, frozen = 0;
  for (const tsr_param_info &p : m.infos) {
    double n = 1;
    for (int32_t k = 0; k < p.ndim; ++k) n *= static_cast<double>(p.shape[k]);
    total += n;
    if (!p.trainable) frozen += n;
  }
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "gpt2: %lld layers, %lld heads, width %lld, context %lld, vocab %lld (padded "
                "to %lld), %.0f parameters (%.0f frozen), activations %.1f MiB (%s)",
                static_cast<long long>(d.layers), static_cast<long long>(d.heads),
                static_cast<long long>(d.width), static_cast<long long>(d.context),
                static_cast<long long>(d.vocab), static_cast<long long>(d.padded_vocab), total,
                frozen, static_cast<double>(m.act.bytes() + m.stats.bytes()) / (1024.0 * 1024.0),
                m.recompute        ? "recompute"
                : m.recompute_gelu ? "stored, GELU recomputed"
                                   : "stored");
  m.host->log(m.host->ctx, TSR_LOG_INFO, buf);
}

}  // namespace

// ---- create -----------------------------------------------------------------

Gpt2 *build(const tsr_host *host, const tsr_config *cfg, const tsr_model_init *init) {
  check_host(host);
  if (!init || !init->data) throw Error(TSR_ERR_INVALID, "gpt2: no model init or data info");
  sdk::Config c(host, cfg);
  auto m = std::make_unique<Gpt2>();
  m->host = host;
  m->ops = host->ops;
  m->device = host->run->device;
  const Keys keys = read_keys(*m, c);
  const std::unique_ptr<HfCheckpoint> ck = resolve_dims(m->d, keys);
  m->init_std = keys.init_std;  // the export's initializer_range
  check_data(*m, *init);
  declare_params(*m, keys.init_std);
  apply_freeze(*m, keys.freeze);
  if (ck) check_checkpoint(*m, *ck);
  m->plan_memory();
  m->allocate(compute_dtype(*host->run));
  if (host->log) log_summary(*m);
  return m.release();
}

}  // namespace tessera::gpt2
