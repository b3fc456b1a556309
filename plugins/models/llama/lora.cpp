// LoRA in the llama plugin (lora.hpp): its config keys read and checked, the
// adapters declared and the base frozen, their activation memory, and the
// adapters' share of each targeted projection's forward and backward.
#include "lora.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "llama.hpp"

namespace tessera::llama {

namespace {

// The target a layer parameter is, or kLoraTargets for one LoRA never adapts.
LoraTarget target_of(LayerParam p) {
  uint32_t t = 0;
  while (t < kLoraTargets && kLoraBase[t] != p) ++t;
  return static_cast<LoraTarget>(t);
}

// The target whose adapter this run has on layer parameter p, or
// kLoraTargets where p has none (LoRA off, never adapted, or not chosen).
LoraTarget adapted(const Lora &lora, LayerParam p) {
  const LoraTarget t = target_of(p);
  return lora.enabled() && t != kLoraTargets && lora.on[t] ? t : kLoraTargets;
}

// A target's [out, in]: what its base weight is.
std::array<int64_t, 2> target_shape(const Llama &m, LoraTarget t) {
  const int64_t C = m.C(), F = m.a.intermediate;
  switch (t) {
    case kLoraQ:
      return {m.QD(), C};
    case kLoraK:
    case kLoraV:
      return {m.KD(), C};
    case kLoraO:
      return {C, m.QD()};
    case kLoraGate:
    case kLoraUp:
      return {F, C};
    default:
      return {C, F};
  }
}

uint32_t declare_adapter(Llama &m, std::string name, int64_t rows, int64_t cols, uint32_t group,
                         tsr_init rule, float bound) {
  m.names.push_back(std::move(name));
  tsr_param_info p = sdk::make<tsr_param_info>();
  p.name = m.names.back().c_str();
  p.ndim = 2;
  p.shape[0] = rows;
  p.shape[1] = cols;
  p.group = group;
  p.init = rule;
  p.init_a = -bound;
  p.init_b = bound;
  p.trainable = 1;
  p.decay = 1;  // matrices, as Hugging Face's Trainer decays every weight but biases and norms
  m.infos.push_back(p);
  return static_cast<uint32_t>(m.infos.size() - 1);
}

}  // namespace

std::string Lora::targets_text() const {
  std::string s;
  for (uint32_t t = 0; t < kLoraTargets; ++t)
    if (on[t]) {
      if (!s.empty()) s += ',';
      s += kLoraWords[t];
    }
  return s;
}

void lora_configure(Llama &m, const sdk::Config &c) {
  Lora &lo = m.lora;
  lo.rank = c.get_int("lora.rank");
  lo.alpha = c.get_float("lora.alpha");
  lo.dropout = c.get_float("lora.dropout");
  const std::vector<std::string> targets = c.get_string_array("lora.targets");
  if (lo.rank == 0) return;
  // As the op takes it (float): 0.99999999 would round to 1.
  if (!(lo.dropout >= 0 && static_cast<float>(lo.dropout) < 1.0f))
    throw Error(TSR_ERR_CONFIG, "llama: model.lora.dropout = " + std::to_string(lo.dropout) +
                                    " must lie in [0, 1) (PEFT's lora_dropout)");
  if (lo.dropout > 0) {
    if (!TSR_HAS_FIELD(m.ops, tsr_ops, dropout) || !m.ops->dropout ||
        !TSR_HAS_FIELD(m.host, tsr_host, step_position) || !m.host->step_position)
      throw Error(TSR_ERR_UNSUPPORTED,
                  "llama: model.lora.dropout = " + std::to_string(lo.dropout) +
                      " needs the host's step_position and its ops table's dropout (ABI 1.9); "
                      "this host (ABI " +
                      std::to_string(m.host->abi_major) + "." + std::to_string(m.host->abi_minor) +
                      ") or its device's ops lack one: set model.lora.dropout = 0.0 or use a "
                      "newer tessera");
    lo.seed = m.host->seed_for(m.host->ctx, "llama.lora.dropout", 1);
  }
  if (!(lo.alpha > 0) || !std::isfinite(lo.alpha))
    throw Error(TSR_ERR_CONFIG,
                "llama: model.lora.alpha must be a positive number (PEFT's "
                "lora_alpha; the adapters are scaled by alpha / rank)");
  if (targets.empty())
    throw Error(TSR_ERR_CONFIG,
                "llama: model.lora.targets is empty; name the projections to "
                "adapt, e.g. [\"q\", \"k\", \"v\", \"o\"]");
  for (const std::string &w : targets) {
    bool known = false;
    for (uint32_t t = 0; t < kLoraTargets; ++t)
      if (w == kLoraWords[t]) lo.on[t] = known = true;
    if (!known)
      throw Error(TSR_ERR_CONFIG, "llama: model.lora.targets: '" + w +
                                      "' is not one of q, k, v, o, gate, up, down");
  }
  lo.scale = static_cast<float>(lo.alpha / static_cast<double>(lo.rank));
  for (uint32_t t = 0; t < kLoraTargets; ++t) lo.targets_on += lo.on[t] ? 1 : 0;
}

// Layer l's adapters, after its own parameters (its group, l + 1).
void lora_declare(Llama &m, uint32_t l) {
  Lora &lo = m.lora;
  if (!lo.enabled()) return;
  if (lo.index.size() <= l) lo.index.resize(l + 1);
  for (auto &ab : lo.index[l]) ab = {kAbsent, kAbsent};
  const std::string pre = "model.layers." + std::to_string(l) + ".";
  for (uint32_t t = 0; t < kLoraTargets; ++t) {
    if (!lo.on[t]) continue;
    const auto [out, in] = target_shape(m, static_cast<LoraTarget>(t));
    const std::string mod = pre + kLoraBlocks[t] + "." + kLoraModules[t];
    // kaiming_uniform_(a = sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain *
    // sqrt(3 / fan_in) = 1 / sqrt(in).
    const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(in)));
    lo.index[l][t][0] =
        declare_adapter(m, mod + ".lora_A.weight", lo.rank, in, l + 1, TSR_INIT_UNIFORM, bound);
    lo.index[l][t][1] =
        declare_adapter(m, mod + ".lora_B.weight", out, lo.rank, l + 1, TSR_INIT_ZEROS, 0.0f);
  }
}

