// The llama plugin's C ABI: its config keys, the model vtable (the SDK's
// adapter over Llama) and the library descriptor.
#include <iterator>
#include <tessera/cpp/extension.hpp>
#include <tessera/cpp/model.hpp>

#include "llama.hpp"

namespace tessera::llama {

namespace {

// Architecture keys: 0, "" or false leave them to hf_config / init_from's
// config.json (an explicit value that disagrees with the file is an error);
// without a config.json every dimension key is required.
const tsr_param_decl kParams[] = {
    sdk::param("architecture", TSR_PARAM_STRING, "\"\"",
               "LlamaForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM; \"\": config.json's, "
               "else LlamaForCausalLM"),
    sdk::param_min("layers", TSR_PARAM_INT, "0", "Decoder layers (num_hidden_layers)", 0),
    sdk::param_min("width", TSR_PARAM_INT, "0", "Hidden size (hidden_size)", 0),
    sdk::param_min("heads", TSR_PARAM_INT, "0", "Query heads (num_attention_heads)", 0),
    sdk::param_min("kv_heads", TSR_PARAM_INT, "0",
                   "Key/value heads (num_key_value_heads), dividing heads; 0: heads", 0),
    sdk::param_min("head_dim", TSR_PARAM_INT, "0", "Per-head width (head_dim); 0: width / heads",
                   0),
    sdk::param_min("intermediate", TSR_PARAM_INT, "0", "SwiGLU width (intermediate_size)", 0),
    sdk::param_min("vocab", TSR_PARAM_INT, "0", "Vocabulary size (vocab_size)", 0),
    sdk::param_min("max_seq", TSR_PARAM_INT, "0",
                   "Longest sequence (max_position_embeddings); 0: the file's, else 2048", 0),
    sdk::param_min("rope_theta", TSR_PARAM_FLOAT, "0", "RoPE base (rope_theta); 0: 10000", 0.0),
    sdk::param("rope_type", TSR_PARAM_STRING, "\"\"",
               "\"default\" or \"llama3\" (Llama 3.1+ frequency scaling); \"\": the file's, "
               "else default"),
    sdk::param_min("rope_factor", TSR_PARAM_FLOAT, "0", "llama3 rope: factor", 0.0),
    sdk::param_min("rope_low_freq_factor", TSR_PARAM_FLOAT, "0", "llama3 rope: low_freq_factor",
                   0.0),
    sdk::param_min("rope_high_freq_factor", TSR_PARAM_FLOAT, "0", "llama3 rope: high_freq_factor",
                   0.0),
    sdk::param_min("rope_original_max", TSR_PARAM_INT, "0",
                   "llama3 rope: original_max_position_embeddings", 0),
    sdk::param_min("rms_eps", TSR_PARAM_FLOAT, "0", "RMSNorm epsilon (rms_norm_eps); 0: 1e-6", 0.0),
    sdk::param("tie_embeddings", TSR_PARAM_BOOL, "false",
               "LM head tied to embed_tokens (tie_word_embeddings)"),
    sdk::param("attention_bias", TSR_PARAM_BOOL, "false",
               "q/k/v projections with biases (Qwen2; implied by Qwen2ForCausalLM)"),
    sdk::param("qk_norm", TSR_PARAM_BOOL, "false",
               "Per-head RMSNorm of q and k before RoPE (Qwen3; implied by Qwen3ForCausalLM)"),
    sdk::param("hf_config", TSR_PARAM_STRING, "\"\"",
               "A Hugging Face config.json: the architecture, random initial weights"),
    sdk::param("init_from", TSR_PARAM_STRING, "\"\"",
               "A Hugging Face model directory (config.json + model.safetensors): the "
               "architecture and the initial weights"),
    sdk::param("freeze", TSR_PARAM_STRING_ARRAY, "[]",
               "Parameter name patterns (* matches any run, ? one character) to freeze: no "
               "gradient, no optimizer state; e.g. [\"model.embed_tokens.weight\", "
               "\"model.layers.0.*\"]"),
    sdk::param("recompute", TSR_PARAM_BOOL, "false",
               "Keep only each layer's input and recompute its activations in backward"),
    sdk::param_choice("recompute_swiglu", "\"auto\"",
                      "without recompute: always = one SwiGLU output for all layers, computed "
                      "again in backward (less memory for an elementwise pass a layer); never = "
                      "each layer keeps its own; auto = always on GPUs, never on the CPU",
                      "auto|always|never"),
    sdk::param_min("init_std", TSR_PARAM_FLOAT, "0",
                   "std of the initial matrices; 0: config.json's initializer_range, else 0.02",
                   0.0),
    // LoRA (lora.hpp), PEFT's LoraConfig r, lora_alpha, lora_dropout, target_modules.
    sdk::param_min("lora.rank", TSR_PARAM_INT, "0",
                   "LoRA rank r; > 0 freezes every base weight and trains adapters A [r, in], "
                   "B [out, r] on lora.targets; 0: no LoRA",
                   0),
    sdk::param_min("lora.alpha", TSR_PARAM_FLOAT, "8.0",
                   "LoRA alpha (PEFT's lora_alpha): the adapters are scaled by alpha / rank", 0.0),
    sdk::param_range("lora.dropout", TSR_PARAM_FLOAT, "0.0",
                     "LoRA dropout on the adapters' input in training (PEFT's lora_dropout), in "
                     "[0, 1); the masks are keyed on the step, so a resumed run draws the same",
                     0.0, 1.0),
    tsr_param_decl{sizeof(tsr_param_decl), "lora.targets", TSR_PARAM_STRING_ARRAY,
                   "[\"q\", \"k\", \"v\", \"o\"]",
                   "Projections LoRA adapts: q, k, v, o (self_attn.*_proj), gate, up, down "
                   "(mlp.*_proj)",
                   0, 0.0, 0, 0.0, "q|k|v|o|gate|up|down"},
};

const tsr_model_vtable kVtable = sdk::model_vtable<Llama, build>();

const char *llama_init_weights(void *self) {
  const Llama *m = static_cast<const Llama *>(self);
  return m && !m->init_weights.empty() ? m->init_weights.c_str() : nullptr;
}

// LoRA's adapters are not in a base model's file: they keep their
// initialisers (A random, B zeros) when init_from's file lacks them.
int32_t llama_may_lack(void *self, size_t index) {
  const Llama *m = static_cast<const Llama *>(self);
  return m && m->lora.is_adapter(index) ? 1 : 0;
}

const tsr_ext_model_init_from kInitFrom = {tsr_ext_model_init_from_STRUCT_SIZE, llama_init_weights,
                                           llama_may_lack};
const tsr_ext_model_export_hf kExportHf = {
    tsr_ext_model_export_hf_STRUCT_SIZE,
    "transformers' LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM", export_hf};
const sdk::Extension kExtensions[] = {{TSR_EXT_MODEL_INIT_FROM, &kInitFrom},
                                      {TSR_EXT_MODEL_EXPORT_HF, &kExportHf}};

const void *llama_extension(const char *id) {
  return sdk::find_extension(kExtensions, id);
}

const tsr_plugin_descriptor kDescriptor = sdk::describe(
    TSR_KIND_MODEL, "llama", "1.0.0",
    "Llama 3.x / Qwen2 / Qwen3 decoder (Hugging Face names; RMSNorm, RoPE, GQA, SwiGLU)", kParams,
    TSR_DEVICE_CPU | TSR_DEVICE_CUDA, &kVtable, llama_extension);

}  // namespace

}  // namespace tessera::llama

TSR_SDK_PLUGIN_LIBRARY(&tessera::llama::kDescriptor)
