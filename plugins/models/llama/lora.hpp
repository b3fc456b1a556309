// LoRA in the llama plugin (`lora.rank` > 0), as PEFT's LoraConfig computes
// it: each targeted projection y = x W^T (+ b) becomes
//
//   y = x W^T (+ b) + s (x A^T) B^T,   s = lora.alpha / lora.rank,
//
// with A [rank, in] drawn as PEFT draws it (kaiming_uniform_, a = sqrt(5):
// uniform in +-1/sqrt(in)) and B [out, rank] zeros, so training starts at
// the base model. Every base weight is frozen (trainable = 0); the adapters
// alone train. They are parameters of their layer's group named as PEFT
// names them without its "base_model.model." prefix:
//   model.layers.<l>.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight
//   model.layers.<l>.mlp.{gate,up,down}_proj.lora_{A,B}.weight
// declared after the layer's own parameters, so ZeRO stages, offload and
// checkpoints carry them like any other parameter.
//
// The forward keeps u = x A^T [rows, rank] per layer and target (one set
// with recompute, refilled by the recomputed layer) for backward:
//   dB += s dy^T u,  du = s dy B,  dA += du^T x,  dx += du A.
// Everything runs through the ops table's matmul (CPU fp32, CUDA fp32 /
// bf16 / fp16).
//
// lora.dropout = p > 0 drops the adapters' input in training passes, as
// PEFT's lora_dropout does: x_d = x * keep / (1 - p) and u = x_d A^T, so
//   dA += du^T x_d,  dx += (du A) * keep / (1 - p).
// The mask is ABI 1.9's dropout op (Philox by element index), keyed on the
// run's per-rank seed and a stream made of the step's position (the host's
// step_position: steps completed, micro-batch), the layer and the target: a
// recomputed layer and a resumed run draw the same mask. The forward keeps
// x_d per layer and target (one set with recompute, refilled by the
// recomputed layer, as u), so backward reads it instead of drawing it
// again; du A goes through one scratch [rows, widest input]. Evaluation
// and generation do not drop.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <tessera/cpp/plugin.hpp>
#include <vector>

namespace tessera::llama {

// What LoRA may target, in `lora.targets`' words and PEFT's module order.
enum LoraTarget : uint32_t {
  kLoraQ,
  kLoraK,
  kLoraV,
  kLoraO,
  kLoraGate,
  kLoraUp,
  kLoraDown,
  kLoraTargets
};

inline constexpr const char *kLoraWords[kLoraTargets] = {"q", "k", "v", "o", "gate", "up", "down"};
// Hugging Face's module names (PEFT's target_modules) and their place in a layer.
inline constexpr const char *kLoraModules[kLoraTargets] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
inline constexpr const char *kLoraBlocks[kLoraTargets] = {
    "self_attn", "self_attn", "self_attn", "self_attn", "mlp", "mlp", "mlp"};

struct Lora {
  int64_t rank = 0;  // 0: off
  double alpha = 0, dropout = 0;
  float scale = 0;  // alpha / rank
  std::array<bool, kLoraTargets> on{};
  // Per layer and target: A's and B's parameter index (kAbsent when off).
  std::vector<std::array<std::array<uint32_t, 2>, kLoraTargets>> index;
  std::vector<bool> adapter;  // by parameter index: an A or a B
  // u per (set, target on) and the du scratch, [max rows, rank] each, in the
  // activations' dtype.
  sdk::Buffer act;
  size_t rows = 0, targets_on = 0;
  // Dropout: its key (the host's seed_for); x_d per (set, target on),
  // [rows, the target's input] each at drop_off[t] within a set of
  // drop_set elements, then the du A scratch [rows, widest targeted
  // input], in the activations' dtype; and the pass under way: whether it
  // drops, and its position (lora_begin_pass).
  uint64_t seed = 0;
  sdk::Buffer drop;
  int64_t drop_cols = 0;
  std::array<size_t, kLoraTargets> drop_off{};
  size_t drop_set = 0;
  bool dropping = false;
  uint64_t update = 0;
  uint32_t micro = 0;

  bool enabled() const { return rank > 0; }
  // The dropout stream of layer l's target t in this pass: the update's low
  // 29 bits, the micro-batch's and the layer's low 16, the target's 3.
  uint64_t stream(uint32_t l, uint32_t t) const {
    return ((update & 0x1fffffffULL) << 35) | (static_cast<uint64_t>(micro & 0xffffu) << 19) |
           (static_cast<uint64_t>(l & 0xffffu) << 3) | t;
  }
  bool is_adapter(size_t param) const { return param < adapter.size() && adapter[param]; }
  // The targets on, as lora.targets' words joined by commas.
  std::string targets_text() const;
};

}  // namespace tessera::llama
