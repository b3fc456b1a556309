// The gpt2 plugin's C ABI: the config keys it takes, the model vtable (the
// SDK's adapter over Gpt2, every entry guarded) and the library descriptor
// the host loads.
#include <string>
#include <tessera/cpp/extension.hpp>
#include <tessera/cpp/model.hpp>

#include "gpt2.hpp"

namespace tessera::gpt2 {

namespace {

// What `tessera plugins` says of it (the descriptor's summary).
constexpr const char *kSummary =
    "GPT-2 language model (Hugging Face names and layouts, tied LM head, pre-LayerNorm)";

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
    sdk::param("recompute_gelu", TSR_PARAM_BOOL, "false",
               "Keep the MLP's input to GELU but not its output, and recompute the GELU in "
               "backward: a quarter less activation memory for one element-wise pass per block"),
    sdk::param("fused", TSR_PARAM_BOOL, "true",
               "Use the host's fused ops (ABI 1.3: residual add + LayerNorm, bias gradients "
               "and GELU's backward in the matmuls) where it has them; false runs the "
               "unfused op sequences, for comparisons"),
    sdk::param_min("init_std", TSR_PARAM_FLOAT, "0.02",
                   "std of the initial weights; c_proj weights get init_std / sqrt(2 * layers) "
                   "(GPT-2's scaled init); biases zero, LayerNorm weights one",
                   0.0),
};

const tsr_model_vtable kVtable = sdk::model_vtable<Gpt2, build>();

const char *gpt2_init_weights(void *self) {
  const Gpt2 *m = static_cast<const Gpt2 *>(self);
  return m && !m->init_weights.empty() ? m->init_weights.c_str() : nullptr;
}

const tsr_ext_model_init_from kInitFrom = {tsr_ext_model_init_from_STRUCT_SIZE, gpt2_init_weights,
                                           nullptr};
const tsr_ext_model_export_hf kExportHf = {tsr_ext_model_export_hf_STRUCT_SIZE,
                                           "transformers' GPT2LMHeadModel", export_hf};
const sdk::Extension kExtensions[] = {{TSR_EXT_MODEL_INIT_FROM, &kInitFrom},
                                      {TSR_EXT_MODEL_EXPORT_HF, &kExportHf}};

const void *gpt2_extension(const char *id) {
  return sdk::find_extension(kExtensions, id);
}

// The name configs give as [model] plugin; tests build a copy under
// another (tests/plugins), which must behave exactly as gpt2 does.
#ifndef TSR_GPT2_PLUGIN_NAME
#define TSR_GPT2_PLUGIN_NAME "gpt2"
#endif

const tsr_plugin_descriptor kDescriptor =
    sdk::describe(TSR_KIND_MODEL, TSR_GPT2_PLUGIN_NAME, "1.0.0", kSummary, kParams,
                  TSR_DEVICE_CPU | TSR_DEVICE_CUDA, &kVtable, gpt2_extension);

}  // namespace

}  // namespace tessera::gpt2

TSR_SDK_PLUGIN_LIBRARY(&tessera::gpt2::kDescriptor)
