// The gpt2 model's compute, through the host's ops (gpt2.hpp describes the
// model, its parameters and its activations): the batch checks, forward
// (embeddings, blocks, ln_f, the tied LM head and the loss), predict's
// last-position logits, backward stage by stage, and the FLOPs per sample.
#include "gpt2.hpp"

#include <cmath>
#include <cstdint>
#include <string>

namespace tessera::gpt2 {

// ---- batch ------------------------------------------------------------------

// Checks the batch and returns its sequence length. predict passes
// with_targets = false: its targets may be absent and are not read.
int64_t Gpt2::check_batch(const tsr_batch *batch, bool with_targets) const {
  // ABI 1.8 packed sequences: gpt2 would attend across the examples.
  if (batch && batch->size > 0 && TSR_HAS_FIELD(batch, tsr_batch, positions) &&
      batch->positions.data)
    throw Error(TSR_ERR_UNSUPPORTED,
                "gpt2: the batch holds packed sequences (positions, the tokens dataset's pack = "
                "true); gpt2 does not keep attention inside each example: use pack = false, or "
                "the llama model");
  return sdk::check_token_batch("gpt2", batch, with_targets, max_batch, device, d.context,
                                "context");
}

// ---- forward ----------------------------------------------------------------

// Block l from its input x_l (resid[l]) into set `s`; with `out` the block
// output x_{l+1} goes to resid[l + 1] (a recompute in backward skips it).
//
// With the fused residual (fuse_add_ln) a residual add happens in the
// layernorm that reads its sum: r = x_l + attn in ln_2's, and the block's
// output add x_{l+1} = r + mlp in the next block's ln_1 (or ln_f's): resid
// [l + 1] is left holding the MLP's output alone, and `prev`, the previous
// block's set, says resid[l] is in that state (its r2 is the other term);
// the add writes x_l back into resid[l] before anything else reads it. A
// recompute (out = false) finds resid[l] complete and passes no `prev`.
void Gpt2::block_forward(tsr_step *step, uint32_t l, const Set &s, int64_t B, int64_t T, bool out,
                         const Set *prev) {
  const int64_t R = B * T, C = d.width, H = d.heads, D = C / H;
  tsr_host_ctx *ctx = host->ctx;
  const auto P = [&](BlockParam p) { return param(step, block_param(l, p)); };
  View x = A(resid[l], {R, C});
  View ln1 = A(s.ln1, {R, C}), qkv = A(s.qkv, {R, 3 * C}), atty = A(s.atty, {R, C});
  View r2 = A(s.r2, {R, C}), ln2 = A(s.ln2, {R, C});
  View fch = A(s.fch, {R, 4 * C}), fchg = A(s.fchg, {R, 4 * C});
  View m1 = S(s.m1, {R}), s1 = S(s.s1, {R}), m2 = S(s.m2, {R}), s2 = S(s.s2, {R});
  View lse = S(s.lse, {B, H, T});

  DLTensor w = P(kLn1W), b = P(kLn1B);
  if (prev) {  // x_l = r_{l-1} + mlp_{l-1}, into resid[l], and ln_1 of it
    View pr = A(prev->r2, {R, C});
    check(ops->add_layernorm_forward(ctx, pr.get(), x.get(), &w, &b, kLayerNormEps, x.get(),
                                     ln1.get(), m1.get(), s1.get()));
  } else {
    check(
        ops->layernorm_forward(ctx, x.get(), &w, &b, kLayerNormEps, ln1.get(), m1.get(), s1.get()));
  }
  w = P(kQkvW);
  b = P(kQkvB);
  check(ops->linear(ctx, ln1.get(), 0, &w, 0, &b, TSR_ACT_NONE, qkv.get(), nullptr));
  View q = qkv_part(s.qkv, B, T, 0), k = qkv_part(s.qkv, B, T, 1), v = qkv_part(s.qkv, B, T, 2);
  View o = A(s.atty, {B, T, H, D});
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  check(ops->attention_forward(ctx, q.get(), k.get(), v.get(), scale, o.get(), lse.get()));
  w = P(kAttnProjW);
  b = P(kAttnProjB);
  check(ops->linear(ctx, atty.get(), 0, &w, 0, &b, TSR_ACT_NONE, r2.get(), nullptr));
  w = P(kLn2W);
  b = P(kLn2B);
  if (fuse_add_ln) {  // r = x + attn, and ln_2 of it, in one pass
    check(ops->add_layernorm_forward(ctx, x.get(), r2.get(), &w, &b, kLayerNormEps, r2.get(),
                                     ln2.get(), m2.get(), s2.get()));
  } else {
    check(ops->axpy(ctx, 1.0f, x.get(), r2.get()));  // r = x + attn
    check(ops->layernorm_forward(ctx, r2.get(), &w, &b, kLayerNormEps, ln2.get(), m2.get(),
                                 s2.get()));
  }
  w = P(kFcW);
  b = P(kFcB);
  check(ops->linear(ctx, ln2.get(), 0, &w, 0, &b, TSR_ACT_GELU, fchg.get(), fch.get()));
  if (!out) return;
  View y = A(resid[l + 1], {R, C});
  w = P(kMlpProjW);
  b = P(kMlpProjB);
  check(ops->linear(ctx, fchg.get(), 0, &w, 0, &b, TSR_ACT_NONE, y.get(), nullptr));
  // x_{l+1} = r + mlp; fused, the next block's ln_1 (or ln_f) adds it.
  if (!fuse_add_ln) check(ops->axpy(ctx, 1.0f, r2.get(), y.get()));
}

// With the fused residual, the set whose r2 resid[L] still lacks after the
// blocks (see block_forward); NULL when resid[L] is complete.
const Gpt2::Set *Gpt2::pending_residual() const {
  if (!fuse_add_ln || L() == 0) return nullptr;
  return &sets[recompute ? 0 : L() - 1];
}

// Embeddings and blocks: x_L into resid[L] for B sequences of T tokens.
// Returns wte's view, which serves the LM head too: group 0 stays live
// (the caller says params_done(0) after the head).
DLTensor Gpt2::trunk(tsr_step *step, const DLTensor &inputs, int64_t B, int64_t T) {
  const int64_t R = B * T, C = d.width;
  tsr_host_ctx *ctx = host->ctx;
  View ids(inputs, {R});
  DLTensor wte = param(step, kWte);
  ensure_dtype(wte);
  DLTensor wpe = param(step, kWpe);
  View x0 = A(resid[0], {R, C});
  check(ops->embedding_forward(ctx, ids.get(), &wte, x0.get(), 0));
  // x0[b] += wpe[0..T) for every sequence b: wpe's first T rows as one
  // bias over x0 viewed as [B, T * C] (one launch, not B).
  View pos(wpe, {T * C});
  View x0_seq = A(resid[0], {B, T * C});
  check(ops->bias_act(ctx, x0_seq.get(), pos.get(), TSR_ACT_NONE));
  for (uint32_t l = 0; l < L(); ++l) {
    const Set *prev = fuse_add_ln && l > 0 ? &sets[recompute ? 0 : l - 1] : nullptr;
    block_forward(step, l, sets[recompute ? 0 : l], B, T, true, prev);
    params_done(step, l + 1);
  }
  return wte;
}

void Gpt2::forward(tsr_step *step, const tsr_batch *batch, int32_t training,
                   tsr_forward_result *out) {
  ready = false;
  if (!out) throw Error(TSR_ERR_INVALID, "gpt2: forward result is NULL");
  const int64_t T = check_batch(batch);
  const int64_t B = batch->size;
  double loss_sum = 0;
  int64_t count = 0, correct = 0;
  if (B > 0) {
    const int64_t R = B * T, C = d.width;
    tsr_host_ctx *ctx = host->ctx;
    View tgt(batch->targets, {R});
    DLTensor wte = trunk(step, batch->inputs, B, T);

    View xL = A(resid[L()], {R, C}), lnf_y = A(lnf, {R, C});
    View m = S(lnf_m, {R}), s = S(lnf_s, {R});
    DLTensor w = param(step, lnf_w()), b = param(step, lnf_b());
    if (const Set *last = pending_residual()) {  // x_L = r + mlp of the last block, and ln_f
      View pr = A(last->r2, {R, C});
      check(ops->add_layernorm_forward(ctx, pr.get(), xL.get(), &w, &b, kLayerNormEps, xL.get(),
                                       lnf_y.get(), m.get(), s.get()));
    } else {
      check(ops->layernorm_forward(ctx, xL.get(), &w, &b, kLayerNormEps, lnf_y.get(), m.get(),
                                   s.get()));
    }
    params_done(step, L() + 1);

    // LM head: logits = ln_f(x_L) @ wte^T over the padded vocabulary.
    View z = A(logits, {R, d.padded_vocab});
    check(ops->linear(ctx, lnf_y.get(), 0, &wte, 1, nullptr, TSR_ACT_NONE, z.get(), nullptr));
    params_done(step, 0);
    // A training forward writes the gradient too, over the logits in place:
    // softmax - onehot, unscaled (backward's matmuls take loss_scale as
    // their alpha). The loss and its gradient then come from one read of
    // the [B*T, padded_vocab] logits, the largest activation (1.6 GB in
    // bf16 for GPT-2 at 16 x 1024 tokens), instead of one read here and a
    // read and write in backward.
    const bool grad_now = training && ce_grad_in_forward;
    check(ops->cross_entropy(ctx, z.get(), tgt.get(), d.vocab, 1.0f, grad_now ? z.get() : nullptr,
                             &loss_sum, &count, &correct));
    ce_grad_ready = grad_now;
  }
  out->loss_sum = loss_sum;
  out->count = count;
  out->correct = correct;
  ready = training != 0;
  ready_n = B;
  ready_T = T;
}

// ---- predict ----------------------------------------------------------------

// The caller's logits: float32 [B, vocab], compact, in host memory or on
// the model's device.
void Gpt2::check_logits(const DLTensor *out, int64_t B) const {
  if (!out) throw Error(TSR_ERR_INVALID, "gpt2: predict logits is NULL");
  std::string want = "[";  // built up in steps: GCC 12 misreads "[" + std::string
  want += std::to_string(B) + ", " + std::to_string(d.vocab) + "]";
  if (!same_dtype(out->dtype, sdk::dtype_f32()))
    throw Error(TSR_ERR_INVALID,
                "gpt2: predict logits must be float32, got " + dtype_name(out->dtype));
  if (out->ndim != 2 || !out->shape || out->shape[0] != B || out->shape[1] != d.vocab)
    throw Error(TSR_ERR_INVALID, "gpt2: predict logits are " +
                                     (out->shape ? shape_str(out->shape, out->ndim) : "?") +
                                     ", expected " + want + " (batch, vocab)");
  if (out->strides &&
      ((d.vocab != 1 && out->strides[1] != 1) || (B != 1 && out->strides[0] != d.vocab)))
    throw Error(TSR_ERR_INVALID, "gpt2: predict logits must be contiguous row-major");
  const int32_t dt = out->device.device_type;
  const bool on_model = dt == device.device_type && out->device.device_id == device.device_id;
  if (!on_model && dt != kDLCPU && dt != kDLCUDAHost)
    throw Error(TSR_ERR_INVALID,
                "gpt2: predict logits must be in host memory or on the model's device");
}

// Logits for the token after each sequence's last position: the trunk over
// every position (attention needs them all), then ln_f and the LM head on
// the B last rows only, over the real vocabulary (wte's first vocab rows).
void Gpt2::predict(tsr_step *step, const tsr_batch *batch, DLTensor *out) {
  ready = false;
  if (out && !out->data) {  // the size query
    if (out->ndim != 2 || !out->shape)
      throw Error(TSR_ERR_INVALID, "gpt2: predict's size query needs logits of 2 dims");
    out->shape[1] = d.vocab;
    return;
  }
  const int64_t T = check_batch(batch, false);
  const int64_t B = batch->size;
  check_logits(out, B);
  if (B == 0) return;
  const int64_t C = d.width, V = d.vocab;
  tsr_host_ctx *ctx = host->ctx;
  DLTensor wte = trunk(step, batch->inputs, B, T);
  if (const Set *pending = pending_residual()) {  // x_L = r + mlp, which ln_f adds in forward
    View xL = A(resid[L()], {B * T, C}), pr = A(pending->r2, {B * T, C});
    check(ops->axpy(ctx, 1.0f, pr.get(), xL.get()));
  }

  View last = A(dsmall, {B, C});
  for (int64_t b = 0; b < B; ++b) {
    View src = A(resid[L()] + static_cast<size_t>((b * T + T - 1) * C), {C});
    View dst = A(dsmall + static_cast<size_t>(b * C), {C});
    check(ops->copy(ctx, src.get(), dst.get()));
  }
  View y = A(lnf, {B, C}), m = S(lnf_m, {B}), s = S(lnf_s, {B});
  DLTensor w = param(step, lnf_w()), b = param(step, lnf_b());
  check(ops->layernorm_forward(ctx, last.get(), &w, &b, kLayerNormEps, y.get(), m.get(), s.get()));
  params_done(step, L() + 1);
  View head(wte, {V, C});  // the real vocabulary: wte's first V rows
  View z = A(logits, {B, V});
  check(ops->linear(ctx, y.get(), 0, head.get(), 1, nullptr, TSR_ACT_NONE, z.get(), nullptr));
  params_done(step, 0);

  // To the caller's float32 tensor: cast on the device, then copy across.
  sdk::logits_to_f32(host, device, z.get(), out, predict_f32,
                     static_cast<size_t>(max_batch * V) * 4);
}

// ---- backward ---------------------------------------------------------------

// The weight and bias gradients of block l's linear layer `wp` (its bias
// is wp + 1) from its input x and output gradient dy: dW += x^T dy (or =,
// on a pass whose gradients began at zero: dW has no other contribution)
// and db += the column sums of dy, in one call where the host fuses them.
// bias_done: the layernorm backward above has added db already.
void Gpt2::weight_grads(tsr_step *step, uint32_t l, BlockParam wp, View x, View dy,
                        bool bias_done) {
  tsr_host_ctx *ctx = host->ctx;
  const uint32_t wi = block_param(l, wp), bi = wi + 1;
  if (trainable(wi)) {
    DLTensor gw = grad(step, wi);
    if (fuse_bias_grad && trainable(bi) && !bias_done) {
      DLTensor gb = grad(step, bi);
      check(ops->matmul_bias_grad(ctx, x.get(), 1, dy.get(), 0, &gw, 1.0f, wgrad_beta, &gb));
      return;
    }
    check(ops->matmul(ctx, x.get(), 1, dy.get(), 0, &gw, 1.0f, wgrad_beta));
  }
  if (trainable(bi) && !bias_done) {
    DLTensor gb = grad(step, bi);
    check(ops->bias_grad(ctx, dy.get(), &gb));
  }
}

// A layernorm's backward into dres (dy its output gradient, x its input,
// w_index its weight, the bias after it). With fuse_ln_sum the same pass
// adds the column sums of the dres it leaves into parameter below_bias (if
// >= 0 and trainable): the bias gradient of the projection whose output
// joined the residual stream under this norm.
void Gpt2::norm_backward(tsr_step *step, View &dy, View &x, uint32_t w_index, View &m, View &s,
                         View &dres_v, int64_t below_bias) {
  tsr_host_ctx *ctx = host->ctx;
  DLTensor lw = param(step, w_index);
  View gw = grad_or_discard(step, w_index, 0);
  View gb = grad_or_discard(step, w_index + 1, 1);
  const auto below = static_cast<uint32_t>(below_bias);
  if (fuse_ln_sum && below_bias >= 0 && trainable(below)) {
    View gs(grad(step, below), {d.width});
    check(ops->layernorm_backward_sum(ctx, dy.get(), x.get(), &lw, m.get(), s.get(), dres_v.get(),
                                      gw.get(), gb.get(), gs.get()));
    return;
  }
  check(ops->layernorm_backward(ctx, dy.get(), x.get(), &lw, m.get(), s.get(), dres_v.get(),
                                gw.get(), gb.get()));
}

// Block l's backward: dres holds d x_{l+1} on entry and d x_l on exit.
void Gpt2::block_backward(tsr_step *step, uint32_t l, const Set &s, int64_t B, int64_t T) {
  const int64_t R = B * T, C = d.width, H = d.heads, D = C / H;
  tsr_host_ctx *ctx = host->ctx;
  const auto P = [&](BlockParam p) { return param(step, block_param(l, p)); };
  const auto train = [&](BlockParam p) { return trainable(block_param(l, p)); };
  const auto G = [&](BlockParam p) { return grad(step, block_param(l, p)); };
  View x = A(resid[l], {R, C}), dres_v = A(dres, {R, C}), dsm = A(dsmall, {R, C});
  View ln1 = A(s.ln1, {R, C}), atty = A(s.atty, {R, C});
  View r2 = A(s.r2, {R, C}), ln2 = A(s.ln2, {R, C});
  View fch = A(s.fch, {R, 4 * C}), fchg = A(s.fchg, {R, 4 * C});
  View m1 = S(s.m1, {R}), s1 = S(s.s1, {R}), m2 = S(s.m2, {R}), s2 = S(s.s2, {R});
  View lse = S(s.lse, {B, H, T});
  View dfc = A(dbig, {R, 4 * C}), dqkv = A(dbig, {R, 3 * C});

  // MLP: y = r + c_proj(gelu(c_fc(ln_2(r)))). With recompute_gelu the
  // GELU is rebuilt in dbig (whole-block recompute has just written it).
  if (recompute_gelu && !recompute && train(kMlpProjW))
    check(ops->act_forward(ctx, TSR_ACT_GELU, fch.get(), fchg.get()));
  // The projections' bias gradients come from the norm backward above each
  // where fuse_ln_sum (ln_f's or block l + 1's ln_1 for c_proj, ln_2 for
  // attn's c_proj).
  weight_grads(step, l, kMlpProjW, fchg, dres_v, fuse_ln_sum);
  DLTensor w = P(kMlpProjW);
  if (fuse_act_grad) {
    // d c_fc's output = gelu'(pre) * (dy @ W^T), and c_fc's bias gradient
    // from it, in the matmul's epilogue.
    DLTensor gb{};
    if (train(kFcB)) gb = G(kFcB);
    check(ops->matmul_act_backward(ctx, dres_v.get(), 0, &w, 1, TSR_ACT_GELU, fch.get(), dfc.get(),
                                   train(kFcB) ? &gb : nullptr));
  } else {
    check(ops->matmul(ctx, dres_v.get(), 0, &w, 1, dfc.get(), 1.0f, 0.0f));
    check(ops->act_backward(ctx, TSR_ACT_GELU, fch.get(), 0, dfc.get(), dfc.get()));
    if (train(kFcB)) {
      DLTensor g = G(kFcB);
      check(ops->bias_grad(ctx, dfc.get(), &g));
    }
  }
  if (train(kFcW)) {
    DLTensor g = G(kFcW);
    check(ops->matmul(ctx, ln2.get(), 1, dfc.get(), 0, &g, 1.0f, wgrad_beta));
  }
  w = P(kFcW);
  check(ops->matmul(ctx, dfc.get(), 0, &w, 1, dsm.get(), 1.0f, 0.0f));
  norm_backward(step, dsm, r2, block_param(l, kLn2W), m2, s2, dres_v, block_param(l, kAttnProjB));

  // Attention: r = x + c_proj(attn(c_attn(ln_1(x)))).
  weight_grads(step, l, kAttnProjW, atty, dres_v, fuse_ln_sum);
  w = P(kAttnProjW);
  check(ops->matmul(ctx, dres_v.get(), 0, &w, 1, dsm.get(), 1.0f, 0.0f));
  {
    View q = qkv_part(s.qkv, B, T, 0), k = qkv_part(s.qkv, B, T, 1);
    View v = qkv_part(s.qkv, B, T, 2);
    View dq = qkv_part(dbig, B, T, 0), dk = qkv_part(dbig, B, T, 1);
    View dv = qkv_part(dbig, B, T, 2);
    View o = A(s.atty, {B, T, H, D}), dout = A(dsmall, {B, T, H, D});
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    check(ops->attention_backward(ctx, q.get(), k.get(), v.get(), o.get(), dout.get(), lse.get(),
                                  scale, dq.get(), dk.get(), dv.get()));
  }
  weight_grads(step, l, kQkvW, ln1, dqkv);
  w = P(kQkvW);
  check(ops->matmul(ctx, dqkv.get(), 0, &w, 1, dsm.get(), 1.0f, 0.0f));
  norm_backward(step, dsm, x, block_param(l, kLn1W), m1, s1, dres_v,
                l > 0 ? int64_t{block_param(l - 1, kMlpProjB)} : int64_t{-1});
}

void Gpt2::backward(tsr_step *step, const tsr_batch *batch, float loss_scale) {
  if (!ready)
    throw Error(TSR_ERR_INVALID, "gpt2: backward needs a forward with training = 1 just before it");
  const int64_t T = check_batch(batch);
  const int64_t B = batch->size;
  if (B != ready_n || (B > 0 && T != ready_T))
    throw Error(TSR_ERR_INVALID, "gpt2: backward got " + std::to_string(B) + " x " +
                                     std::to_string(T) + " tokens, the forward before it had " +
                                     std::to_string(ready_n) + " x " + std::to_string(ready_T));
  ready = false;  // forward left dlogits over the logits: one backward per forward
  wgrad_beta = sdk::first_grad_beta(host, step);
  const uint32_t nL = L();
  const auto run = [&](int64_t stage) { return B > 0 && stage >= lowest_trainable_stage; };
  tsr_host_ctx *ctx = host->ctx;
  const int64_t R = B * T, C = d.width;

  if (run(nL + 1)) {
    // dlogits = loss_scale * (softmax - onehot): the forward left the
    // unscaled difference over the logits (loss_scale then scales the two
    // matmuls), or cross_entropy writes it scaled now.
    View z = A(logits, {R, d.padded_vocab});
    float alpha = loss_scale;
    if (!ce_grad_ready) {
      View tgt(batch->targets, {R});
      double loss_sum = 0;
      int64_t count = 0;
      check(ops->cross_entropy(ctx, z.get(), tgt.get(), d.vocab, loss_scale, z.get(), &loss_sum,
                               &count, nullptr));
      alpha = 1.0f;
    }
    // LM head: dwte += dlogits^T @ ln_f(x_L) (its first contribution: the
    // embedding's backward adds the second); d ln_f(x_L) = dlogits @ wte.
    View lnf_y = A(lnf, {R, C}), dsm = A(dsmall, {R, C});
    DLTensor wte = param(step, kWte);
    if (trainable(kWte)) {
      DLTensor g = grad(step, kWte);
      check(ops->matmul(ctx, z.get(), 1, lnf_y.get(), 0, &g, alpha, wgrad_beta));
    }
    check(ops->matmul(ctx, z.get(), 0, &wte, 0, dsm.get(), alpha, 0.0f));
    // ln_f; dres becomes d x_L.
    View dres_v = A(dres, {R, C}), xL = A(resid[nL], {R, C});
    check(ops->fill(ctx, dres_v.get(), 0.0f));
    View m = S(lnf_m, {R}), s = S(lnf_s, {R});
    norm_backward(step, dsm, xL, lnf_w(), m, s, dres_v,
                  nL > 0 ? int64_t{block_param(nL - 1, kMlpProjB)} : int64_t{-1});
  }
  check(host->grads_done(step, nL + 1));

  for (uint32_t l = nL; l-- > 0;) {
    if (run(l + 1)) {
      const Set &s = sets[recompute ? 0 : l];
      if (recompute) block_forward(step, l, s, B, T, false);
      block_backward(step, l, s, B, T);
    }
    check(host->grads_done(step, l + 1));
  }

  if (run(0)) {
    View dres_v = A(dres, {R, C});
    if (trainable(kWte)) {
      View ids(batch->inputs, {R});
      DLTensor g = grad(step, kWte);
      check(ops->embedding_backward(ctx, ids.get(), dres_v.get(), &g));
    }
    if (trainable(kWpe)) {
      DLTensor g = grad(step, kWpe);
      // The sum over sequences, as the bias gradient of x0 viewed as [B, T * C].
      View pos(g, {T * C});
      View dres_seq = A(dres, {B, T * C});
      check(ops->bias_grad(ctx, dres_seq.get(), pos.get()));
    }
  }
  check(host->grads_done(step, 0));
}

// ---- FLOPs ------------------------------------------------------------------

// Per sample of T tokens: 6 N T + 6 L C T^2, i.e. per token 6 N (a multiply
// -add per parameter, forward and twice backward) plus 6 L C T for the
// causal attention scores and their use (QK^T and AV, 2 x 2 C T per token
// forward halved by the causal mask, times 3 for backward). N counts every
// declared parameter, embeddings included (wte at its padded size: the LM
// head's matmul multiplies all of it). With `freeze` the backward does
// less, and this counts only what runs: per parameter 2 n T forward, 2 n T
// for its gradient when it trains, 2 n T for its input's gradient when
// backward reaches its stage (wte's as the head, L + 1); per layer 2 C T^2
// forward and 4 C T^2 backward where backward reaches it.
double Gpt2::flops_per_sample() const {
  const double T = static_cast<double>(data_T);
  const auto reached = [&](int64_t stage) { return stage >= lowest_trainable_stage; };
  double f = 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    const tsr_param_info &p = infos[i];
    double n = 1;
    for (int32_t k = 0; k < p.ndim; ++k) n *= static_cast<double>(p.shape[k]);
    const int64_t stage = i == kWte ? d.layers + 1 : static_cast<int64_t>(p.group);
    f += (2.0 + (p.trainable ? 2.0 : 0.0) + (reached(stage) ? 2.0 : 0.0)) * n * T;
  }
  for (int64_t l = 0; l < d.layers; ++l)
    f += (2.0 + (reached(l + 1) ? 4.0 : 0.0)) * static_cast<double>(d.width) * T * T;
  return f;
}

}  // namespace tessera::gpt2
