// The SDK's tensor and op arguments in words and checks that every backend's
// ops share (backend/cpu, backend/cuda): one description of a DLTensor in
// messages, one activation check, the rotary embedding's frequencies, the
// dropout ops' arguments, the low-rank product's shapes and an output's
// overlap with the inputs, so a CPU and a CUDA call of an op refuse and
// compute alike.
#pragma once

#include <dlpack/dlpack.h>
#include <tessera/ops.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

// "float32[4,8]", "bfloat16[2,3]", "NULL": for messages.
std::string describe(const DLTensor *t);

// Throws tessera::Error (TSR_ERR_INVALID) naming `op` unless act is one of
// TSR_ACT_*.
void check_activation(const char *op, tsr_activation act);

// inv_freq[i], i < head_dim / 2, of rope type `p->type` (ops.h,
// tsr_rope_params), in double. Throws naming `op` for a NULL or short
// struct, an unknown type, an odd or non-positive head_dim, or parameters
// outside their domain (theta <= 1, factor <= 0, low >= high frequency
// factor, original context <= 0).
std::vector<double> rope_inv_freq(const char *op, const tsr_rope_params *p, int64_t head_dim);

// The dropout ops' p and beta (ops.h, ABI 1.9 and 1.10): finite, p in
// [0, 1). Throws naming `op` otherwise.
void check_dropout_args(const char *op, float p, float beta);

// Throws tessera::Error (TSR_ERR_INVALID) naming `op` and the tensors where
// `out` shares a byte with one of `inputs` (name, tensor; NULL skipped):
// each tensor's bytes from its first element to one past its last, by
// shape, strides (elements, NULL: compact), dtype and byte_offset; empty
// tensors share nothing. For ops whose output must be a buffer of its own.
void check_apart(const char *op, const char *out_name, const DLTensor *out,
                 std::initializer_list<std::pair<const char *, const DLTensor *>> inputs);

// The largest rank lowrank_dropout takes (ops.h, ABI 1.10).
constexpr int64_t kLowrankMaxRank = 256;

// lowrank_dropout's shapes: a [M, r], b [r, N], y [M, N] (each 2-D), 1 <=
// r <= kLowrankMaxRank. Throws naming `op` and the tensor otherwise; the
// dtype, device and layout checks stay the backend's.
void check_lowrank_shapes(const char *op, const DLTensor *a, const DLTensor *b, const DLTensor *y);

}  // namespace tessera
