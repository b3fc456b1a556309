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
} tsr_ops;

#endif /* TESSERA_OPS_H */
