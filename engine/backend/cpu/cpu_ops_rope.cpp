// CPU ops, rotary position embedding (ABI 1.6), Hugging Face's convention:
// each head's two halves rope_rotate together (rotate_half), not interleaved
// pairs. In place on q and k, which may be strided views into one fused
// qkv buffer. inv_freq comes from util/dltensor.hpp's rope_inv_freq (shared
// with the CUDA ops); each token's angles are position * inv_freq in
// double, their cos and sin rounded to float32, and the rotation computed
// in double from those and rounded once.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_math.hpp"
#include "backend/cpu/cpu_ops_internal.hpp"
#include "backend/cpu/cpu_pool.hpp"
#include "util/error.hpp"

namespace tessera::cpu {

namespace {

// One [B, T, H, D] float32 view with unit stride along D.
struct RopeHeads {
  float *p = nullptr;
  int64_t B = 0, T = 0, H = 0, D = 0;
  int64_t sb = 0, st = 0, sh = 0;
  float *row(int64_t b, int64_t t, int64_t h) const { return p + b * sb + t * st + h * sh; }
};

RopeHeads rope_heads(const char *op, const char *arg, const DLTensor *t) {
  const std::string w = std::string(op) + ": " + arg + " ";
  TSR_CHECK(t->device.device_type == kDLCPU || t->device.device_type == kDLCUDAHost,
            TSR_ERR_UNSUPPORTED,
            w + describe(t) + " is on device type " + std::to_string(t->device.device_type) +
                "; the CPU ops take host tensors");
  TSR_CHECK(t->dtype.code == kDLFloat && t->dtype.bits == 32 && t->dtype.lanes == 1,
            TSR_ERR_UNSUPPORTED, w + "must be float32, got " + describe(t));
  TSR_CHECK(t->ndim == 4 && t->shape != nullptr, TSR_ERR_INVALID,
            w + "must be 4-D [B, T, H, D], got " + describe(t));
  RopeHeads v;
  v.B = t->shape[0], v.T = t->shape[1], v.H = t->shape[2], v.D = t->shape[3];
  TSR_CHECK(v.B >= 0 && v.T >= 0 && v.H >= 0 && v.D >= 0, TSR_ERR_INVALID,
            w + "has a negative dim: " + describe(t));
  if (t->strides) {
    TSR_CHECK(v.D <= 1 || t->strides[3] == 1, TSR_ERR_UNSUPPORTED,
              w + describe(t) + " must have unit stride along D");
    for (int i = 0; i < 3; i++)
      TSR_CHECK(t->strides[i] >= 0, TSR_ERR_UNSUPPORTED, w + "has a negative stride");
    v.sb = t->strides[0], v.st = t->strides[1], v.sh = t->strides[2];
  } else {
    v.sh = v.D, v.st = v.H * v.D, v.sb = v.T * v.H * v.D;
  }
  TSR_CHECK(v.B * v.T * v.H * v.D == 0 || t->data != nullptr, TSR_ERR_INVALID, w + "has NULL data");
  v.p = reinterpret_cast<float *>(static_cast<char *>(t->data) + t->byte_offset);
  TSR_CHECK(reinterpret_cast<uintptr_t>(v.p) % alignof(float) == 0, TSR_ERR_INVALID,
            w + "is misaligned");
  return v;
}

// Rotates `heads` head rows from x, `stride` apart, by the angles whose
// cos and sin are c[i], s[i] (sign = +1 forward, -1 for the transpose).
TSR_OPS_CLONES void rope_rotate(float *x, int64_t heads, int64_t stride, const float *c,
                                const float *s, int64_t half, double sign) {
  for (int64_t h = 0; h < heads; h++, x += stride)
    for (int64_t i = 0; i < half; i++) {
      const double x1 = x[i], x2 = x[i + half], ci = c[i], si = sign * s[i];
      x[i] = static_cast<float>(x1 * ci - x2 * si);
      x[i + half] = static_cast<float>(x2 * ci + x1 * si);
    }
}

// The cos and sin of position `pos`'s angles pos * inv[j], rounded to float.
void rope_angles(double pos, const std::vector<double> &inv, int64_t half, float *c, float *s) {
  for (int64_t j = 0; j < half; j++) {
    const double a = pos * inv[j];
    c[j] = static_cast<float>(std::cos(a));
    s[j] = static_cast<float>(std::sin(a));
  }
}

// cos and sin per position 0..rows-1, each row `half` wide.
struct CosSin {
  int64_t rows = 0;
  std::vector<float> cos, sin;
};

// A batch's positions repeat (0..T-1 in every sequence; packed examples
// restart at 0), so the angles of each distinct position are computed once
// here instead of once per token: B times fewer cos/sin. Only when every
// position lies in [0, tokens); otherwise (rows = 0) each token computes
// its own. The values are the same either way.
CosSin rope_table(const int32_t *pos, int64_t tokens, const std::vector<double> &inv,
                  int64_t half) {
  int32_t lo = pos[0], hi = pos[0];
  for (int64_t i = 1; i < tokens; i++) lo = std::min(lo, pos[i]), hi = std::max(hi, pos[i]);
  CosSin t;
  if (lo < 0 || hi >= tokens) return t;
  t.rows = static_cast<int64_t>(hi) + 1;
  t.cos.resize(static_cast<size_t>(t.rows * half));
  t.sin.resize(t.cos.size());
  parallel_for(t.rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++)
      rope_angles(static_cast<double>(r), inv, half, t.cos.data() + r * half,
                  t.sin.data() + r * half);
  });
  return t;
}

