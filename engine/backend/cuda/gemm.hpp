// Private to the CUDA matmuls: the checked problem of one matmul and the
// cuBLASLt call with an epilogue, defined in ops_matmul.cpp (which has the
// handle, the workspace and the plan cache) and shared with the backward
// epilogues of ops_matmul_grad.cpp. Row-major tensors meet column-major
// cuBLASLt as the top of ops_matmul.cpp explains: our b is cuBLASLt's "A",
// our a its "B", and our c [m, n] its n x m D.
#pragma once

#include <cublasLt.h>

#include <cstdint>

#include "backend/cuda/cuda_ops_internal.hpp"

namespace tessera::cuda {

// The checked operands of one matmul: op(a) is m x k, op(b) k x n, c m x n.
struct Gemm {
  View a, b, c;
  int32_t ta, tb;
  int64_t m, n, k;
};

// True when the two views share any byte.
bool overlaps(const View &x, const View &y);

// matmul's checks under the name `op`: floating a, b (2-D), c of matching
// shapes, a and b of one dtype, c of theirs or float32, c overlapping
// neither. Throws tessera::Error.
Gemm check_gemm(const char *op, const DLTensor *a, int32_t trans_a, const DLTensor *b,
                int32_t trans_b, const DLTensor *c);

// d = alpha * op(a) op(b) + beta * d with cuBLASLt's `epilogue` (bias and
// aux as it needs). d has c's shape and dtype (it is c, or linear's pre).
// Returns false, having done nothing, when cuBLASLt offers no algorithm for
// the combination (counted in epilogue_misses unless the epilogue is
// DEFAULT). Needs k > 0.
bool run_gemm(const Gemm &g, void *d, float alpha, float beta, cublasLtEpilogue_t epilogue,
              const void *bias, void *aux, int64_t aux_ld);

// d = alpha * op(a) op(b) + beta * d, no epilogue; k == 0 handled by hand
// (a zero-width operand is not a valid cuBLASLt layout). Throws when
// cuBLASLt has no algorithm at all.
void plain_gemm(const char *op, const Gemm &g, const View &d, float alpha, float beta);

// How many matmul problems asked for a fused epilogue that cuBLASLt had no
// algorithm for, since the process started (one per distinct problem: the
// answer is cached with the plan, so later calls are not counted again).
uint64_t epilogue_misses();

}  // namespace tessera::cuda
