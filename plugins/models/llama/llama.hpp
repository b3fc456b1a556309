// The llama model plugin: decoder-only transformers of the Llama family as
// Hugging Face's LlamaForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM
// compute them, with their parameter names and layouts ([out, in] linear
// weights), so a Hugging Face checkpoint loads and exports by name.
//
//   x_0     = embed_tokens[ids]
//   layer l:  h = rmsnorm(x_l) (input_layernorm)
//             q = h Wq^T (+ bq), k = h Wk^T (+ bk), v = h Wv^T (+ bv)  (Qwen2: biases)
//             q, k = rmsnorm per head (q_norm, k_norm)                  (Qwen3 only)
//             q, k = rope(q, k) at positions 0..T-1 of each sequence, or
//                    at the batch's positions (packed sequences, ABI 1.8)
//             r = x_l + o_proj(attention_gqa(q, k, v)), with packed
//                    sequences attention_packed (no attention across
//                    the examples the positions delimit)
//             x_{l+1} = r + down(silu(gate(rmsnorm(r))) * up(rmsnorm(r)))
//   logits  = rmsnorm(x_L) (model.norm) @ W^T, W = lm_head or embed_tokens (tied)
//   loss    = softmax cross-entropy against targets (targets < 0 ignored)
//
// The dataset gives int32 token windows, inputs [T] and targets [T] per
// sample; the model does not shift them. Any T up to max_seq at run time.
//
// Parameters (Hugging Face names):
//   group 0:      model.embed_tokens.weight [vocab, C]
//   group 1 + l:  model.layers.<l>.input_layernorm.weight [C]
//                 .self_attn.{q,k,v}_proj.weight [Hq*D | Hk*D, C] (.bias with attention_bias)
//                 .self_attn.o_proj.weight [C, Hq*D]
//                 .self_attn.{q,k}_norm.weight [D]               (qk_norm)
//                 .post_attention_layernorm.weight [C]
//                 .mlp.{gate,up}_proj.weight [F, C], .mlp.down_proj.weight [C, F]
//   group L + 1:  model.norm.weight [C], lm_head.weight [vocab, C] (untied only)
// Tied, group 0 serves the head too and stays live through forward
// (params_done(0) after the head), and its gradient is final only after
// the embedding backward, last (as the gpt2 plugin).
//
// Activations are allocated once at create for max_micro_batch sequences
// of max_seq tokens in the compute dtype; RMSNorm statistics and attention
// log-sum-exps are float32. With recompute = true only each layer's input
// is kept and backward recomputes one layer at a time into a shared set.
//
// Files: llama.hpp (this), hf_config.{hpp,cpp} (the architecture from TOML
// keys or a Hugging Face config.json, refusals, the safetensors header),
// create.cpp (llama_create), memory.cpp (activation plan, views),
// llama.cpp (forward, predict, backward, FLOPs), export_hf.cpp and
// plugin.cpp (config keys, vtable, descriptor); LoRA adapters in lora.hpp,
// lora.cpp (keys, parameters, compute) and lora_export.cpp (merge, PEFT).
#pragma once

#include <tessera/tessera.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <string>
#include <tessera/cpp/plugin.hpp>
#include <tessera/cpp/tensor.hpp>
#include <vector>

#include "lora.hpp"