void rope_apply(const char *op, const tsr_rope_params *rp, const DLTensor *positions, DLTensor *q,
                DLTensor *k, double sign) {
  TSR_CHECK(q || k, TSR_ERR_INVALID, std::string(op) + ": q and k are both NULL");
  RopeHeads Q, K;
  if (q) Q = rope_heads(op, sign > 0 ? "q" : "dq", q);
  if (k) K = rope_heads(op, sign > 0 ? "k" : "dk", k);
  const RopeHeads &first = q ? Q : K;
  if (q && k)
    TSR_CHECK(K.B == Q.B && K.T == Q.T && K.D == Q.D, TSR_ERR_INVALID,
              std::string(op) + ": " + (sign > 0 ? "k " : "dk ") + describe(k) +
                  " must match the B, T and D of " + (sign > 0 ? "q " : "dq ") + describe(q));
  const Mat<int32_t> P = i32(op, "positions", positions);
  TSR_CHECK(
      positions->ndim == 2 && positions->shape[0] == first.B && positions->shape[1] == first.T,
      TSR_ERR_INVALID,
      std::string(op) + ": positions " + describe(positions) + " must be [B, T] = [" +
          std::to_string(first.B) + "," + std::to_string(first.T) + "]");
  const std::vector<double> inv = rope_inv_freq(op, rp, first.D);
  const int64_t half = first.D / 2, tokens = first.B * first.T;
  if (tokens == 0 || half == 0) return;
  const CosSin table = rope_table(P.p, tokens, inv, half);
  parallel_for(tokens, 16, [&](int64_t i0, int64_t i1) {
    std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
    for (int64_t i = i0; i < i1; i++) {
      const int64_t b = i / first.T, t = i % first.T;
      const float *ci = c.data(), *si = s.data();
      if (table.rows > 0) {
        ci = table.cos.data() + P.p[i] * half;
        si = table.sin.data() + P.p[i] * half;
      } else {
        rope_angles(P.p[i], inv, half, c.data(), s.data());
      }
      if (q) rope_rotate(Q.row(b, t, 0), Q.H, Q.sh, ci, si, half, sign);
      if (k) rope_rotate(K.row(b, t, 0), K.H, K.sh, ci, si, half, sign);
    }
  });
}

}  // namespace

tsr_status rope_forward(tsr_host_ctx *ctx, const tsr_rope_params *rope_params,
                        const DLTensor *positions, DLTensor *q, DLTensor *k) noexcept {
  return guarded(ctx, [&] { rope_apply("rope_forward", rope_params, positions, q, k, 1.0); });
}

tsr_status rope_backward(tsr_host_ctx *ctx, const tsr_rope_params *rope_params,
                         const DLTensor *positions, DLTensor *dq, DLTensor *dk) noexcept {
  return guarded(ctx, [&] { rope_apply("rope_backward", rope_params, positions, dq, dk, -1.0); });
}

}  // namespace tessera::cpu
