// Private to the CPU ops: the tensor checks shared by the cpu_ops*.cpp files,
// and the entries each of them contributes to the table in cpu_ops.cpp.
#pragma once

#include <dlpack/dlpack.h>
#include <tessera/ops.h>

#include <cstdint>
#include <string>

#include "util/dltensor.hpp"

namespace tessera::cpu {

// A tensor viewed as a row-major matrix: rows = product of every dim but the
// last, cols = the last dim. A 0-D tensor is a 1x1 matrix.
template <typename T>
struct Mat {
  T *p;
  int64_t rows;
  int64_t cols;
  int64_t numel() const { return rows * cols; }
};

// describe(t) ("float32[4,8]") and check_activation come from
// util/dltensor.hpp, shared with the CUDA ops.

// Checks that t is a non-NULL, compact, suitably aligned float32 (or int32)
// tensor in host memory (kDLCPU or kDLCUDAHost) and returns its matrix view; throws tessera::Error
// naming `op` and `arg` otherwise. `min_ndim` rejects tensors of fewer dims.
Mat<float> f32(const char *op, const char *arg, const DLTensor *t, int min_ndim = 0);
Mat<int32_t> i32(const char *op, const char *arg, const DLTensor *t, int min_ndim = 0);

// A host tensor of any dtype whose elements are whole bytes, as raw memory:
// for the ops that move or convert bytes (copy, cast) rather than compute in
// float32. Same checks as f32() but the dtype's.
struct Flat {
  void *p;
  int64_t numel;
  DLDataType dtype;
  size_t elem_bytes;
};
Flat flat(const char *op, const char *arg, const DLTensor *t);

// Throws unless a and b hold the same number of (float32) elements.
void check_same_numel(const char *op, const char *a_name, const DLTensor *a, const char *b_name,
                      const DLTensor *b);

// c = alpha * op(a) @ op(b) + beta * c through OpenBLAS, with matmul's checks;
// throws tessera::Error with messages naming `op` (matmul, linear).
void gemm(const char *op, const DLTensor *a, int32_t trans_a, const DLTensor *b, int32_t trans_b,
          DLTensor *c, float alpha, float beta);

// g[j] += scale * sum over the rows of d[:, j], summed in double
// (cpu_ops_nn.cpp): bias_grad with scale 1, and matmul_bias_grad's alpha.
void add_col_sums(const Mat<float> &d, const Mat<float> &g, double scale);

// Entries defined in cpu_ops_nn.cpp.
tsr_status bias_act(tsr_host_ctx *ctx, DLTensor *y, const DLTensor *bias,
                    tsr_activation act) noexcept;
tsr_status bias_grad(tsr_host_ctx *ctx, const DLTensor *dy, DLTensor *dbias) noexcept;
tsr_status act_forward(tsr_host_ctx *ctx, tsr_activation act, const DLTensor *x,
                       DLTensor *y) noexcept;
tsr_status act_backward(tsr_host_ctx *ctx, tsr_activation act, const DLTensor *x,
                        int32_t from_output, const DLTensor *dy, DLTensor *dx) noexcept;
tsr_status cross_entropy(tsr_host_ctx *ctx, const DLTensor *logits, const DLTensor *targets,
                         int64_t valid_classes, float grad_scale, DLTensor *dlogits,
                         double *loss_sum, int64_t *count, int64_t *correct) noexcept;

// ABI 1.1 entries, one file each: cpu_ops_cast.cpp, cpu_ops_linear.cpp,
// cpu_ops_layernorm.cpp, cpu_ops_embedding.cpp; the ABI 1.3 ones beside
// the 1.1 op they fuse with (add_layernorm_forward in cpu_ops_layernorm.cpp,
// the matmul_* pair in cpu_ops_linear.cpp).
tsr_status cast(tsr_host_ctx *ctx, const DLTensor *x, DLTensor *y) noexcept;
tsr_status linear(tsr_host_ctx *ctx, const DLTensor *a, int32_t trans_a, const DLTensor *b,
                  int32_t trans_b, const DLTensor *bias, tsr_activation act, DLTensor *c,
                  DLTensor *pre) noexcept;
tsr_status layernorm_forward(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *weight,
                             const DLTensor *bias, float eps, DLTensor *y, DLTensor *mean,
                             DLTensor *rstd) noexcept;
tsr_status layernorm_backward(tsr_host_ctx *ctx, const DLTensor *dy, const DLTensor *x,
                              const DLTensor *weight, const DLTensor *mean, const DLTensor *rstd,
                              DLTensor *dx, DLTensor *dweight, DLTensor *dbias) noexcept;
tsr_status add_layernorm_forward(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *y,
                                 const DLTensor *weight, const DLTensor *bias, float eps,
                                 DLTensor *r, DLTensor *out, DLTensor *mean,
                                 DLTensor *rstd) noexcept;
tsr_status matmul_bias_grad(tsr_host_ctx *ctx, const DLTensor *a, int32_t trans_a,
                            const DLTensor *b, int32_t trans_b, DLTensor *c, float alpha,
                            float beta, DLTensor *dbias) noexcept;
tsr_status matmul_act_backward(tsr_host_ctx *ctx, const DLTensor *a, int32_t trans_a,
                               const DLTensor *b, int32_t trans_b, tsr_activation act,
                               const DLTensor *pre, DLTensor *c, DLTensor *dbias) noexcept;
tsr_status layernorm_backward_sum(tsr_host_ctx *ctx, const DLTensor *dy, const DLTensor *x,
                                  const DLTensor *weight, const DLTensor *mean,
                                  const DLTensor *rstd, DLTensor *dx, DLTensor *dweight,
                                  DLTensor *dbias, DLTensor *dsum) noexcept;
tsr_status embedding_forward(tsr_host_ctx *ctx, const DLTensor *ids, const DLTensor *table,
                             DLTensor *out, int32_t accumulate) noexcept;
tsr_status embedding_backward(tsr_host_ctx *ctx, const DLTensor *ids, const DLTensor *dout,
                              DLTensor *dtable) noexcept;

// cpu_attention.cpp: causal attention, float32, strides honoured. Same
// signatures as tsr_ops.attention_forward/backward.
tsr_status attention_forward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                             const DLTensor *v, float scale, DLTensor *out, DLTensor *lse) noexcept;
tsr_status attention_backward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                              const DLTensor *v, const DLTensor *out, const DLTensor *dout,
                              const DLTensor *lse, float scale, DLTensor *dq, DLTensor *dk,
                              DLTensor *dv) noexcept;

