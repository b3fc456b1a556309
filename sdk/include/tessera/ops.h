/* The ops table: the numeric building blocks a model plugin computes with, so
 * one plugin runs on every device the host supports. Tensors are DLTensors;
 * the device of the tensors picks the implementation. Row-major, contiguous.
 * "rows" means the product of every dimension but the last. */
#ifndef TESSERA_OPS_H
#define TESSERA_OPS_H

#include <dlpack/dlpack.h>
#include <tessera/abi.h>

/* Element-wise activations. */
typedef int32_t tsr_activation;
#define TSR_ACT_NONE 0
#define TSR_ACT_RELU 1
#define TSR_ACT_GELU 2 /* tanh approximation, as GPT-2 and torch approximate="tanh" */
#define TSR_ACT_TANH 3

/* ABI 1.6: how rope_forward/backward compute inv_freq[i], i < D/2.
 * TSR_ROPE_DEFAULT: inv_freq[i] = theta^(-2i/D).
 * TSR_ROPE_LLAMA3 (Hugging Face's "llama3" rope_type): the default's
 * inv_freq, then with wavelen = 2 pi / inv_freq, lo = original_max /
 * low_freq_factor and hi = original_max / high_freq_factor: wavelen < hi
 * keeps inv_freq, wavelen > lo divides it by factor, and between the two
 * it is (1 - s) * inv_freq / factor + s * inv_freq with s = (original_max /
 * wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor).
 * Other rope types are not ops: a plugin refuses them. */
typedef int32_t tsr_rope_type;
#define TSR_ROPE_DEFAULT 0
#define TSR_ROPE_LLAMA3 1

typedef struct tsr_rope_params {
  size_t struct_size;
  tsr_rope_type type;
  double theta; /* rope_theta, e.g. 10000 or 500000 */
  /* TSR_ROPE_LLAMA3 only (ignored otherwise). */
  double factor;
  double low_freq_factor;
  double high_freq_factor;
  int64_t original_max_position_embeddings;
} tsr_rope_params;
#define tsr_rope_params_STRUCT_SIZE \
  TSR_STRUCT_SIZE(tsr_rope_params, original_max_position_embeddings)