namespace tessera::llama {

namespace sdk = tessera::sdk;
using sdk::Buffer;
using sdk::check;
using sdk::dtype_name;
using sdk::Error;
using sdk::same_dtype;
using sdk::shape_str;
using sdk::View;

// The architecture: what config.json (or the TOML keys) say.
struct Arch {
  std::string architecture = "LlamaForCausalLM";  // or Qwen2ForCausalLM, Qwen3ForCausalLM
  int64_t layers = 0, width = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0;
  int64_t vocab = 0, max_seq = 0;
  double rms_eps = 0;
  bool tie = false, attention_bias = false, qk_norm = false;
  tsr_rope_params rope{};
  double init_std = 0.02;
};

// Per-layer parameter kinds; a layer's index table maps each to its
// parameter index (kAbsent where the architecture has none).
enum LayerParam : uint32_t {
  kInNorm,
  kQ,
  kQBias,
  kK,
  kKBias,
  kV,
  kVBias,
  kO,
  kQNorm,
  kKNorm,
  kPostNorm,
  kGate,
  kUp,
  kDown,
  kLayerParams
};
inline constexpr uint32_t kAbsent = 0xffffffffu;
// The layer parameter each LoRA target adapts (lora.hpp's LoraTarget order).
inline constexpr LayerParam kLoraBase[kLoraTargets] = {kQ, kK, kV, kO, kGate, kUp, kDown};

struct Llama {
  static constexpr const char *kName = "llama";  // for messages
  const tsr_host *host = nullptr;
  const tsr_ops *ops = nullptr;
  DLDevice device{kDLCPU, 0};
  Arch a;
  int64_t max_batch = 0, data_T = 0;
  bool recompute = false;
  bool recompute_swiglu = false;  // model.recompute_swiglu, resolved (never with recompute)
  // ABI 1.12's swiglu_backward_out, where the host's ops table has it.
  bool swiglu_out_op() const {
    return TSR_HAS_FIELD(ops, tsr_ops, swiglu_backward_out) && ops->swiglu_backward_out;
  }
  std::string init_weights;  // init_from's safetensors ("" without)
  // init_from's directory, or hf_config's: the tokenizer files there go
  // with a Hugging Face export ("" without either).
  std::string source_dir;
  std::deque<std::string> names;
  std::vector<tsr_param_info> infos;
  uint32_t embed = 0, final_norm = 0, lm_head = kAbsent;
  std::vector<std::array<uint32_t, kLayerParams>> layer;  // parameter indices

  // Activation memory: offsets in elements of the compute dtype (act) or
  // float32 (stats); positions int32 [max_batch * max_seq].
  DLDataType adt = sdk::dtype_f32();
  size_t esize = 4;
  Buffer act, stats, pos;
  Buffer predict_f32;
  std::vector<int32_t> pos_host;
  int64_t pos_B = 0, pos_T = 0;  // what `pos` holds
  // The current batch's positions (ABI 1.8 packed sequences), or none.
  bool packed = false;
  DLTensor packed_pos{};
  struct Set {                                                // one layer's activations
    size_t h1, qraw, kraw, q, k, v, o, r, h2, gate, up, act;  // in act
    size_t rstd1, rstd2, rstdq, rstdk, lse;                   // in stats
  };
  std::vector<size_t> resid;  // x_0 .. x_L
  std::vector<Set> sets;      // L, or 1 with recompute
  size_t hf = 0, logits = 0, dres = 0, dsm = 0, dq = 0, dk = 0, dv = 0, dout = 0, dqraw = 0,
         dkraw = 0, dgate = 0, dup = 0, dact = 0, discard = 0;  // in act
  size_t rstdf = 0;                                             // in stats
  size_t act_elems = 0, stats_elems = 0;

  bool ready = false;
  int64_t ready_n = 0, ready_T = 0;
  // This backward's beta for every weight gradient (each has one
  // contribution a pass): 0 where the host says they began at zero.
  float wgrad_beta = 1.0f;
  Lora lora;  // lora.rank > 0: adapters on the targeted projections (lora.hpp)
  // `freeze`: the lowest group (backward stage) holding a trainable
  // parameter; below it backward computes nothing. L + 2 when all is frozen.
  int64_t lowest_trainable_stage = 0;

  uint32_t L() const { return static_cast<uint32_t>(a.layers); }
  int64_t C() const { return a.width; }
  int64_t QD() const { return a.heads * a.head_dim; }
  int64_t KD() const { return a.kv_heads * a.head_dim; }
  uint32_t P(uint32_t l, LayerParam p) const { return layer[l][p]; }
  bool has(uint32_t l, LayerParam p) const { return layer[l][p] != kAbsent; }
  bool trainable(uint32_t i) const { return infos[i].trainable != 0; }
  // Whether backward runs stage `stage` (0 embedding, l + 1 layer l, L + 1
  // the head): some parameter at or below it trains.
  bool runs(int64_t stage) const { return stage >= lowest_trainable_stage; }