// With LoRA every parameter but the adapters is frozen; `freeze` patterns
// then apply on top (they may freeze adapters too).
void lora_freeze_base(Llama &m) {
  Lora &lo = m.lora;
  if (!lo.enabled()) return;
  lo.adapter.assign(m.infos.size(), false);
  for (const auto &layer : lo.index)
    for (const auto &ab : layer)
      for (uint32_t i : ab)
        if (i != kAbsent) lo.adapter[i] = true;
  for (size_t i = 0; i < m.infos.size(); ++i)
    if (!lo.adapter[i]) m.infos[i].trainable = 0;
}

// Whether the ops put du A through the dropout mask into dx in one pass
// (ABI 1.10's lowrank_dropout) rather than through a scratch.
static bool fused_drop(const Llama &m) {
  return TSR_HAS_FIELD(m.ops, tsr_ops, lowrank_dropout) && m.ops->lowrank_dropout;
}

void lora_allocate(Llama &m) {
  Lora &lo = m.lora;
  lo.act.reset();
  lo.drop.reset();
  if (!lo.enabled()) return;
  lo.rows = static_cast<size_t>(m.max_batch * m.a.max_seq);
  const size_t sets = m.sets.size() * lo.targets_on + 1;  // + du
  lo.act = sdk::Buffer(m.host, m.device, sets * lo.rows * static_cast<size_t>(lo.rank) * m.esize,
                       TSR_MEM_ACTIVATIONS);
  if (lo.dropout == 0) return;
  lo.drop_cols = 0;
  lo.drop_set = 0;
  for (uint32_t t = 0; t < kLoraTargets; ++t) {
    if (!lo.on[t]) continue;
    const int64_t cols = target_shape(m, static_cast<LoraTarget>(t))[1];
    lo.drop_cols = std::max(lo.drop_cols, cols);
    lo.drop_off[t] = lo.drop_set;
    lo.drop_set += lo.rows * static_cast<size_t>(cols);
  }
  // du A's scratch only where the ops cannot put it through the mask
  // themselves (lowrank_dropout, ABI 1.10).
  const size_t scratch = fused_drop(m) ? 0 : lo.rows * static_cast<size_t>(lo.drop_cols);
  const size_t elems = m.sets.size() * lo.drop_set + scratch;
  lo.drop = sdk::Buffer(m.host, m.device, elems * m.esize, TSR_MEM_ACTIVATIONS);
}