typedef struct tsr_ops {
  size_t struct_size;

  /* c = alpha * op(a) @ op(b) + beta * c, op(x) = x or x^T. a is [.., k] viewed
   * as 2-D (rows, last dim); b is 2-D. */
  tsr_status (*matmul)(tsr_host_ctx *ctx, const DLTensor *a, int32_t trans_a, const DLTensor *b,
                       int32_t trans_b, DLTensor *c, float alpha, float beta);
  /* y[r, :] += bias[:] for every row r, then y = act(y). */
  tsr_status (*bias_act)(tsr_host_ctx *ctx, DLTensor *y, const DLTensor *bias, tsr_activation act);
  /* dbias[:] += sum over rows of dy[r, :]. */
  tsr_status (*bias_grad)(tsr_host_ctx *ctx, const DLTensor *dy, DLTensor *dbias);
  /* y = act(x); x and y may alias. */
  tsr_status (*act_forward)(tsr_host_ctx *ctx, tsr_activation act, const DLTensor *x, DLTensor *y);
  /* dx = dy * act'(x) where x is the activation's input (or, for relu and tanh,
   * `x` may be its output: pass `from_output` = 1). dx may alias dy. */
  tsr_status (*act_backward)(tsr_host_ctx *ctx, tsr_activation act, const DLTensor *x,
                             int32_t from_output, const DLTensor *dy, DLTensor *dx);
  /* Softmax cross-entropy over the last dim of logits [rows, classes] against
   * int32 targets [rows] (targets < 0 are ignored). Writes the loss summed
   * over counted rows to *loss_sum, the count to *count and, if correct is
   * non-NULL, how many rows have argmax == target. If dlogits is non-NULL it
   * receives grad_scale * (softmax - onehot) (zero for ignored rows); it may
   * alias logits. Columns at or past `valid_classes` (when > 0) are padding:
   * excluded from the softmax and given zero gradient. */
  tsr_status (*cross_entropy)(tsr_host_ctx *ctx, const DLTensor *logits, const DLTensor *targets,
                              int64_t valid_classes, float grad_scale, DLTensor *dlogits,
                              double *loss_sum, int64_t *count, int64_t *correct);
  /* Element-wise helpers. */
  tsr_status (*fill)(tsr_host_ctx *ctx, DLTensor *x, float value);
  tsr_status (*copy)(tsr_host_ctx *ctx, const DLTensor *src, DLTensor *dst);
  /* y = alpha * x + y */
  tsr_status (*axpy)(tsr_host_ctx *ctx, float alpha, const DLTensor *x, DLTensor *y);
  /* y = alpha * y */
  tsr_status (*scale)(tsr_host_ctx *ctx, float alpha, DLTensor *y);
  /* *out = sum of x^2 (accumulated in double on CPU). */
  tsr_status (*sum_squares)(tsr_host_ctx *ctx, const DLTensor *x, double *out);

  /* ---- ABI 1.1 (check TSR_HAS_FIELD(ops, tsr_ops, cast) first) ----
   * Dtypes: activations, parameters and their gradients are float32,
   * bfloat16 or float16 (the run's compute dtype); statistics (mean, rstd,
   * lse) are float32; ids are int32. Every reduction accumulates in float32
   * or wider whatever the dtype. Tensors are compact unless a comment says
   * strides are honoured. */

  /* y = x converted to y's dtype (float32, bfloat16, float16, any pair);
   * same element count. Rounds to nearest even. */
  tsr_status (*cast)(tsr_host_ctx *ctx, const DLTensor *x, DLTensor *y);
  /* c = act(op(a) @ op(b) + bias): the matmul with its epilogue fused where
   * the device can (cuBLASLt on CUDA). bias [n] may be NULL. `pre`, when not
   * NULL, receives op(a) @ op(b) + bias before the activation (gelu's
   * backward needs it). */
  tsr_status (*linear)(tsr_host_ctx *ctx, const DLTensor *a, int32_t trans_a, const DLTensor *b,
                       int32_t trans_b, const DLTensor *bias, tsr_activation act, DLTensor *c,
                       DLTensor *pre);
  /* Layer normalization over the last dim of x [rows, C]:
   * y = (x - mean) * rstd * weight + bias, with rstd = 1/sqrt(var + eps)
   * (biased variance). mean and rstd [rows] float32 are kept for backward. */
  tsr_status (*layernorm_forward)(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *weight,
                                  const DLTensor *bias, float eps, DLTensor *y, DLTensor *mean,
                                  DLTensor *rstd);
  /* Adds the input gradient into dx (so a residual stream's gradient
   * accumulates) and the parameter gradients into dweight and dbias. */
  tsr_status (*layernorm_backward)(tsr_host_ctx *ctx, const DLTensor *dy, const DLTensor *x,
                                   const DLTensor *weight, const DLTensor *mean,
                                   const DLTensor *rstd, DLTensor *dx, DLTensor *dweight,
                                   DLTensor *dbias);
  /* out[i, :] = table[ids[i], :] (accumulate = 0) or out[i, :] += table[ids[i], :]
   * (accumulate = 1), for int32 ids [rows] and table [vocab, C]. An id
   * outside [0, vocab) is an error (TSR_ERR_INVALID). */
  tsr_status (*embedding_forward)(tsr_host_ctx *ctx, const DLTensor *ids, const DLTensor *table,
                                  DLTensor *out, int32_t accumulate);
  /* dtable[ids[i], :] += dout[i, :]. */
  tsr_status (*embedding_backward)(tsr_host_ctx *ctx, const DLTensor *ids, const DLTensor *dout,
                                   DLTensor *dtable);
  /* Causal scaled dot-product attention per batch and head:
   * out = softmax(q k^T * scale, keys after the query masked) v.
   * q, k, v, out: [B, T, H, D]; strides are honoured (q, k and v may be
   * views into one fused [B, T, 3, H, D] buffer). lse [B, H, T] float32
   * receives each row's log-sum-exp of the scaled scores, for backward.
   * On CUDA the T x T score matrix is never materialised in memory. */
  tsr_status (*attention_forward)(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                  const DLTensor *v, float scale, DLTensor *out, DLTensor *lse);
  /* Writes (overwrites) dq, dk, dv [B, T, H, D] (strides honoured) from the
   * forward's inputs, out, lse and the output gradient dout. */
  tsr_status (*attention_backward)(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                   const DLTensor *v, const DLTensor *out, const DLTensor *dout,
                                   const DLTensor *lse, float scale, DLTensor *dq, DLTensor *dk,
                                   DLTensor *dv);

  /* ---- ABI 1.3: fused forms of 1.0/1.1 sequences, each giving what the
   * sequence gives to the rounding of the stored dtype (on the CPU exactly
   * it). Check TSR_HAS_FIELD(ops, tsr_ops, <member>) and the pointer; a host
   * without one leaves the plugin to call the sequence. ---- */

  /* r = x + y, then layernorm_forward of r into out, mean and rstd: the
   * residual add and the next normalization in one pass over memory. r is
   * stored in its dtype first and normalized as stored, so the result is
   * that of axpy(1, x, y -> r) and layernorm_forward(r). x, y, r and out
   * are [rows, C] of one dtype; r may alias x or y, out none of them. */
  tsr_status (*add_layernorm_forward)(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *y,
                                      const DLTensor *weight, const DLTensor *bias, float eps,
                                      DLTensor *r, DLTensor *out, DLTensor *mean, DLTensor *rstd);
  /* matmul (c = alpha * op(a) @ op(b) + beta * c) and, if dbias is not
   * NULL, dbias[:] += alpha * the sum over the rows of b [k, n]: a linear
   * layer's weight and bias gradients from one read of the output gradient
   * (dW = x^T @ dy: a = x, trans_a = 1, b = dy). trans_b must be 0 when
   * dbias is given. Equals matmul then bias_grad (for alpha = 1). */
  tsr_status (*matmul_bias_grad)(tsr_host_ctx *ctx, const DLTensor *a, int32_t trans_a,
                                 const DLTensor *b, int32_t trans_b, DLTensor *c, float alpha,
                                 float beta, DLTensor *dbias);
  /* c = act'(pre) * (op(a) @ op(b)) element-wise, overwriting c: the input
   * gradient of the next layer flowing back through linear's activation,
   * with pre the pre-activation linear kept (for TSR_ACT_NONE pre may be
   * NULL). If dbias is not NULL, dbias[:] += the sum over the rows of c:
   * that linear's bias gradient. Equals matmul, act_backward (from the
   * input) and bias_grad. c must not overlap a, b or pre. */
  tsr_status (*matmul_act_backward)(tsr_host_ctx *ctx, const DLTensor *a, int32_t trans_a,
                                    const DLTensor *b, int32_t trans_b, tsr_activation act,
                                    const DLTensor *pre, DLTensor *c, DLTensor *dbias);

  /* ---- ABI 1.4 (check TSR_HAS_FIELD(ops, tsr_ops, layernorm_backward_sum)
   * and the pointer, as for 1.3) ---- */

  /* layernorm_backward, then, if dsum is not NULL, dsum[:] += the column
   * sums of dx as stored after the addition: in a pre-norm transformer
   * that is the bias gradient of the linear layer whose output joined the
   * residual stream below this norm. Equals layernorm_backward then
   * bias_grad(dx, dsum). dsum has the last dim of x and overlaps none of
   * the others. */
  tsr_status (*layernorm_backward_sum)(tsr_host_ctx *ctx, const DLTensor *dy, const DLTensor *x,
                                       const DLTensor *weight, const DLTensor *mean,
                                       const DLTensor *rstd, DLTensor *dx, DLTensor *dweight,
                                       DLTensor *dbias, DLTensor *dsum);

  /* ---- ABI 1.6: the ops of Llama-family decoder blocks (check
   * TSR_HAS_FIELD(ops, tsr_ops, <member>) and the pointer, as for 1.3).
   * Statistics (rstd, lse) are float32; the CPU takes float32 tensors, CUDA
   * float32, bfloat16 and float16. docs/writing-a-model.md has the maths. ---- */

  /* RMS normalization over the last dim of x [rows, C], as Hugging Face's
   * Llama: rstd = 1/sqrt(mean(x^2) + eps) in float32, n = x * rstd rounded
   * to x's dtype, y = n * weight. rstd [rows] float32 is kept for backward.
   * y may alias x. */
  tsr_status (*rmsnorm_forward)(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *weight,
                                float eps, DLTensor *y, DLTensor *rstd);
  /* Adds the input gradient into dx and the weight gradient
   * (sum over rows of dy * x * rstd) into dweight:
   * dx += rstd * (w*dy - x*rstd * mean(w*dy * x*rstd)). dx may alias dy.
   * From ABI 1.11 dweight may be NULL: no weight gradient (a frozen
   * weight), dx alike; a 1.10 host refuses NULL. */
  tsr_status (*rmsnorm_backward)(tsr_host_ctx *ctx, const DLTensor *dy, const DLTensor *x,
                                 const DLTensor *weight, const DLTensor *rstd, DLTensor *dx,
                                 DLTensor *dweight);
  /* r = x + y stored in its dtype, then rmsnorm_forward(r) into out and
   * rstd: the residual add and the next norm in one pass. r may alias x or
   * y, out none of them. Its backward is rmsnorm_backward(dy, r, ...) with
   * dx the residual stream's gradient (which it adds into): that sum is
   * then the gradient of both x and y. */
  tsr_status (*add_rmsnorm_forward)(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *y,
                                    const DLTensor *weight, float eps, DLTensor *r, DLTensor *out,
                                    DLTensor *rstd);
  /* Rotary position embedding, Hugging Face's convention (rotate_half over
   * the two halves of each head, not interleaved pairs), in place on q
   * [B, T, Hq, D] and k [B, T, Hk, D] (either may be NULL; strides honoured
   * with unit stride along D, so they may be views into a fused qkv
   * buffer): for i < D/2, with a = positions[b, t] * inv_freq[i],
   *   x'[i]       = x[i] * cos a - x[i + D/2] * sin a
   *   x'[i + D/2] = x[i + D/2] * cos a + x[i] * sin a.
   * positions: int32 [B, T] (packed sequences may restart them). inv_freq
   * comes from *rope (tsr_rope_params) and D; angles, cos and sin are
   * computed in double and rounded to float32. D must be even. */
  tsr_status (*rope_forward)(tsr_host_ctx *ctx, const struct tsr_rope_params *rope,
                             const DLTensor *positions, DLTensor *q, DLTensor *k);
  /* The backward in place on dq and dk: the rotation by -a (its transpose). */
  tsr_status (*rope_backward)(tsr_host_ctx *ctx, const struct tsr_rope_params *rope,
                              const DLTensor *positions, DLTensor *dq, DLTensor *dk);
  /* SwiGLU's gate: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
   * gate, up, out [rows, F]; a 2-D tensor may have a row stride (strides[0]
   * >= F, strides[1] = 1), so gate and up may be the two halves of one
   * [rows, 2F] linear output. out may alias gate or up. */
  tsr_status (*swiglu_forward)(tsr_host_ctx *ctx, const DLTensor *gate, const DLTensor *up,
                               DLTensor *out);
  /* dgate = dout * up * silu'(gate), dup = dout * silu(gate), overwriting
   * (silu'(g) = s + g s (1 - s), s = sigmoid(g)). Same layouts as forward;
   * dgate may alias gate, dup may alias up. */
  tsr_status (*swiglu_backward)(tsr_host_ctx *ctx, const DLTensor *gate, const DLTensor *up,
                                const DLTensor *dout, DLTensor *dgate, DLTensor *dup);
  /* Causal attention with grouped key/value heads (GQA; MQA when Hk = 1;
   * MHA when Hk = Hq): q, out [B, T, Hq, D], k, v [B, T, Hk, D] with Hq a
   * multiple of Hk; query head h reads key/value head h / (Hq / Hk). D is
   * the tensors' last dim (a model's head_dim, not width / heads). Otherwise
   * as attention_forward: strides honoured, lse [B, Hq, T] float32. */
  tsr_status (*attention_gqa_forward)(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                      const DLTensor *v, float scale, DLTensor *out, DLTensor *lse);
  /* Writes dq [B, T, Hq, D] and dk, dv [B, T, Hk, D]; the gradient of a
   * key/value head is the sum over the query heads that share it. */
  tsr_status (*attention_gqa_backward)(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                       const DLTensor *v, const DLTensor *out, const DLTensor *dout,
                                       const DLTensor *lse, float scale, DLTensor *dq, DLTensor *dk,
                                       DLTensor *dv);

  /* ---- ABI 1.8: attention over packed sequences (check
   * TSR_HAS_FIELD(ops, tsr_ops, <member>) and the pointer, as for 1.3) ----
   * attention_gqa_forward/backward with document masking: positions int32
   * [B, T] gives each query its window, so query i of sequence b sees key j
   * iff i - positions[b, i] <= j <= i. With positions restarting at 0
   * where each packed example begins, attention never crosses examples and
   * each example's rows equal those of the example alone (positions 0..T-1
   * give plain causal attention). positions[b, i] must lie in [0, i]: the
   * CPU refuses others (TSR_ERR_INVALID), CUDA clamps them into it (a check
   * would cost a synchronisation). Otherwise as attention_gqa_*: shapes,
   * strides, lse [B, Hq, T] float32 (the log-sum-exp over the window). */
  tsr_status (*attention_packed_forward)(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                         const DLTensor *v, const DLTensor *positions, float scale,
                                         DLTensor *out, DLTensor *lse);
  tsr_status (*attention_packed_backward)(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                          const DLTensor *v, const DLTensor *positions,
                                          const DLTensor *out, const DLTensor *dout,
                                          const DLTensor *lse, float scale, DLTensor *dq,
                                          DLTensor *dk, DLTensor *dv);

  /* ---- ABI 1.9: dropout (check TSR_HAS_FIELD(ops, tsr_ops, dropout) and
   * the pointer, as for 1.3) ----
   * y = beta * y + x * keep / (1 - p), element by element over x's numel
   * (x and y compact, as many elements and the same dtype, element i of
   * one row-major order in both; y may be x; beta = 0 does
   * not read y). keep_i = (u_i >= p), u_i the i-th uniform in [0, 1) of
   * the stream (seed, stream): Philox4x32-10 with key {seed & 0xffffffff,
   * seed >> 32} and counter {lo32(i / 4), hi32(i / 4), lo32(stream),
   * hi32(stream)}, its output word i % 4 as w, u_i = (w >> 8) * 2^-24. The
   * same seed and stream draw the same mask on the CPU and on CUDA, in a
   * forward and in its recompute, so the op is its own backward:
   * dx = beta * dx + dropout(dy) with the forward's seed and stream. p in
   * [0, 1) (p = 0 keeps everything); 1 / (1 - p) is rounded to float32
   * and the arithmetic is float32, rounded once to y's dtype. */
  tsr_status (*dropout)(tsr_host_ctx *ctx, const DLTensor *x, float p, uint64_t seed,
                        uint64_t stream, float beta, DLTensor *y);

  /* ---- ABI 1.10: a low-rank product through dropout (check
   * TSR_HAS_FIELD(ops, tsr_ops, lowrank_dropout) and the pointer, as for
   * 1.3) ----
   * y = beta * y + dropout(a @ b): a [M, r], b [r, N], y [M, N], compact
   * row-major, one dtype, 1 <= r <= 256 (a LoRA adapter's rank). Element
   * (m, n) of the product is s = fma(a[m, r-1], b[r-1, n], ... fma(a[m, 0],
   * b[0, n], 0)) in float32, k rising, each step one fused multiply-add,
   * never rounded to y's dtype; then y[m, n] = beta * y[m, n] + keep * s /
   * (1 - p) as the dropout op computes it, with the dropout op's mask over
   * y's elements (element i = m * N + n of the stream (seed, stream)). So
   * the CPU and CUDA give the same float32 bits, and the result is what a
   * float32 matmul into a scratch followed by dropout(scratch, p, seed,
   * stream, beta, y) gives, without the scratch's round trip through
   * memory. p = 0 keeps every element; beta = 0 does not read y. LoRA's
   * backward with dropout is its use: dx += keep * (du A) / (1 - p). */
  tsr_status (*lowrank_dropout)(tsr_host_ctx *ctx, const DLTensor *a, const DLTensor *b, float p,
                                uint64_t seed, uint64_t stream, float beta, DLTensor *y);

  /* ---- ABI 1.12: SwiGLU's backward that gives its forward again (check
   * TSR_HAS_FIELD(ops, tsr_ops, swiglu_backward_out) and the pointer, as
   * for 1.3) ----
   * swiglu_backward's dgate and dup and, from the same reads of gate and
   * up, out = silu(gate) * up as swiglu_forward computes it: the same bits
   * as swiglu_forward followed by swiglu_backward, in one pass. For a
   * backward that did not keep the forward's output but still needs it
   * (the down projection's weight gradient) once dout is known. Layouts as
   * swiglu_backward (out [rows, F], a row stride allowed); dgate may alias
   * gate and dup up; out's bytes from its first element to its last must
   * not meet those of gate, up, dout, dgate or dup (an out interleaved with
   * another argument's rows is refused too). */
  tsr_status (*swiglu_backward_out)(tsr_host_ctx *ctx, const DLTensor *gate, const DLTensor *up,
                                    const DLTensor *dout, DLTensor *dgate, DLTensor *dup,
                                    DLTensor *out);
} tsr_ops;
#define tsr_ops_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_ops, swiglu_backward_out)

#endif /* TESSERA_OPS_H */