// ABI 1.6, the decoder-block ops: cpu_ops_rmsnorm.cpp, cpu_ops_rope.cpp,
// cpu_ops_swiglu.cpp, and attention_gqa_* in cpu_attention.cpp.
tsr_status rmsnorm_forward(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *weight, float eps,
                           DLTensor *y, DLTensor *rstd) noexcept;
tsr_status rmsnorm_backward(tsr_host_ctx *ctx, const DLTensor *dy, const DLTensor *x,
                            const DLTensor *weight, const DLTensor *rstd, DLTensor *dx,
                            DLTensor *dweight) noexcept;
tsr_status add_rmsnorm_forward(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *y,
                               const DLTensor *weight, float eps, DLTensor *r, DLTensor *out,
                               DLTensor *rstd) noexcept;
tsr_status rope_forward(tsr_host_ctx *ctx, const tsr_rope_params *rope, const DLTensor *positions,
                        DLTensor *q, DLTensor *k) noexcept;
tsr_status rope_backward(tsr_host_ctx *ctx, const tsr_rope_params *rope, const DLTensor *positions,
                         DLTensor *dq, DLTensor *dk) noexcept;
tsr_status swiglu_forward(tsr_host_ctx *ctx, const DLTensor *gate, const DLTensor *up,
                          DLTensor *out) noexcept;
tsr_status swiglu_backward(tsr_host_ctx *ctx, const DLTensor *gate, const DLTensor *up,
                           const DLTensor *dout, DLTensor *dgate, DLTensor *dup) noexcept;
tsr_status swiglu_backward_out(tsr_host_ctx *ctx, const DLTensor *gate, const DLTensor *up,
                               const DLTensor *dout, DLTensor *dgate, DLTensor *dup,
                               DLTensor *out) noexcept;
tsr_status attention_gqa_forward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                 const DLTensor *v, float scale, DLTensor *out,
                                 DLTensor *lse) noexcept;
tsr_status attention_gqa_backward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                  const DLTensor *v, const DLTensor *out, const DLTensor *dout,
                                  const DLTensor *lse, float scale, DLTensor *dq, DLTensor *dk,
                                  DLTensor *dv) noexcept;
// ABI 1.8: attention_gqa_* with document masking by positions
// (cpu_attention.cpp).
tsr_status attention_packed_forward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                    const DLTensor *v, const DLTensor *positions, float scale,
                                    DLTensor *out, DLTensor *lse) noexcept;
tsr_status attention_packed_backward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                     const DLTensor *v, const DLTensor *positions,
                                     const DLTensor *out, const DLTensor *dout, const DLTensor *lse,
                                     float scale, DLTensor *dq, DLTensor *dk,
                                     DLTensor *dv) noexcept;
// ABI 1.9 (cpu_ops_dropout.cpp).
tsr_status dropout(tsr_host_ctx *ctx, const DLTensor *x, float p, uint64_t seed, uint64_t stream,
                   float beta, DLTensor *y) noexcept;
// ABI 1.10 (cpu_ops_dropout.cpp).
tsr_status lowrank_dropout(tsr_host_ctx *ctx, const DLTensor *a, const DLTensor *b, float p,
                           uint64_t seed, uint64_t stream, float beta, DLTensor *y) noexcept;

}  // namespace tessera::cpu
