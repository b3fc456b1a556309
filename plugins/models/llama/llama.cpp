// The llama model's compute, through the host's ops only (llama.hpp
// describes the model): batch checks, forward (embedding, layers, final
// norm, LM head, loss), predict's last-position logits, backward layer by
// layer, and the FLOPs per sample.
#include "llama.hpp"

#include <cmath>
#include <cstdint>
#include <string>

namespace tessera::llama {

// ---- batch ------------------------------------------------------------------

int64_t Llama::check_batch(const tsr_batch *batch, bool with_targets) {
  packed = false;
  const int64_t T =
      sdk::check_token_batch("llama", batch, with_targets, max_batch, device, a.max_seq, "max_seq");
  if (T == 0) return 0;
  const int64_t n = batch->size;
  check_positions(batch, n, T);
  return T;
}

// ABI 1.8: a batch of packed sequences carries positions int32 [n, T] on
// the model's device; rope and attention then use them (attention within
// each packed example only).
void Llama::check_positions(const tsr_batch *batch, int64_t n, int64_t T) {
  if (!TSR_HAS_FIELD(batch, tsr_batch, positions) || !batch->positions.data) return;
  const DLTensor &p = batch->positions;
  if (!same_dtype(p.dtype, sdk::dtype_i32()) || p.ndim != 2 || !p.shape || p.shape[0] != n ||
      p.shape[1] != T)
    throw Error(TSR_ERR_INVALID, "llama: batch positions must be int32 [" + std::to_string(n) +
                                     ", " + std::to_string(T) + "], like the inputs; got " +
                                     dtype_name(p.dtype) +
                                     (p.shape ? " " + shape_str(p.shape, p.ndim) : std::string()));
  if (p.device.device_type != device.device_type || p.device.device_id != device.device_id)
    throw Error(TSR_ERR_INVALID, "llama: batch positions are not on the model's device");
  if (p.strides && ((T != 1 && p.strides[1] != 1) || (n != 1 && p.strides[0] != T)))
    throw Error(TSR_ERR_INVALID, "llama: batch positions must be contiguous row-major");
  if (!TSR_HAS_FIELD(ops, tsr_ops, attention_packed_backward) || !ops->attention_packed_forward ||
      !ops->attention_packed_backward)
    throw Error(TSR_ERR_UNSUPPORTED,
                "llama: the batch holds packed sequences (positions), but this host's ops table "
                "has no attention_packed_forward/backward (ABI 1.8)");
  packed = true;
  packed_pos = p;
}

// Causal attention of one layer, within each packed example when the batch
// holds positions.
void Llama::attention(const View &q4, const View &k4, const View &v4, View &pos, View &o4,
                      View &lse) {
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(a.head_dim)));
  View q = q4, k = k4, v = v4;
  if (packed)
    check(ops->attention_packed_forward(host->ctx, q.get(), k.get(), v.get(), pos.get(), scale,
                                        o4.get(), lse.get()));
  else
    check(ops->attention_gqa_forward(host->ctx, q.get(), k.get(), v.get(), scale, o4.get(),
                                     lse.get()));
}

// ---- forward ----------------------------------------------------------------

// y = x W^T (+ b) (+ s u B^T, an adapter's term). Without a bias the
// adapter's term goes first and the base matmul adds into it (its epilogue
// reads y), one pass over y fewer than adding the term afterwards.
void Llama::project(tsr_step *step, uint32_t l, LayerParam p, LayerParam bias, View &x, View &y,
                    int64_t R) {
  DLTensor w = param(step, P(l, p));
  const bool biased = bias != kLayerParams && has(l, bias);
  if (!biased && lora_forward(step, l, p, x, &y, R, 0.0f)) {
    check(ops->matmul(host->ctx, x.get(), 0, &w, 1, y.get(), 1.0f, 1.0f));
    return;
  }
  DLTensor b{};
  if (biased) b = param(step, P(l, bias));
  check(ops->linear(host->ctx, x.get(), 0, &w, 1, biased ? &b : nullptr, TSR_ACT_NONE, y.get(),
                    nullptr));
  if (biased) lora_forward(step, l, p, x, &y, R, 1.0f);  // after the biased matmul
}

