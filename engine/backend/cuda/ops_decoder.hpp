// The CUDA entries of ABI 1.6, the ops of Llama-family decoder blocks:
// ops_rmsnorm.cu, ops_rope.cu, ops_swiglu.cu and attention_gqa.cpp (cuDNN
// where it takes the call, the engine's kernels otherwise), with 1.8's
// packed attention, 1.9's dropout and 1.10's lowrank_dropout. Same signatures as the tsr_ops
// members; semantics follow the CPU ops.
#pragma once

#include <dlpack/dlpack.h>
#include <tessera/ops.h>

#include "backend/cuda/attention.cuh"

namespace tessera::cuda {

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
// (attention_gqa.cpp, the engine's kernels).
tsr_status attention_packed_forward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                    const DLTensor *v, const DLTensor *positions, float scale,
                                    DLTensor *out, DLTensor *lse) noexcept;
tsr_status attention_packed_backward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                     const DLTensor *v, const DLTensor *positions,
                                     const DLTensor *out, const DLTensor *dout, const DLTensor *lse,
                                     float scale, DLTensor *dq, DLTensor *dk,
                                     DLTensor *dv) noexcept;

// ABI 1.9: dropout by Philox4x32-10 (ops_dropout.cu), the CPU's mask.
tsr_status dropout(tsr_host_ctx *ctx, const DLTensor *x, float p, uint64_t seed, uint64_t stream,
                   float beta, DLTensor *y) noexcept;
// ABI 1.10: y = beta * y + dropout(a @ b) for a low rank (ops_dropout.cu).
tsr_status lowrank_dropout(tsr_host_ctx *ctx, const DLTensor *a, const DLTensor *b, float p,
                           uint64_t seed, uint64_t stream, float beta, DLTensor *y) noexcept;

// attention_gqa_kernels.cu, on the compute stream: dst [B, T, H, D]
// compact (dt) = src [B, T, H / group, D] with each head repeated `group`
// times; and dst [B, T, Hk, D] (strided) = the sums over each group of
// `group` consecutive heads of src [B, T, Hk * group, D] compact.
void launch_gqa_expand(const attn::Bthd &src, attn::Dt dt, void *dst, int64_t B, int64_t T,
                       int64_t H, int64_t D, int64_t group);
void launch_gqa_group_sum(const void *src, attn::Dt dt, const attn::Bthd &dst, int64_t B, int64_t T,
                          int64_t Hk, int64_t D, int64_t group);

}  // namespace tessera::cuda
