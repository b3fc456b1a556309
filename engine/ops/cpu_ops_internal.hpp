// Private to the CPU ops: the tensor checks shared by cpu_ops.cpp and
// cpu_ops_nn.cpp, and the entries cpu_ops_nn.cpp contributes to the table.
#pragma once

#include <dlpack/dlpack.h>
#include <tessera/ops.h>

#include <cstdint>
#include <string>

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

// "float32[4,8]", for messages.
std::string describe(const DLTensor *t);

// Checks that t is a non-NULL, compact, suitably aligned float32 (or int32)
// tensor on kDLCPU and returns its matrix view; throws tessera::Error naming
// `op` and `arg` otherwise. `min_ndim` rejects tensors of fewer dims.
Mat<float> f32(const char *op, const char *arg, const DLTensor *t, int min_ndim = 0);
Mat<int32_t> i32(const char *op, const char *arg, const DLTensor *t, int min_ndim = 0);

// Throws unless a and b hold the same number of elements.
void check_same_numel(const char *op, const char *a_name, const DLTensor *a, const char *b_name,
                      const DLTensor *b);

// Throws unless act is one of TSR_ACT_*.
void check_activation(const char *op, tsr_activation act);

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

}  // namespace tessera::cpu