// Layer l from x_l (resid[l]) into set s; with `out` its output x_{l+1}
// into resid[l + 1] (a recompute in backward stops before the down
// projection, whose output backward does not read).
void Llama::layer_forward(tsr_step *step, uint32_t l, const Set &s, int64_t B, int64_t T,
                          bool out) {
  const int64_t R = B * T, C = a.width, D = a.head_dim, Hq = a.heads, Hk = a.kv_heads;
  const int64_t F = a.intermediate;
  const float eps = static_cast<float>(a.rms_eps);
  tsr_host_ctx *ctx = host->ctx;
  const auto W = [&](LayerParam p) { return param(step, P(l, p)); };
  View x = A(resid[l], {R, C}), h1 = A(s.h1, {R, C}), rstd1 = S(s.rstd1, {R});
  DLTensor w = W(kInNorm);
  check(ops->rmsnorm_forward(ctx, x.get(), &w, eps, h1.get(), rstd1.get()));
  // q, k, v projections; with qk_norm q and k land in qraw/kraw first.
  View q = A(a.qk_norm ? s.qraw : s.q, {R, QD()}), k = A(a.qk_norm ? s.kraw : s.k, {R, KD()});
  View v = A(s.v, {R, KD()});
  const LayerParam proj[3][2] = {{kQ, kQBias}, {kK, kKBias}, {kV, kVBias}};
  View *dst[3] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i) project(step, l, proj[i][0], proj[i][1], h1, *dst[i], R);
  if (a.qk_norm) {  // per-head RMSNorm over D: rows R * H
    View qr = A(s.qraw, {R * Hq, D}), kr = A(s.kraw, {R * Hk, D});
    View qn = A(s.q, {R * Hq, D}), kn = A(s.k, {R * Hk, D});
    View rq = S(s.rstdq, {R * Hq}), rk = S(s.rstdk, {R * Hk});
    DLTensor wq = W(kQNorm), wk = W(kKNorm);
    check(ops->rmsnorm_forward(ctx, qr.get(), &wq, eps, qn.get(), rq.get()));
    check(ops->rmsnorm_forward(ctx, kr.get(), &wk, eps, kn.get(), rk.get()));
  }
  View q4 = A(s.q, {B, T, Hq, D}), k4 = A(s.k, {B, T, Hk, D}), v4 = A(s.v, {B, T, Hk, D});
  View o4 = A(s.o, {B, T, Hq, D}), lse = S(s.lse, {B, Hq, T});
  View pos_v = token_positions(B, T);
  check(ops->rope_forward(ctx, &a.rope, pos_v.get(), q4.get(), k4.get()));
  attention(q4, k4, v4, pos_v, o4, lse);
  // r = x + o_proj(o), and the post-attention norm of it, in one pass.
  View o = A(s.o, {R, QD()}), r = A(s.r, {R, C}), h2 = A(s.h2, {R, C});
  View rstd2 = S(s.rstd2, {R});
  project(step, l, kO, kLayerParams, o, r, R);
  w = W(kPostNorm);
  check(ops->add_rmsnorm_forward(ctx, x.get(), r.get(), &w, eps, r.get(), h2.get(), rstd2.get()));
  // SwiGLU MLP.
  View gate = A(s.gate, {R, F}), up = A(s.up, {R, F}), act_v = A(s.act, {R, F});
  project(step, l, kGate, kLayerParams, h2, gate, R);
  project(step, l, kUp, kLayerParams, h2, up, R);
  check(ops->swiglu_forward(ctx, gate.get(), up.get(), act_v.get()));
  if (!out) {  // backward reads the down adapter's u
    lora_forward(step, l, kDown, act_v, nullptr, R, 0.0f);
    return;
  }
  View y = A(resid[l + 1], {R, C});
  project(step, l, kDown, kLayerParams, act_v, y, R);
  check(ops->axpy(ctx, 1.0f, r.get(), y.get()));  // x_{l+1} = r + mlp
}

// Embedding and layers: x_L into resid[L]. Returns embed_tokens' view
// (group 0 stays live until after the LM head: tied, it is the head).
DLTensor Llama::trunk(tsr_step *step, const DLTensor &inputs, int64_t B, int64_t T) {
  const int64_t R = B * T;
  View ids(inputs, {R});
  DLTensor e = param(step, embed);
  ensure_dtype(e);
  View x0 = A(resid[0], {R, a.width});
  check(ops->embedding_forward(host->ctx, ids.get(), &e, x0.get(), 0));
  for (uint32_t l = 0; l < L(); ++l) {
    layer_forward(step, l, sets[recompute ? 0 : l], B, T, true);
    params_done(step, l + 1);
  }
  return e;
}

DLTensor Llama::head_weight(tsr_step *step, const DLTensor &embed_view) {
  return a.tie ? embed_view : param(step, lm_head);
}

