// The gpt2 model plugin: GPT-2 as Hugging Face's GPT2LMHeadModel computes it,
// with its parameter names and layouts, so a Hugging Face checkpoint loads
// and exports as a plain copy by name.
//
//   x_0     = wte[ids] + wpe[0..T)                           (embeddings)
//   block l:  r   = x_l + c_proj(attn(c_attn(ln_1(x_l))))     (pre-LayerNorm)
//             x_{l+1} = r + mlp.c_proj(gelu_tanh(c_fc(ln_2(r))))
//   logits  = ln_f(x_L) @ wte^T                                (LM head tied to wte)
//   loss    = softmax cross-entropy of logits[b, t] against targets[b, t]
//
// The dataset gives token windows: inputs int32 [T] and targets int32 [T]
// per sample (targets < 0 are ignored); the model does not shift them, the
// dataset does. Any T up to `context` is accepted at run time.
//
// predict (ABI 1.1, for generation) runs the same forward on inputs alone
// and returns float32 logits [B, vocab] of each sequence's last position
// only: ln_f and the LM head run on those B rows, over the real vocabulary.
//
// Parameters (Hugging Face names, their Conv1D layout [in, out] kept as is,
// so the forward is x[rows, in] @ W[in, out] with no transpose):
//   group 0:      transformer.wte.weight [padded_vocab, C]   (see below)
//                 transformer.wpe.weight [context, C]
//   group 1 + l:  transformer.h.<l>.ln_1.{weight,bias} [C]
//                 transformer.h.<l>.attn.c_attn.weight [C, 3C], .bias [3C]
//                 transformer.h.<l>.attn.c_proj.weight [C, C], .bias [C]
//                 transformer.h.<l>.ln_2.{weight,bias} [C]
//                 transformer.h.<l>.mlp.c_fc.weight [C, 4C], .bias [4C]
//                 transformer.h.<l>.mlp.c_proj.weight [4C, C], .bias [C]
//   group L + 1:  transformer.ln_f.{weight,bias} [C]
// There is no lm_head.weight: the head is wte (Hugging Face ties them too).
//
// Vocabulary padding: wte has padded_vocab = round_up(vocab, vocab_pad_to)
// rows (GPT-2's 50257 -> 50304) so the LM head's matmul has a friendly
// shape. Rows at or past `vocab` are padding: cross_entropy's valid_classes
// keeps them out of the softmax and gives them zero gradient, and no token id
// reaches them: they never get a gradient (weight decay may shrink them) and
// never change a result. "transformer.wte.weight" is the one parameter whose
// declared shape differs from Hugging Face's [vocab, C]: an export for
// Hugging Face keeps its first `vocab` rows (`tessera ckpt export` trims
// them: engine/ckpt/export_hf.cpp), and init_from's loader fills
// the first rows of a [vocab, C] tensor and leaves the padding rows at their
// initialiser (engine/train/init_from.cpp).
//
// The tied wte and ZeRO stage 3: wte is used first (embedding) and last (LM
// head) in forward, and its gradient gets contributions first (head) and
// last (embedding backward) in backward. So group 0 stays live through the
// whole forward: its view, taken once before the embedding, is reused for
// the head and params_done(0) comes after the head (asking for the group
// again at the end would make stage 3 gather it again, and prefetch block 0
// for nothing). In backward the groups finish in the order L+1, L, ..., 1, 0:
// group 0's gradient is final only after the embedding backward, the very
// last thing.
//
// Activations live in memory allocated once at create for max_micro_batch
// sequences of `context` tokens, in the compute dtype (the parameter views'
// dtype: float32 on the CPU, bfloat16/float16 in mixed-precision CUDA runs);
// LayerNorm statistics and attention log-sum-exps are float32, token ids
// int32. With recompute = true only each block's input (the residual stream)
// is kept, and backward recomputes one block's activations at a time into a
// single shared set, before its backward: the same ops on the same inputs,
// so the gradients are bitwise those of recompute = false.
// recompute_gelu = true keeps only the MLP's pre-activation c_fc(ln_2(r)):
// its GELU, [B*T, 4C] per block (a quarter of a block's activations), is
// written into backward's shared scratch in forward and recomputed there
// (one element-wise pass) before c_proj's weight gradient, as
// torch.compile's partitioner does.
//
// With `fused` (the default) the step uses ABI 1.3's fused ops where the
// host has them: each residual add inside the layernorm that reads the sum
// (add_layernorm_forward; a block's output add happens in the next block's
// ln_1, the last one in ln_f's), every bias gradient inside its weight
// gradient's matmul (matmul_bias_grad), and GELU's backward inside the
// matmul that produces c_fc's output gradient (matmul_act_backward). The
// training forward's cross_entropy also writes the loss gradient over the
// logits (unscaled; backward's LM-head matmuls apply loss_scale), so
// backward reads the logits once fewer. `fused = false`, or a host whose
// table lacks an op, runs the op sequences as before; on the CPU both give
// the same bits (for a power-of-two loss scale; else the same to rounding).
//
// The plugin's files: gpt2.hpp (this: the declarations they share), create.cpp
// (gpt2_create: config keys, dimensions, parameters, freeze, init_from's
// checks), hf_checkpoint.{hpp,cpp} (init_from's config.json and safetensors
// header), memory.cpp (activation memory, parameter and gradient views),
// gpt2.cpp (forward, predict, backward, FLOPs) and plugin.cpp (the C ABI:
// vtable, config keys, descriptor).
#pragma once