  // ---- memory (memory.cpp) ----
  void plan_memory();
  void allocate(DLDataType dtype);
  void ensure_dtype(const DLTensor &p);
  View A(size_t off, std::initializer_list<int64_t> shape) const {
    return View(act.get(), off * esize, device, adt, shape);
  }
  View S(size_t off, std::initializer_list<int64_t> shape) const {
    return View(stats.get(), off * 4, device, sdk::dtype_f32(), shape);
  }
  View positions(int64_t B, int64_t T);
  // The positions rope and attention use: the batch's, else positions(B, T).
  View token_positions(int64_t B, int64_t T);
  DLTensor view_of(tsr_step *step, uint32_t index, bool grad) const;
  DLTensor param(tsr_step *step, uint32_t index) const { return view_of(step, index, false); }
  DLTensor grad(tsr_step *step, uint32_t index) const { return view_of(step, index, true); }
  // A norm weight's gradient [n] for rmsnorm_backward; for a frozen one
  // empty (grad_or_null: NULL) where the host skips it (ABI 1.11), else a
  // zeroed scratch the op adds into.
  View norm_grad(tsr_step *step, uint32_t index, int64_t n) const;
  static DLTensor *grad_or_null(View &v) {
    DLTensor *t = v.get();
    return t->data ? t : nullptr;
  }
  void params_done(tsr_step *step, uint32_t group) const {
    if (TSR_HAS_FIELD(host, tsr_host, params_done) && host->params_done)
      check(host->params_done(step, group));
  }

  // ---- compute (llama.cpp) ----
  int64_t check_batch(const tsr_batch *batch, bool with_targets = true);
  void check_positions(const tsr_batch *batch, int64_t n, int64_t T);
  void attention(const View &q4, const View &k4, const View &v4, View &pos, View &o4, View &lse);
  void layer_forward(tsr_step *step, uint32_t l, const Set &s, int64_t B, int64_t T, bool out);
  DLTensor trunk(tsr_step *step, const DLTensor &inputs, int64_t B, int64_t T);
  DLTensor head_weight(tsr_step *step, const DLTensor &embed_view);
  void forward(tsr_step *step, const tsr_batch *batch, int32_t training, tsr_forward_result *out);
  void predict(tsr_step *step, const tsr_batch *batch, DLTensor *out);
  void attention_backward(tsr_step *step, uint32_t l, const Set &s, int64_t B, int64_t T);
  void layer_backward(tsr_step *step, uint32_t l, const Set &s, int64_t B, int64_t T);
  void head_backward(tsr_step *step, int64_t B, int64_t T, float loss_scale);
  void backward(tsr_step *step, const tsr_batch *batch, float loss_scale);
  double flops_per_sample() const;

  void project(tsr_step *step, uint32_t l, LayerParam p, LayerParam bias, View &x, View &y,
               int64_t R);
  void project_dx(tsr_step *step, uint32_t l, LayerParam p, View &dy, View &x, View &dx, int64_t R,
                  float beta);

  // ---- LoRA adapters (lora.cpp) ----
  bool lora_forward(tsr_step *step, uint32_t l, LayerParam p, View &x, View *y, int64_t R,
                    float beta);
  bool lora_backward(tsr_step *step, uint32_t l, LayerParam p, View &dy, View &x, View &dx,
                     int64_t R, float beta);
};

Llama *build(const tsr_host *host, const tsr_config *cfg, const tsr_model_init *init);
tsr_status export_hf(void *self, const tsr_export_args *args);
// The export's one line for the user into args.summary (export_hf.cpp).
void export_summary(const tsr_export_args &args, const std::string &line);

// LoRA (lora.cpp): the lora.* keys, layer l's adapters declared after its
// own parameters, the base frozen, u's memory, the start-up line.
void lora_configure(Llama &m, const sdk::Config &c);
void lora_declare(Llama &m, uint32_t l);
void lora_freeze_base(Llama &m);
void lora_allocate(Llama &m);
void lora_begin_pass(Llama &m, tsr_step *step, bool training);
std::string lora_summary(const Llama &m);
// LoRA in the export (lora_export.cpp): parameter i's values as the export
// writes them (merged with its adapter under TSR_EXPORT_MERGED; `scratch`
// holds them then), and the PEFT adapter directory.
int64_t export_adapters(const Llama &m, const tsr_export_args &args);
const float *lora_export_values(const Llama &m, const tsr_export_args &args, size_t i,
                                std::vector<float> &scratch);
void lora_write_peft(const Llama &m, const tsr_export_args &args);

}  // namespace tessera::llama