void Llama::forward(tsr_step *step, const tsr_batch *batch, int32_t training,
                    tsr_forward_result *out) {
  ready = false;
  if (!out) throw Error(TSR_ERR_INVALID, "llama: forward result is NULL");
  const int64_t T = check_batch(batch);
  const int64_t B = batch->size;
  lora_begin_pass(*this, step, training != 0);
  double loss_sum = 0;
  int64_t count = 0, correct = 0;
  if (B > 0) {
    const int64_t R = B * T, C = a.width;
    tsr_host_ctx *ctx = host->ctx;
    DLTensor e = trunk(step, batch->inputs, B, T);
    View xL = A(resid[L()], {R, C}), y = A(hf, {R, C}), rs = S(rstdf, {R});
    DLTensor w = param(step, final_norm);
    check(
        ops->rmsnorm_forward(ctx, xL.get(), &w, static_cast<float>(a.rms_eps), y.get(), rs.get()));
    DLTensor head = head_weight(step, e);
    View z = A(logits, {R, a.vocab});
    check(ops->linear(ctx, y.get(), 0, &head, 1, nullptr, TSR_ACT_NONE, z.get(), nullptr));
    params_done(step, L() + 1);
    params_done(step, 0);
    // A training forward leaves the unscaled loss gradient over the logits
    // (backward's matmuls apply loss_scale): one read of the logits.
    View tgt(batch->targets, {R});
    check(ops->cross_entropy(ctx, z.get(), tgt.get(), a.vocab, 1.0f, training ? z.get() : nullptr,
                             &loss_sum, &count, &correct));
  }
  out->loss_sum = loss_sum;
  out->count = count;
  out->correct = correct;
  ready = training != 0;
  ready_n = B;
  ready_T = T;
}

// ---- predict ----------------------------------------------------------------

// float32 logits [B, vocab] of each sequence's last position: the trunk
// over every position, then the final norm and the head on B rows.
void Llama::predict(tsr_step *step, const tsr_batch *batch, DLTensor *out) {
  ready = false;
  if (out && !out->data) {  // the size query
    if (out->ndim != 2 || !out->shape)
      throw Error(TSR_ERR_INVALID, "llama: predict's size query needs logits of 2 dims");
    out->shape[1] = a.vocab;
    return;
  }
  const int64_t T = check_batch(batch, false);
  const int64_t B = batch->size;
  lora_begin_pass(*this, step, false);
  const int64_t C = a.width, V = a.vocab;
  if (!out || !same_dtype(out->dtype, sdk::dtype_f32()) || out->ndim != 2 || !out->shape ||
      out->shape[0] != B || out->shape[1] != V || (out->strides && B > 1 && out->strides[0] != V))
    throw Error(TSR_ERR_INVALID, "llama: predict logits must be compact float32 [" +
                                     std::to_string(B) + ", " + std::to_string(V) + "]");
  if (B == 0) return;
  tsr_host_ctx *ctx = host->ctx;
  DLTensor e = trunk(step, batch->inputs, B, T);
  for (int64_t b = 0; b < B; ++b) {
    View src = A(resid[L()] + static_cast<size_t>((b * T + T - 1) * C), {C});
    View dst = A(dsm + static_cast<size_t>(b * C), {C});
    check(ops->copy(ctx, src.get(), dst.get()));
  }
  View last = A(dsm, {B, C}), y = A(hf, {B, C}), rs = S(rstdf, {B});
  DLTensor w = param(step, final_norm);
  check(
      ops->rmsnorm_forward(ctx, last.get(), &w, static_cast<float>(a.rms_eps), y.get(), rs.get()));
  DLTensor head = head_weight(step, e);
  View z = A(logits, {B, V});
  check(ops->linear(ctx, y.get(), 0, &head, 1, nullptr, TSR_ACT_NONE, z.get(), nullptr));
  params_done(step, L() + 1);
  params_done(step, 0);
  sdk::logits_to_f32(host, device, z.get(), out, predict_f32,
                     static_cast<size_t>(max_batch * V) * 4);
}

// ---- backward ---------------------------------------------------------------

// dx = dy W (+ du A, an adapter's share) + beta dx, and the adapter's
// weight gradients: the adapter's share first where there is one, the base
// matmul then adds into it (one pass over dx fewer than adding it after).
void Llama::project_dx(tsr_step *step, uint32_t l, LayerParam p, View &dy, View &x, View &dx,
                       int64_t R, float beta) {
  DLTensor w = param(step, P(l, p));
  const float base_beta = lora_backward(step, l, p, dy, x, dx, R, beta) ? 1.0f : beta;
  check(ops->matmul(host->ctx, dy.get(), 0, &w, 0, dx.get(), 1.0f, base_beta));
}