#include <tessera/tessera.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <string>
#include <tessera/cpp/plugin.hpp>
#include <tessera/cpp/tensor.hpp>
#include <vector>

namespace tessera::gpt2 {

namespace sdk = tessera::sdk;
using sdk::Buffer;
using sdk::check;
using sdk::dtype_name;
using sdk::Error;
using sdk::same_dtype;
using sdk::shape_str;
using sdk::View;

inline constexpr float kLayerNormEps = 1e-5f;  // GPT-2's layer_norm_epsilon

// Per-block parameter indices, relative to the block's first.
enum BlockParam : uint32_t {
  kLn1W,
  kLn1B,
  kQkvW,
  kQkvB,
  kAttnProjW,
  kAttnProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kMlpProjW,
  kMlpProjB,
  kBlockParams
};
inline constexpr uint32_t kWte = 0, kWpe = 1, kFirstBlock = 2;

inline bool is_i32(DLDataType t) {
  return same_dtype(t, sdk::dtype_i32());
}

// Model dimensions.
struct Dims {
  int64_t layers = 0, heads = 0, width = 0, context = 0, vocab = 0, padded_vocab = 0;
};

struct Gpt2 {
  static constexpr const char *kName = "gpt2";  // for messages
  const tsr_host *host = nullptr;
  const tsr_ops *ops = nullptr;
  DLDevice device{kDLCPU, 0};
  Dims d;
  int64_t max_batch = 0, data_T = 0;
  bool recompute = false;
  bool recompute_gelu = false;
  // init_from's safetensors file ("" without init_from): the engine asks for
  // it through TSR_EXT_MODEL_INIT_FROM and overlays its tensors by name.
  std::string init_weights;
  double init_std = 0.02;  // [model] init_std, for the export's config.json
  // ABI 1.3's fused ops, each used where the host's table has it and the
  // config's `fused` allows (create.cpp); else the 1.1 sequence it fuses.
  bool fuse_add_ln = false, fuse_bias_grad = false, fuse_act_grad = false;
  // ABI 1.4's layernorm_backward_sum: the attention and MLP output
  // projections' bias gradients from the layernorm backward above them.
  bool fuse_ln_sum = false;
  // The loss gradient written by the training forward's cross_entropy
  // (any host; `fused` again), rather than a second pass in backward.
  bool ce_grad_in_forward = false;
  bool ce_grad_ready = false;     // the logits hold the unscaled gradient
  float wgrad_beta = 1.0f;        // this backward's first_grad_beta
  std::deque<std::string> names;  // parameter names; infos point into them
  std::vector<tsr_param_info> infos;
  // Backward runs stage s (0 embeddings, 1..L blocks, L+1 ln_f) only when
  // some parameter at a stage <= s is trainable: below the lowest trainable
  // stage no gradient is needed. L+2 when nothing is trainable.
  int64_t lowest_trainable_stage = 0;

