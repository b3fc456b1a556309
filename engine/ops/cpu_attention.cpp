// CPU causal attention (float32), forward and backward. It is also the
// reference the CUDA kernels are tested against. Per (batch, head), on the
// ops' thread pool: that head's keys and values are first copied into
// compact scratch (transposed where a loop runs over keys), so the inner
// loops are unit-stride and vectorize; the scores of one query row live in
// an O(T) buffer, never a T x T matrix. Strides of q, k, v, out and the
// gradients are honoured (q, k, v are usually views into one fused
// [B, T, 3, H, D] buffer). Each head is computed by one thread in a fixed
// order, so results do not depend on the number of threads.
#include <cmath>
#include <string>
#include <vector>

#include "ops/cpu_math.hpp"
#include "ops/cpu_ops_internal.hpp"
#include "ops/cpu_pool.hpp"
#include "util/error.hpp"

namespace tessera::cpu {
namespace {

// A [B, T, H, D] float32 view: element pointer and element strides.
struct V4 {
  float *p;
  int64_t sb, st, sh, sd;
  // Row t of head (b, h): element d is at row(...)[d * sd].
  float *row(int64_t b, int64_t t, int64_t h) const { return p + b * sb + t * st + h * sh; }
};

struct Dims {
  int64_t B, T, H, D;
};

std::string shape_of(const Dims &d) {
  // Appended piecewise: "[" + to_string(...) trips a GCC 12 -Wrestrict false positive.
  std::string s = "[";
  s += std::to_string(d.B) + "," + std::to_string(d.T) + "," + std::to_string(d.H) + ",";
  s += std::to_string(d.D);
  s += "]";
  return s;
}

// Checks a [B, T, H, D] float32 host tensor (strides honoured, NULL strides
// = compact). The first tensor checked (q, first = true) sets the dims.
V4 bthd(const char *op, const char *arg, const DLTensor *t, Dims &dims, bool first) {
  const std::string w = std::string(op) + ": " + arg + " ";
  TSR_CHECK(t != nullptr, TSR_ERR_INVALID, w + "is NULL");
  TSR_CHECK(t->device.device_type == kDLCPU || t->device.device_type == kDLCUDAHost,
            TSR_ERR_UNSUPPORTED,
            w + describe(t) + " is on device type " + std::to_string(t->device.device_type) +
                "; the CPU ops take host tensors");
  TSR_CHECK(t->dtype.code == kDLFloat && t->dtype.bits == 32 && t->dtype.lanes == 1,
            TSR_ERR_UNSUPPORTED, w + "must be float32, got " + describe(t));
  TSR_CHECK(t->ndim == 4 && t->shape != nullptr, TSR_ERR_INVALID,
            w + "must be 4-D [B, T, H, D], got " + describe(t));
  const Dims d{t->shape[0], t->shape[1], t->shape[2], t->shape[3]};
  TSR_CHECK(d.B >= 0 && d.T >= 0 && d.H >= 0 && d.D >= 0, TSR_ERR_INVALID,
            w + "has a negative dim: " + describe(t));
  if (first) {
    dims = d;
  } else {
    TSR_CHECK(d.B == dims.B && d.T == dims.T && d.H == dims.H && d.D == dims.D, TSR_ERR_INVALID,
              w + describe(t) + " does not match q's shape " + shape_of(dims));
  }
  V4 v{};
  if (t->strides) {
    for (int i = 0; i < 4; i++)
      TSR_CHECK(t->strides[i] >= 0, TSR_ERR_UNSUPPORTED, w + "has a negative stride");
    v.sb = t->strides[0], v.st = t->strides[1], v.sh = t->strides[2], v.sd = t->strides[3];
  } else {
    v.sd = 1, v.sh = d.D, v.st = d.H * d.D, v.sb = d.T * d.H * d.D;
  }
  const bool empty = d.B * d.T * d.H * d.D == 0;
  TSR_CHECK(empty || t->data != nullptr, TSR_ERR_INVALID, w + "has NULL data");
  v.p = reinterpret_cast<float *>(static_cast<char *>(t->data) + t->byte_offset);
  TSR_CHECK(reinterpret_cast<uintptr_t>(v.p) % alignof(float) == 0, TSR_ERR_INVALID,
            w + "is misaligned");
  return v;
}

// lse [B, H, T] float32, compact.
float *lse_view(const char *op, const DLTensor *t, const Dims &d) {
  const Mat<float> m = f32(op, "lse", t);
  TSR_CHECK(t->ndim == 3 && t->shape[0] == d.B && t->shape[1] == d.H && t->shape[2] == d.T,
            TSR_ERR_INVALID,
            std::string(op) + ": lse must be [B, H, T] = [" + std::to_string(d.B) + "," +
                std::to_string(d.H) + "," + std::to_string(d.T) + "], got " + describe(t));
  return m.p;
}

// Scratch for one head, per thread, grown on first use and then reused:
// no allocation per step.
float *scratch(size_t floats) {
  thread_local std::vector<float> buf;
  if (buf.size() < floats) buf.resize(floats);
  return buf.data();
}

// Copies head (b, h) of X into dst as [T][D] (row-major) or [D][T]
// (transposed), compact.
void gather(const V4 &X, int64_t b, int64_t h, const Dims &d, float *dst, bool transposed) {
  for (int64_t t = 0; t < d.T; t++) {
    const float *r = X.row(b, t, h);
    if (transposed)
      for (int64_t e = 0; e < d.D; e++) dst[e * d.T + t] = r[e * X.sd];
    else
      for (int64_t e = 0; e < d.D; e++) dst[t * d.D + e] = r[e * X.sd];
  }
}

// s[j] = sum_e q[e] kT[e][j] for j in [0, n): one query against n keys,
// unit-stride over keys. The sum runs over e in order for every j.
TSR_OPS_CLONES void scores(const float *q, const float *kT, int64_t T, int64_t D, int64_t n,
                           float *s) {
  for (int64_t j = 0; j < n; j++) s[j] = 0.0f;
  for (int64_t e = 0; e < D; e++) {
    const float qe = q[e];
    const float *kr = kT + e * T;
    for (int64_t j = 0; j < n; j++) s[j] += qe * kr[j];
  }
}

TSR_OPS_CLONES void forward_head(const V4 &Q, const V4 &K, const V4 &Vv, const V4 &O, float *L,
                                 const Dims &d, int64_t b, int64_t h, float scale) {
  const int64_t T = d.T, D = d.D;
  float *kT = scratch(static_cast<size_t>(2 * T * D + T + 2 * D));
  float *v = kT + T * D, *s = v + T * D, *q = s + T, *acc = q + D;
  gather(K, b, h, d, kT, true);
  gather(Vv, b, h, d, v, false);
  for (int64_t t = 0; t < T; t++) {
    const float *qr = Q.row(b, t, h);
    for (int64_t e = 0; e < D; e++) q[e] = qr[e * Q.sd] * scale;
    const int64_t n = t + 1;  // causal: keys 0..t
    scores(q, kT, T, D, n, s);
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) mx = s[j] > mx ? s[j] : mx;
    float sum8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
      for (int k = 0; k < 8; k++) sum8[k] += s[j + k] = exp_v(s[j + k] - mx);
    for (; j < n; j++) sum8[0] += s[j] = exp_v(s[j] - mx);
    const float sum =
        ((sum8[0] + sum8[1]) + (sum8[2] + sum8[3])) + ((sum8[4] + sum8[5]) + (sum8[6] + sum8[7]));
    for (int64_t e = 0; e < D; e++) acc[e] = 0.0f;
    for (j = 0; j < n; j++) {
      const float pj = s[j];
      const float *vr = v + j * D;
      for (int64_t e = 0; e < D; e++) acc[e] += pj * vr[e];
    }
    const float inv = 1.0f / sum;
    float *orow = O.row(b, t, h);
    for (int64_t e = 0; e < D; e++) orow[e * O.sd] = acc[e] * inv;
    L[(b * d.H + h) * T + t] = mx + std::log(sum);
  }
}

TSR_OPS_CLONES void backward_head(const V4 &Q, const V4 &K, const V4 &Vv, const V4 &O, const V4 &dO,
                                  const float *L, const V4 &dQ, const V4 &dK, const V4 &dV,
                                  const Dims &d, int64_t b, int64_t h, float scale) {
  const int64_t T = d.T, D = d.D;
  float *kT = scratch(static_cast<size_t>(5 * T * D + 2 * T + 3 * D));
  float *vT = kT + T * D, *k = vT + T * D, *dk = k + T * D, *dv = dk + T * D;
  float *s = dv + T * D, *dp = s + T, *q = dp + T, *dor = q + D, *acc = dor + D;
  gather(K, b, h, d, kT, true);
  gather(Vv, b, h, d, vT, true);
  gather(K, b, h, d, k, false);
  for (int64_t i = 0; i < 2 * T * D; i++) dk[i] = 0.0f;  // dk and dv, adjacent
  for (int64_t t = 0; t < T; t++) {
    const float *qr = Q.row(b, t, h), *dr = dO.row(b, t, h), *orow = O.row(b, t, h);
    // Di = dO_t . O_t, the softmax's own gradient correction.
    float di = 0.0f;
    for (int64_t e = 0; e < D; e++) {
      q[e] = qr[e * Q.sd];
      dor[e] = dr[e * dO.sd];
      di += dor[e] * orow[e * O.sd];
    }
    const float lt = L[(b * d.H + h) * T + t];
    const int64_t n = t + 1;
    // P recomputed from lse; dP = dO . v_j; dS = P (dP - Di), scaled.
    scores(q, kT, T, D, n, s);
    scores(dor, vT, T, D, n, dp);
    for (int64_t j = 0; j < n; j++) {
      const float pj = exp_v(scale * s[j] - lt);
      s[j] = pj;
      dp[j] = scale * (pj * (dp[j] - di));
    }
    for (int64_t e = 0; e < D; e++) acc[e] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
      const float pj = s[j], g = dp[j];
      const float *kr = k + j * D;
      float *dvr = dv + j * D, *dkr = dk + j * D;
      for (int64_t e = 0; e < D; e++) {
        dvr[e] += pj * dor[e];
        acc[e] += g * kr[e];
        dkr[e] += g * q[e];
      }
    }
    float *dqr = dQ.row(b, t, h);
    for (int64_t e = 0; e < D; e++) dqr[e * dQ.sd] = acc[e];
  }
  for (int64_t j = 0; j < T; j++) {
    float *kr = dK.row(b, j, h), *vr = dV.row(b, j, h);
    for (int64_t e = 0; e < D; e++) {
      kr[e * dK.sd] = dk[j * D + e];
      vr[e * dV.sd] = dv[j * D + e];
    }
  }
}

}  // namespace