// Whether this pass drops (a training pass with lora.dropout > 0) and where
// training stands, for the masks' streams.
void lora_begin_pass(Llama &m, tsr_step *step, bool training) {
  Lora &lo = m.lora;
  lo.dropping = lo.enabled() && lo.dropout > 0 && training;
  if (lo.dropping) check(m.host->step_position(step, &lo.update, &lo.micro));
}

std::string lora_summary(const Llama &m) {
  const Lora &lo = m.lora;
  if (!lo.enabled()) return "";
  double n = 0;
  for (size_t i = 0; i < m.infos.size(); ++i)
    if (lo.is_adapter(i)) n += static_cast<double>(m.infos[i].shape[0] * m.infos[i].shape[1]);
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "llama: LoRA rank %lld, alpha %g (scale %g), dropout %g on %s: %.0f adapter "
                "parameters train, the base is frozen",
                static_cast<long long>(lo.rank), lo.alpha, static_cast<double>(lo.scale),
                lo.dropout, lo.targets_text().c_str(), n);
  return buf;
}

// ---- compute ----------------------------------------------------------------

// u of layer l's target t in the layer's activation set: [R, rank].
static View lora_u(const Llama &m, uint32_t l, LoraTarget t, int64_t R) {
  const Lora &lo = m.lora;
  size_t slot = (m.recompute ? 0 : l) * lo.targets_on;
  for (uint32_t k = 0; k < t; ++k) slot += lo.on[k] ? 1 : 0;
  return View(lo.act.get(), slot * lo.rows * static_cast<size_t>(lo.rank) * m.esize, m.device,
              m.adt, {R, lo.rank});
}

static View lora_du(const Llama &m, int64_t R) {
  const Lora &lo = m.lora;
  const size_t slot = m.sets.size() * lo.targets_on;
  return View(lo.act.get(), slot * lo.rows * static_cast<size_t>(lo.rank) * m.esize, m.device,
              m.adt, {R, lo.rank});
}

// x_d [R, cols] of layer l's target t, kept from forward for backward.
static View lora_xd(const Llama &m, uint32_t l, LoraTarget t, int64_t R, int64_t cols) {
  const Lora &lo = m.lora;
  const size_t at = (m.recompute ? 0 : l) * lo.drop_set + lo.drop_off[t];
  return View(lo.drop.get(), at * m.esize, m.device, m.adt, {R, cols});
}

// The scratch [R, cols] of du A in backward, before its dropout.
static View lora_scratch(const Llama &m, int64_t R, int64_t cols) {
  return View(m.lora.drop.get(), m.sets.size() * m.lora.drop_set * m.esize, m.device, m.adt,
              {R, cols});
}

// out = beta * out + dropout(in) with layer l's target t's mask.
static void lora_dropout(const Llama &m, uint32_t l, LoraTarget t, View &in, float beta,
                         View &out) {
  check(m.ops->dropout(m.host->ctx, in.get(), static_cast<float>(m.lora.dropout), m.lora.seed,
                       m.lora.stream(l, t), beta, out.get()));
}