  // Activation memory, in elements of the compute dtype (act) or float32
  // (stats), carved out of two allocations.
  DLDataType adt = sdk::dtype_f32();
  size_t esize = 4;
  Buffer act, stats;
  Buffer predict_f32;  // predict's float32 logits on the device (16-bit runs only)
  struct Set {         // one block's activations
    size_t ln1, qkv, atty, r2, ln2, fch, fchg;  // in act
    size_t m1, s1, m2, s2, lse;                 // in stats
  };
  std::vector<size_t> resid;  // x_0 .. x_L in act
  std::vector<Set> sets;      // L sets, or 1 with recompute
  size_t lnf = 0, logits = 0, dres = 0, dsmall = 0, dbig = 0, discard = 0;  // in act
  size_t lnf_m = 0, lnf_s = 0;                                              // in stats
  size_t act_elems = 0, stats_elems = 0;

  // What backward may rely on: a training forward of n sequences of T.
  bool ready = false;
  int64_t ready_n = 0, ready_T = 0;

  uint32_t L() const { return static_cast<uint32_t>(d.layers); }
  int64_t C() const { return d.width; }
  uint32_t block_param(uint32_t l, BlockParam p) const {
    return kFirstBlock + kBlockParams * l + p;
  }
  uint32_t lnf_w() const { return kFirstBlock + kBlockParams * L(); }
  uint32_t lnf_b() const { return lnf_w() + 1; }
  bool trainable(uint32_t i) const { return infos[i].trainable != 0; }

  // ---- memory (memory.cpp) --------------------------------------------------

  void plan_memory();
  void allocate(DLDataType dtype);
  void ensure_dtype(const DLTensor &p);

  // Activations in the compute dtype, float32 statistics.
  View A(size_t off, std::initializer_list<int64_t> shape) const {
    return View(act.get(), off * esize, device, adt, shape);
  }
  View S(size_t off, std::initializer_list<int64_t> shape) const {
    return View(stats.get(), off * 4, device, sdk::dtype_f32(), shape);
  }
  // q, k or v (which = 0, 1, 2) of a fused [B, T, 3, H, D] buffer at `off`.
  View qkv_part(size_t off, int64_t B, int64_t T, int which) const {
    const int64_t C = d.width, H = d.heads, D = C / H;
    return View(act.get(), (off + static_cast<size_t>(which * C)) * esize, device, adt,
                {B, T, H, D}, {T * 3 * C, 3 * C, D, 1});
  }

  // ---- parameters (memory.cpp) ----------------------------------------------

  DLTensor view_of(tsr_step *step, uint32_t index, bool grad) const;
  DLTensor param(tsr_step *step, uint32_t index) const { return view_of(step, index, false); }
  DLTensor grad(tsr_step *step, uint32_t index) const { return view_of(step, index, true); }
  View grad_or_discard(tsr_step *step, uint32_t index, int which);

  void params_done(tsr_step *step, uint32_t group) const {
    if (TSR_HAS_FIELD(host, tsr_host, params_done) && host->params_done)
      check(host->params_done(step, group));
  }

  // ---- batch, forward, predict, backward, FLOPs (gpt2.cpp) ------------------

  int64_t check_batch(const tsr_batch *batch, bool with_targets = true) const;
  void block_forward(tsr_step *step, uint32_t l, const Set &s, int64_t B, int64_t T, bool out,
                     const Set *prev = nullptr);
  const Set *pending_residual() const;
  DLTensor trunk(tsr_step *step, const DLTensor &inputs, int64_t B, int64_t T);
  void forward(tsr_step *step, const tsr_batch *batch, int32_t training, tsr_forward_result *out);
  void check_logits(const DLTensor *out, int64_t B) const;
  void predict(tsr_step *step, const tsr_batch *batch, DLTensor *out);
  void weight_grads(tsr_step *step, uint32_t l, BlockParam wp, View x, View dy,
                    bool bias_done = false);
  void norm_backward(tsr_step *step, View &dy, View &x, uint32_t w_index, View &m, View &s,
                     View &dres, int64_t below_bias);
  void block_backward(tsr_step *step, uint32_t l, const Set &s, int64_t B, int64_t T);
  void backward(tsr_step *step, const tsr_batch *batch, float loss_scale);
  double flops_per_sample() const;
};

// Creates the model from its config, the run and the dataset (create.cpp);
// throws sdk::Error.
Gpt2 *build(const tsr_host *host, const tsr_config *cfg, const tsr_model_init *init);

// TSR_EXT_MODEL_EXPORT_HF's write (export_hf.cpp).
tsr_status export_hf(void *self, const tsr_export_args *args);

}  // namespace tessera::gpt2