tsr_status attention_forward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                             const DLTensor *v, float scale, DLTensor *out,
                             DLTensor *lse) noexcept {
  return guarded(ctx, [&] {
    const char *op = "attention_forward";
    Dims d{};
    const V4 Q = bthd(op, "q", q, d, true), K = bthd(op, "k", k, d, false),
             Vv = bthd(op, "v", v, d, false), O = bthd(op, "out", out, d, false);
    float *L = lse_view(op, lse, d);
    if (d.B * d.T * d.H == 0) return;
    parallel_for(d.B * d.H, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; i++) forward_head(Q, K, Vv, O, L, d, i / d.H, i % d.H, scale);
    });
  });
}

tsr_status attention_backward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                              const DLTensor *v, const DLTensor *out, const DLTensor *dout,
                              const DLTensor *lse, float scale, DLTensor *dq, DLTensor *dk,
                              DLTensor *dv) noexcept {
  return guarded(ctx, [&] {
    const char *op = "attention_backward";
    Dims d{};
    const V4 Q = bthd(op, "q", q, d, true), K = bthd(op, "k", k, d, false),
             Vv = bthd(op, "v", v, d, false), O = bthd(op, "out", out, d, false),
             dO = bthd(op, "dout", dout, d, false), dQ = bthd(op, "dq", dq, d, false),
             dK = bthd(op, "dk", dk, d, false), dV = bthd(op, "dv", dv, d, false);
    const float *L = lse_view(op, lse, d);
    if (d.B * d.T * d.H == 0) return;
    parallel_for(d.B * d.H, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; i++)
        backward_head(Q, K, Vv, O, dO, L, dQ, dK, dV, d, i / d.H, i % d.H, scale);
    });
  });
}

}  // namespace tessera::cpu
