// The gpt2 plugin's C ABI: the model vtable (every entry guarded), the
// config keys it takes, and the library descriptor the host loads.
#include <iterator>
#include <string>

#include "gpt2.hpp"

namespace tessera::gpt2 {

namespace {

// --- the vtable: every entry guarded -----------------------------------------

tsr_status gpt2_create(const tsr_host *host, const tsr_config *cfg, const tsr_model_init *init,
                       void **out_self) {
  return sdk::guard(host, [&] {
    if (!out_self) throw Error(TSR_ERR_INVALID, "gpt2: out_self is NULL");
    *out_self = nullptr;
    *out_self = build(host, cfg, init);
  });
}

void gpt2_destroy(void *self) {
  Gpt2 *m = static_cast<Gpt2 *>(self);
  if (!m) return;
  const tsr_host *host = m->host;
  (void)sdk::guard(host, [&] { delete m; });
}

size_t gpt2_num_params(void *self) {
  const Gpt2 *m = static_cast<const Gpt2 *>(self);
  return m ? m->infos.size() : 0;
}

tsr_status gpt2_param_info(void *self, size_t index, tsr_param_info *out) {
  Gpt2 *m = static_cast<Gpt2 *>(self);
  if (!m) return TSR_ERR_INVALID;
  return sdk::guard(m->host, [&] {
    if (!out) throw Error(TSR_ERR_INVALID, "gpt2: param_info out is NULL");
    if (index >= m->infos.size())
      throw Error(TSR_ERR_INVALID, "gpt2: parameter index " + std::to_string(index) +
                                       " out of range (the model has " +
                                       std::to_string(m->infos.size()) + ")");
    const size_t size = out->struct_size ? out->struct_size : sizeof *out;
    *out = m->infos[index];
    out->struct_size = size;
  });
}

tsr_status gpt2_forward(void *self, tsr_step *step, const tsr_batch *batch, int32_t training,
                        tsr_forward_result *out) {
  Gpt2 *m = static_cast<Gpt2 *>(self);
  if (!m) return TSR_ERR_INVALID;
  return sdk::guard(m->host, [&] { m->forward(step, batch, training, out); });
}

tsr_status gpt2_backward(void *self, tsr_step *step, const tsr_batch *batch, float loss_scale) {
  Gpt2 *m = static_cast<Gpt2 *>(self);
  if (!m) return TSR_ERR_INVALID;
  return sdk::guard(m->host, [&] { m->backward(step, batch, loss_scale); });
}

tsr_status gpt2_predict(void *self, tsr_step *step, const tsr_batch *batch, DLTensor *logits) {
  Gpt2 *m = static_cast<Gpt2 *>(self);
  if (!m) return TSR_ERR_INVALID;
  return sdk::guard(m->host, [&] { m->predict(step, batch, logits); });
}

double gpt2_flops_per_sample(void *self) {
  const Gpt2 *m = static_cast<const Gpt2 *>(self);
  return m ? m->flops_per_sample() : 0.0;
}

const tsr_param_decl kParams[] = {
    sdk::param_min("layers", TSR_PARAM_INT, "0",
                   "Transformer blocks (n_layer); 0: init_from's config.json, else 12", 0),
    sdk::param_min("heads", TSR_PARAM_INT, "0",
                   "Attention heads (n_head); 0: init_from's config.json, else 12", 0),
    sdk::param_min("width", TSR_PARAM_INT, "0",
                   "Embedding width (n_embd), a multiple of heads; 0: init_from's config.json, "
                   "else 768",
                   0),
    sdk::param_min("context", TSR_PARAM_INT, "0",
                   "Longest sequence (n_positions, the rows of wpe); 0: init_from's config.json, "
                   "else 1024",
                   0),
    sdk::param_min("vocab", TSR_PARAM_INT, "0",
                   "Vocabulary size (vocab_size); 0: init_from's config.json, else 50257", 0),
    sdk::param_min("vocab_pad_to", TSR_PARAM_INT, "64",
                   "wte gets vocab rounded up to a multiple of this many rows (50257 -> 50304); "
                   "padding rows are kept out of the loss and trimmed on export",
                   1),
    sdk::param("init_from", TSR_PARAM_STRING, "\"\"",
               "A Hugging Face GPT-2 directory (config.json + model.safetensors): its "
               "config.json sets the dimensions (an explicit key that disagrees is an error) "
               "and its weights the initial parameters"),
    sdk::param("freeze", TSR_PARAM_STRING_ARRAY, "[]",
               "Parameter name patterns (* matches any run, ? one character) to freeze: no "
               "gradient, no optimizer state; e.g. [\"transformer.wte.weight\", "
               "\"transformer.h.0.*\"]"),
    sdk::param("recompute", TSR_PARAM_BOOL, "false",
               "Keep only each block's input and recompute its activations in backward "
               "(activation checkpointing): less memory, one more block forward per block"),
    sdk::param("fused", TSR_PARAM_BOOL, "true",
               "Use the host's fused ops (ABI 1.3: residual add + LayerNorm, bias gradients "
               "and GELU's backward in the matmuls) where it has them; false runs the "
               "unfused op sequences, for comparisons"),
    sdk::param_min("init_std", TSR_PARAM_FLOAT, "0.02",
                   "std of the initial weights; c_proj weights get init_std / sqrt(2 * layers) "
                   "(GPT-2's scaled init); biases zero, LayerNorm weights one",
                   0.0),
};

const tsr_model_vtable kVtable = {
    sizeof(tsr_model_vtable),
    gpt2_create,
    gpt2_destroy,
    gpt2_num_params,
    gpt2_param_info,
    gpt2_forward,
    gpt2_backward,
    gpt2_flops_per_sample,
    gpt2_predict,
};

const tsr_plugin_descriptor kDescriptor = {
    sizeof(tsr_plugin_descriptor),
    TSR_KIND_MODEL,
    "gpt2",
    "1.0.0",
    "GPT-2 language model (Hugging Face names and layouts, tied LM head, pre-LayerNorm)",
    kParams,
    std::size(kParams),
    TSR_DEVICE_CPU | TSR_DEVICE_CUDA,
    &kVtable,
};

const tsr_plugin_descriptor *const kPlugins[] = {&kDescriptor};

const tsr_plugin_library kLibrary = {
    sizeof(tsr_plugin_library), TSR_ABI_MAJOR, TSR_ABI_MINOR, kPlugins, std::size(kPlugins),
};

}  // namespace

}  // namespace tessera::gpt2

TSR_PLUGIN_ENTRY {
  return &tessera::gpt2::kLibrary;
}