// The attention half of layer l's backward: dres holds d r on entry (the
// gradient of both x_l and o_proj's output) and d x_l on exit.
void Llama::attention_backward(tsr_step *step, uint32_t l, const Set &s, int64_t B, int64_t T) {
  const int64_t R = B * T, C = a.width, D = a.head_dim, Hq = a.heads, Hk = a.kv_heads;
  tsr_host_ctx *ctx = host->ctx;
  const auto W = [&](LayerParam p) { return param(step, P(l, p)); };
  const auto G = [&](LayerParam p) { return grad(step, P(l, p)); };
  const auto trains = [&](LayerParam p) { return trainable(P(l, p)); };
  View dres_v = A(dres, {R, C}), dsm_v = A(dsm, {R, C}), o = A(s.o, {R, QD()});
  if (trains(kO)) {
    DLTensor g = G(kO);
    check(ops->matmul(ctx, dres_v.get(), 1, o.get(), 0, &g, 1.0f, wgrad_beta));
  }
  View dout_v = A(dout, {R, QD()});
  project_dx(step, l, kO, dres_v, o, dout_v, R, 0.0f);
  View q4 = A(s.q, {B, T, Hq, D}), k4 = A(s.k, {B, T, Hk, D}), v4 = A(s.v, {B, T, Hk, D});
  View o4 = A(s.o, {B, T, Hq, D}), do4 = A(dout, {B, T, Hq, D}), lse = S(s.lse, {B, Hq, T});
  View dq4 = A(dq, {B, T, Hq, D}), dk4 = A(dk, {B, T, Hk, D}), dv4 = A(dv, {B, T, Hk, D});
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  View pos_v = token_positions(B, T);
  if (packed)
    check(ops->attention_packed_backward(ctx, q4.get(), k4.get(), v4.get(), pos_v.get(), o4.get(),
                                         do4.get(), lse.get(), scale, dq4.get(), dk4.get(),
                                         dv4.get()));
  else
    check(ops->attention_gqa_backward(ctx, q4.get(), k4.get(), v4.get(), o4.get(), do4.get(),
                                      lse.get(), scale, dq4.get(), dk4.get(), dv4.get()));
  check(ops->rope_backward(ctx, &a.rope, pos_v.get(), dq4.get(), dk4.get()));
  size_t dqs = dq, dks = dk;  // the projections' output gradients
  if (a.qk_norm) {
    View dq2 = A(dq, {R * Hq, D}), dk2 = A(dk, {R * Hk, D});
    View dqr = A(dqraw, {R * Hq, D}), dkr = A(dkraw, {R * Hk, D});
    View qr = A(s.qraw, {R * Hq, D}), kr = A(s.kraw, {R * Hk, D});
    View rq = S(s.rstdq, {R * Hq}), rk = S(s.rstdk, {R * Hk});
    check(ops->fill(ctx, dqr.get(), 0.0f));
    check(ops->fill(ctx, dkr.get(), 0.0f));
    DLTensor wq = W(kQNorm), wk = W(kKNorm);
    View gq = norm_grad(step, P(l, kQNorm), D);
    check(ops->rmsnorm_backward(ctx, dq2.get(), qr.get(), &wq, rq.get(), dqr.get(),
                                grad_or_null(gq)));
    View gk = norm_grad(step, P(l, kKNorm), D);
    check(ops->rmsnorm_backward(ctx, dk2.get(), kr.get(), &wk, rk.get(), dkr.get(),
                                grad_or_null(gk)));
    dqs = dqraw;
    dks = dkraw;
  }
  View h1 = A(s.h1, {R, C});
  const LayerParam proj[3][2] = {{kQ, kQBias}, {kK, kKBias}, {kV, kVBias}};
  const size_t dsrc[3] = {dqs, dks, dv};
  for (int i = 0; i < 3; ++i) {
    const int64_t n = i == 0 ? QD() : KD();
    View dy = A(dsrc[i], {R, n});
    if (has(l, proj[i][1]) && trains(proj[i][1])) {
      DLTensor gb = G(proj[i][1]);
      check(ops->bias_grad(ctx, dy.get(), &gb));
    }
    if (trains(proj[i][0])) {
      DLTensor gw = G(proj[i][0]);
      check(ops->matmul(ctx, dy.get(), 1, h1.get(), 0, &gw, 1.0f, wgrad_beta));
    }
    project_dx(step, l, proj[i][0], dy, h1, dsm_v, R, i == 0 ? 0.0f : 1.0f);
  }
  View x = A(resid[l], {R, C}), rstd1 = S(s.rstd1, {R});
  DLTensor wn = W(kInNorm);
  View gn = norm_grad(step, P(l, kInNorm), C);
  check(ops->rmsnorm_backward(ctx, dsm_v.get(), x.get(), &wn, rstd1.get(), dres_v.get(),
                              grad_or_null(gn)));
}