// The adapter's input [R, cols]: x, or in a pass that drops x_d = dropout(x),
// drawn in forward and kept for backward (`draw` false: read back).
static View lora_input(const Llama &m, uint32_t l, LoraTarget t, View &x, int64_t R, int64_t cols,
                       bool draw) {
  if (!m.lora.dropping) return x;
  View xd = lora_xd(m, l, t, R, cols);
  if (draw) lora_dropout(m, l, t, x, 0.0f, xd);
  return xd;
}

// u = x A^T (x_d A^T when the pass drops), and with `y` y = s u B^T +
// beta y: beta 0 before the base projection (which then adds into y), 1
// after it. Without y (a recompute that stops before the down projection)
// only u, which backward reads. False, doing nothing, where the target has
// no adapter.
bool Llama::lora_forward(tsr_step *step, uint32_t l, LayerParam p, View &x, View *y, int64_t R,
                         float beta) {
  const LoraTarget t = adapted(lora, p);
  if (t == kLoraTargets) return false;
  tsr_host_ctx *ctx = host->ctx;
  View u = lora_u(*this, l, t, R);
  DLTensor wa = param(step, lora.index[l][t][0]);
  View in = lora_input(*this, l, t, x, R, wa.shape[1], true);
  check(ops->matmul(ctx, in.get(), 0, &wa, 1, u.get(), 1.0f, 0.0f));
  if (!y) return true;
  DLTensor wb = param(step, lora.index[l][t][1]);
  check(ops->matmul(ctx, u.get(), 0, &wb, 1, y->get(), lora.scale, beta));
  return true;
}

// The adapter's backward for the projection y = f(x): dy its output's
// gradient, dx its input's, which gets du A + beta dx (beta 0: the first
// share of dx, the base weight's then added into it); with dropout dA comes
// from x_d and du A reaches dx through the mask. False, doing nothing,
// where the target has no adapter.
bool Llama::lora_backward(tsr_step *step, uint32_t l, LayerParam p, View &dy, View &x, View &dx,
                          int64_t R, float beta) {
  const LoraTarget t = adapted(lora, p);
  if (t == kLoraTargets) return false;
  tsr_host_ctx *ctx = host->ctx;
  const uint32_t ia = lora.index[l][t][0], ib = lora.index[l][t][1];
  View u = lora_u(*this, l, t, R), du = lora_du(*this, R);
  if (trainable(ib)) {
    DLTensor gb = grad(step, ib);
    check(ops->matmul(ctx, dy.get(), 1, u.get(), 0, &gb, lora.scale, wgrad_beta));
  }
  DLTensor wb = param(step, ib), wa = param(step, ia);
  check(ops->matmul(ctx, dy.get(), 0, &wb, 0, du.get(), lora.scale, 0.0f));
  const int64_t in_cols = wa.shape[1];
  if (trainable(ia)) {
    View in = lora_input(*this, l, t, x, R, in_cols, false);
    DLTensor ga = grad(step, ia);
    check(ops->matmul(ctx, du.get(), 1, in.get(), 0, &ga, 1.0f, wgrad_beta));
  }
  if (!lora.dropping) {
    check(ops->matmul(ctx, du.get(), 0, &wa, 0, dx.get(), 1.0f, beta));
    return true;
  }
  if (fused_drop(*this)) {  // dx = mask * (du A) / (1 - p) + beta dx, no scratch
    View dx2(*dx.get(), {R, in_cols});
    check(ops->lowrank_dropout(ctx, du.get(), &wa, static_cast<float>(lora.dropout), lora.seed,
                               lora.stream(l, t), beta, dx2.get()));
    return true;
  }
  View dxd = lora_scratch(*this, R, in_cols);
  check(ops->matmul(ctx, du.get(), 0, &wa, 0, dxd.get(), 1.0f, 0.0f));
  lora_dropout(*this, l, t, dxd, beta, dx);
  return true;
}

}  // namespace tessera::llama
