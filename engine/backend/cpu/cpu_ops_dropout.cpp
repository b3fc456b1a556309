// CPU ops, dropout (ABI 1.9): y = beta * y + x * keep / (1 - p), the mask
// drawn from Philox4x32-10 by element index (util/philox.hpp, the layout in
// sdk ops.h), so it is the same mask the CUDA op draws and needs no
// storage: backward and a recomputed forward draw it again. Blocks of four
// elements (one Philox call each) on the ops' pool; the mask does not
// depend on how the blocks are split.
#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cpu/cpu_math.hpp"
#include "backend/cpu/cpu_ops_internal.hpp"
#include "backend/cpu/cpu_pool.hpp"
#include "util/error.hpp"
#include "util/philox.hpp"

namespace tessera::cpu {

namespace {

// Elements [i0, i1) of the tensor, i0 a multiple of 4.
TSR_OPS_CLONES void dropout_span(const float *x, float *y, int64_t i0, int64_t i1, float p,
                                 float scale, float beta, uint64_t seed, uint64_t stream) {
  for (int64_t i = i0; i < i1; i += 4) {
    const philox::Block b = philox::dropout_block(seed, stream, static_cast<uint64_t>(i) / 4);
    const int64_t n = i1 - i < 4 ? i1 - i : 4;
    for (int64_t k = 0; k < n; k++) {
      const float kept = philox::uniform24(b.w[k]) >= p ? x[i + k] * scale : 0.0f;
      // beta = 0 does not read y (it may hold anything, NaN included).
      y[i + k] = beta == 0.0f ? kept : beta * y[i + k] + kept;
    }
  }
}

}  // namespace

tsr_status dropout(tsr_host_ctx *ctx, const DLTensor *x, float p, uint64_t seed, uint64_t stream,
                   float beta, DLTensor *y) noexcept {
  return guarded(ctx, [&] {
    const char *op = "dropout";
    const Mat<float> X = f32(op, "x", x), Y = f32(op, "y", y);
    check_same_numel(op, "x", x, "y", y);
    TSR_CHECK(std::isfinite(p) && p >= 0.0f && p < 1.0f, TSR_ERR_INVALID,
              std::string(op) + ": p must lie in [0, 1), got " + std::to_string(p));
    TSR_CHECK(std::isfinite(beta), TSR_ERR_INVALID,
              std::string(op) + ": beta must be finite, got " + std::to_string(beta));
    const float scale = philox::dropout_scale(p);
    const int64_t n = X.numel(), quads = (n + 3) / 4;
    parallel_for(quads, 4096, [&](int64_t q0, int64_t q1) {
      dropout_span(X.p, Y.p, q0 * 4, std::min(n, q1 * 4), p, scale, beta, seed, stream);
    });
  });
}

}  // namespace tessera::cpu