// Layer l's backward: dres holds d x_{l+1} on entry and d x_l on exit.
void Llama::layer_backward(tsr_step *step, uint32_t l, const Set &s, int64_t B, int64_t T) {
  const int64_t R = B * T, C = a.width, F = a.intermediate;
  tsr_host_ctx *ctx = host->ctx;
  const auto W = [&](LayerParam p) { return param(step, P(l, p)); };
  const auto G = [&](LayerParam p) { return grad(step, P(l, p)); };
  const auto trains = [&](LayerParam p) { return trainable(P(l, p)); };
  View dres_v = A(dres, {R, C}), dsm_v = A(dsm, {R, C});
  View gate = A(s.gate, {R, F}), up = A(s.up, {R, F}), act_v = A(s.act, {R, F});
  View h2 = A(s.h2, {R, C}), r = A(s.r, {R, C}), rstd2 = S(s.rstd2, {R});
  View dact_v = A(dact, {R, F}), dgate_v = A(dgate, {R, F}), dup_v = A(dup, {R, F});
  // x_{l+1} = r + down(swiglu(gate(h2), up(h2))), h2 = rmsnorm(r).
  const auto weight_grad = [&](LayerParam p, View &dy, View &x) {
    if (!trains(p)) return;
    DLTensor g = G(p);
    check(ops->matmul(ctx, dy.get(), 1, x.get(), 0, &g, 1.0f, wgrad_beta));
  };
  // swiglu's output is shared by the layers and shares the logits' space
  // (plan_memory): again from gate and up, the last layer's too, where it
  // is read: by the down weight's gradient, or its adapter's without
  // dropout (with dropout the adapter kept its dropped input).
  const bool adapter_reads = lora.enabled() && lora.on[kLoraDown] && !lora.dropping;
  const bool reads_act = trains(kDown) || adapter_reads;
  if (recompute_swiglu && reads_act && !adapter_reads && swiglu_out_op()) {
    // Only the weight gradient reads it, after d act is known: the
    // gradient pass gives it again from the same reads of gate and up
    // (ABI 1.12), one pass over both fewer than a forward before it.
    project_dx(step, l, kDown, dres_v, act_v, dact_v, R, 0.0f);
    check(ops->swiglu_backward_out(ctx, gate.get(), up.get(), dact_v.get(), dgate_v.get(),
                                   dup_v.get(), act_v.get()));
    weight_grad(kDown, dres_v, act_v);
  } else {
    if (recompute_swiglu && reads_act)
      check(ops->swiglu_forward(ctx, gate.get(), up.get(), act_v.get()));
    weight_grad(kDown, dres_v, act_v);
    project_dx(step, l, kDown, dres_v, act_v, dact_v, R, 0.0f);
    check(
        ops->swiglu_backward(ctx, gate.get(), up.get(), dact_v.get(), dgate_v.get(), dup_v.get()));
  }
  weight_grad(kGate, dgate_v, h2);
  weight_grad(kUp, dup_v, h2);
  project_dx(step, l, kGate, dgate_v, h2, dsm_v, R, 0.0f);
  project_dx(step, l, kUp, dup_v, h2, dsm_v, R, 1.0f);
  DLTensor w = W(kPostNorm);
  View g = norm_grad(step, P(l, kPostNorm), C);
  check(ops->rmsnorm_backward(ctx, dsm_v.get(), r.get(), &w, rstd2.get(), dres_v.get(),
                              grad_or_null(g)));
  attention_backward(step, l, s, B, T);
}

