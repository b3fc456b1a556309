// CPU causal attention (float32), forward and backward. The reference the
// CUDA kernels are tested against, so it stays plain: per (batch, head) and
// query row, the scores of keys 0..t go into an O(T) buffer, never a T x T
// matrix. Strides are honoured (q, k, v are usually views into one fused
// [B, T, 3, H, D] buffer), which is why rows are walked through pointers and
// strides rather than compact loops.
#include <cmath>
#include <string>
#include <vector>

#include "ops/cpu_ops_internal.hpp"
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

float dot(const float *a, int64_t sa, const float *b, int64_t sb, int64_t n) {
  float s = 0.0f;
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
  } else {
    for (int64_t i = 0; i < n; i++) s += a[i * sa] * b[i * sb];
  }
  return s;
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
    // Scores of one query row against keys 0..t, and its output accumulated
    // compactly before the (possibly strided) store.
    std::vector<float> p(static_cast<size_t>(d.T)), acc(static_cast<size_t>(d.D));
    for (int64_t b = 0; b < d.B; b++) {
      for (int64_t h = 0; h < d.H; h++) {
        for (int64_t t = 0; t < d.T; t++) {
          const float *qr = Q.row(b, t, h);
          float mx = -INFINITY;
          for (int64_t j = 0; j <= t; j++) {
            p[j] = scale * dot(qr, Q.sd, K.row(b, j, h), K.sd, d.D);
            mx = std::fmax(mx, p[j]);
          }
          float sum = 0.0f;
          for (int64_t j = 0; j <= t; j++) {
            p[j] = std::exp(p[j] - mx);
            sum += p[j];
          }
          for (int64_t e = 0; e < d.D; e++) acc[e] = 0.0f;
          for (int64_t j = 0; j <= t; j++) {
            const float *vr = Vv.row(b, j, h);
            const float pj = p[j];
            for (int64_t e = 0; e < d.D; e++) acc[e] += pj * vr[e * Vv.sd];
          }
          const float inv = 1.0f / sum;
          float *orow = O.row(b, t, h);
          for (int64_t e = 0; e < d.D; e++) orow[e * O.sd] = acc[e] * inv;
          L[(b * d.H + h) * d.T + t] = mx + std::log(sum);
        }
      }
    }
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
    std::vector<float> ds(static_cast<size_t>(d.T)), acc(static_cast<size_t>(d.D));
    for (int64_t b = 0; b < d.B; b++) {
      for (int64_t h = 0; h < d.H; h++) {
        // dk and dv accumulate over query rows: clear this head's rows first.
        for (int64_t j = 0; j < d.T; j++) {
          float *kr = dK.row(b, j, h), *vr = dV.row(b, j, h);
          for (int64_t e = 0; e < d.D; e++) kr[e * dK.sd] = vr[e * dV.sd] = 0.0f;
        }
        for (int64_t t = 0; t < d.T; t++) {
          const float *qr = Q.row(b, t, h), *dor = dO.row(b, t, h);
          // Di = dO_t . O_t, the softmax's own gradient correction.
          const float di = dot(dor, dO.sd, O.row(b, t, h), O.sd, d.D);
          const float lt = L[(b * d.H + h) * d.T + t];
          for (int64_t e = 0; e < d.D; e++) acc[e] = 0.0f;
          for (int64_t j = 0; j <= t; j++) {
            // P recomputed from lse; dP = dO . v_j; dS = P (dP - Di).
            const float pj = std::exp(scale * dot(qr, Q.sd, K.row(b, j, h), K.sd, d.D) - lt);
            const float dpj = dot(dor, dO.sd, Vv.row(b, j, h), Vv.sd, d.D);
            ds[j] = pj * (dpj - di);
            float *vr = dV.row(b, j, h);
            for (int64_t e = 0; e < d.D; e++) vr[e * dV.sd] += pj * dor[e * dO.sd];
          }
          for (int64_t j = 0; j <= t; j++) {
            const float g = scale * ds[j];
            const float *kr = K.row(b, j, h);
            float *dkr = dK.row(b, j, h);
            for (int64_t e = 0; e < d.D; e++) {
              acc[e] += g * kr[e * K.sd];
              dkr[e * dK.sd] += g * qr[e * Q.sd];
            }
          }
          float *dqr = dQ.row(b, t, h);
          for (int64_t e = 0; e < d.D; e++) dqr[e * dQ.sd] = acc[e];
        }
      }
    }
  });
}

}  // namespace tessera::cpu