// The loss, LM head and final norm: dres becomes d x_L.
void Llama::head_backward(tsr_step *step, int64_t B, int64_t T, float loss_scale) {
  const int64_t R = B * T, C = a.width;
  tsr_host_ctx *ctx = host->ctx;
  View z = A(logits, {R, a.vocab}), y = A(hf, {R, C}), dsm_v = A(dsm, {R, C});
  const uint32_t hi = a.tie ? embed : lm_head;
  if (trainable(hi)) {
    DLTensor g = grad(step, hi);
    check(ops->matmul(ctx, z.get(), 1, y.get(), 0, &g, loss_scale, wgrad_beta));
  }
  // Only the LM head trains: nothing below needs the gradient of its input.
  if (lowest_trainable_stage > L() && !trainable(final_norm)) return;
  DLTensor w = param(step, hi);
  check(ops->matmul(ctx, z.get(), 0, &w, 0, dsm_v.get(), loss_scale, 0.0f));
  View dres_v = A(dres, {R, C}), xL = A(resid[L()], {R, C}), rs = S(rstdf, {R});
  check(ops->fill(ctx, dres_v.get(), 0.0f));
  DLTensor nw = param(step, final_norm);
  View ng = norm_grad(step, final_norm, C);
  check(ops->rmsnorm_backward(ctx, dsm_v.get(), xL.get(), &nw, rs.get(), dres_v.get(),
                              grad_or_null(ng)));
}

void Llama::backward(tsr_step *step, const tsr_batch *batch, float loss_scale) {
  if (!ready)
    throw Error(TSR_ERR_INVALID,
                "llama: backward needs a forward with training = 1 just before it");
  const int64_t T = check_batch(batch);
  const int64_t B = batch->size;
  if (B != ready_n || (B > 0 && T != ready_T))
    throw Error(TSR_ERR_INVALID, "llama: backward got " + std::to_string(B) + " x " +
                                     std::to_string(T) + " tokens, the forward before it had " +
                                     std::to_string(ready_n) + " x " + std::to_string(ready_T));
  ready = false;  // the logits hold the loss gradient: one backward per forward
  wgrad_beta = sdk::first_grad_beta(host, step);
  lora_begin_pass(*this, step, true);  // the forward's masks again
  if (B > 0 && runs(L() + 1)) head_backward(step, B, T, loss_scale);
  check(host->grads_done(step, L() + 1));
  for (uint32_t l = L(); l-- > 0;) {
    if (B > 0 && runs(l + 1)) {
      const Set &s = sets[recompute ? 0 : l];
      if (recompute) layer_forward(step, l, s, B, T, false);
      layer_backward(step, l, s, B, T);
    }
    check(host->grads_done(step, l + 1));
  }
  if (B > 0 && runs(0) && trainable(embed)) {
    View ids(batch->inputs, {B * T}), dres_v = A(dres, {B * T, a.width});
    DLTensor g = grad(step, embed);
    check(ops->embedding_backward(host->ctx, ids.get(), dres_v.get(), &g));
  }
  check(host->grads_done(step, 0));
}

// ---- FLOPs ------------------------------------------------------------------

// Per sample of T tokens, what the step computes: for every matrix of n
// elements multiplied (the embedding table only where tied: a lookup is
// no FLOPs), 2 n T forward, 2 n T for its weight gradient when it trains
// and 2 n T for its input gradient where backward reaches its layer; and
// for the causal attention's scores and their use, 2 Hq D T^2 per layer
// forward and 4 Hq D T^2 backward where backward reaches it. With every
// parameter trainable: 6 N T + 6 L Hq D T^2. Frozen weights (freeze, or
// LoRA's base) thus count 4 n T, or 2 n T below the lowest trainable
// layer, and MFU is not overstated for them. The head's input gradient
// runs only where something below the head trains (head_backward).
double Llama::flops_per_sample() const {
  const double T = static_cast<double>(data_T);
  const uint32_t hi = a.tie ? embed : lm_head;
  double f = 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    if (infos[i].ndim < 2 || (i == embed && !a.tie)) continue;
    double n = 1;
    for (int32_t k = 0; k < infos[i].ndim; ++k) n *= static_cast<double>(infos[i].shape[k]);
    const bool reached =
        i == hi ? runs(L()) || trainable(final_norm) : runs(static_cast<int32_t>(infos[i].group));
    f += (2.0 + (trainable(static_cast<uint32_t>(i)) ? 2.0 : 0.0) + (reached ? 2.0 : 0.0)) * n * T;
  }
  for (int64_t l = 0; l < a.layers; ++l)
    f += (2.0 + (runs(l + 1) ? 4.0 : 0.0)) * static_cast<double>(QD()) * T * T;
  return f;
}

}  // namespace tessera::llama
