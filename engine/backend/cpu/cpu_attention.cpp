// CPU causal attention (float32), forward and backward, with as many or
// fewer key/value heads than query heads (ABI 1.6's attention_gqa_*: query
// head h reads key/value head h / (H / Hk)). It is also the reference the
// CUDA kernels are tested against. Per (batch, head), on the
// ops' thread pool: that head's q, k, v (and dO) are copied into compact
// scratch, then tiles of 64 query rows go through OpenBLAS (scores, P V,
// and the five products of the backward) with the masked softmax between;
// a tile's scores are [64 x T], never a T x T matrix. Strides of q, k, v, out and the
// gradients are honoured (q, k, v are usually views into one fused
// [B, T, 3, H, D] buffer). Each head is computed by one thread in a fixed
// order (backward: each key/value head, its query heads in order), so
// results do not depend on the number of threads.
//
// ABI 1.8's attention_packed_* add document masking: int32 positions
// [B, T] give query t the window [t - positions[b, t], t]. Each tile then
// multiplies only the keys from its rows' lowest window start on, and a
// row's softmax runs over its own window, its lanes counted from the
// window's start, so a packed example's rows are summed in the order of
// the example alone.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_math.hpp"
#include "backend/cpu/cpu_ops_internal.hpp"
#include "backend/cpu/cpu_pool.hpp"
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
  int64_t Hk;  // key/value heads, dividing H
};

// Which shape a checked tensor has: q's (the first sets B, T, H, D) or
// k's (the first sets Hk; with MHA, Hk = H is set before).
enum class AttnRole { SetQ, Q, SetKv, Kv };

std::string shape_of(const Dims &d) {
  // Appended piecewise: "[" + to_string(...) trips a GCC 12 -Wrestrict false positive.
  std::string s = "[";
  s += std::to_string(d.B) + "," + std::to_string(d.T) + "," + std::to_string(d.H) + ",";
  s += std::to_string(d.D);
  s += "]";
  return s;
}

// Checks a [B, T, H, D] float32 host tensor (strides honoured, NULL strides
// = compact); `role` says which shape it must have.
V4 bthd(const char *op, const char *arg, const DLTensor *t, Dims &dims, AttnRole role) {
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
  const Dims d{t->shape[0], t->shape[1], t->shape[2], t->shape[3], t->shape[2]};
  TSR_CHECK(d.B >= 0 && d.T >= 0 && d.H >= 0 && d.D >= 0, TSR_ERR_INVALID,
            w + "has a negative dim: " + describe(t));
  if (role == AttnRole::SetQ) {
    dims = d;
  } else if (role == AttnRole::SetKv) {
    TSR_CHECK(d.B == dims.B && d.T == dims.T && d.D == dims.D, TSR_ERR_INVALID,
              w + describe(t) + " must match the B, T and D of q " + shape_of(dims));
    TSR_CHECK(d.H > 0 ? dims.H % d.H == 0 : dims.H == 0, TSR_ERR_INVALID,
              w + describe(t) + " has " + std::to_string(d.H) + " heads, which must divide q's " +
                  std::to_string(dims.H));
    dims.Hk = d.H;
  } else {
    const int64_t heads = role == AttnRole::Q ? dims.H : dims.Hk;
    TSR_CHECK(d.B == dims.B && d.T == dims.T && d.H == heads && d.D == dims.D, TSR_ERR_INVALID,
              w + describe(t) + " does not match " +
                  (role == AttnRole::Q || dims.Hk == dims.H ? "q" : "k") + "'s shape " +
                  shape_of(Dims{dims.B, dims.T, heads, dims.D, dims.Hk}));
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

// Copies head (b, h) of X into dst as a compact [T][D]. Heads are
// contiguous along D in every layout the models use; the strided loop
// (which does not vectorize) serves the rest.
void gather(const V4 &X, int64_t b, int64_t h, const Dims &d, float *dst) {
  for (int64_t t = 0; t < d.T; t++) {
    const float *r = X.row(b, t, h);
    if (X.sd == 1)
      std::memcpy(dst + t * d.D, r, static_cast<size_t>(d.D) * sizeof(float));
    else
      for (int64_t e = 0; e < d.D; e++) dst[t * d.D + e] = r[e * X.sd];
  }
}

// Head (b, h) of X as rows of D floats `ld` apart: in place where X is
// contiguous along D (every layout the models use: the gemms read it with
// its row stride), else gathered into `dst` as a compact [T][D].
struct Head {
  const float *p;
  int64_t ld;
};

Head head_of(const V4 &X, int64_t b, int64_t h, const Dims &d, float *dst) {
  if (X.sd == 1) return Head{X.row(b, 0, h), X.st};
  gather(X, b, h, d, dst);
  return Head{dst, d.D};
}

// Row t of head (b, h) of X = src[0..D) * mul: the way back.
void put_row(const V4 &X, int64_t b, int64_t t, int64_t h, int64_t D, const float *src, float mul) {
  float *r = X.row(b, t, h);
  if (X.sd == 1)
    for (int64_t e = 0; e < D; e++) r[e] = src[e] * mul;
  else
    for (int64_t e = 0; e < D; e++) r[e * X.sd] = src[e] * mul;
}

// Row-major single-precision gemm: c = alpha op(a) op(b) + beta c. OpenBLAS
// runs single-threaded here (cpu_ops_set_threads), one head per pool thread.
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
           int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// Row t of head (b, h) of X dotted with y[0..D), summed in order of e.
float dot_row(const V4 &X, int64_t b, int64_t t, int64_t h, int64_t D, const float *y) {
  const float *r = X.row(b, t, h);
  float acc = 0.0f;
  if (X.sd == 1)
    for (int64_t e = 0; e < D; e++) acc += y[e] * r[e];
  else
    for (int64_t e = 0; e < D; e++) acc += y[e] * r[e * X.sd];
  return acc;
}

// Query rows per tile: a tile's scores against keys 0..(its last row) are
// one [kTile x keys] block, so the scratch grows with T, not T x T, and
// the masked half of each diagonal block is the only wasted work.
constexpr int64_t kTile = 64;

// The first key query t sees: 0 (causal), or its window's start.
inline int64_t first_key(const int64_t *start, int64_t t) {
  return start ? start[t] : 0;
}

// Softmax of score rows in place for query rows [r0, r1) of a tile whose
// block has `keys` columns, keys k0.. (k0 <= every row's first key): row t
// keeps keys first_key(t)..t, the rest become 0. Fills lse[t] (the scores
// come scaled) and inv[t - r0] = 1 / the row's sum.
TSR_OPS_CLONES void softmax_rows(float *s, int64_t r0, int64_t r1, int64_t k0, int64_t keys,
                                 const int64_t *start, float *lse, float *inv) {
  for (int64_t t = r0; t < r1; t++) {
    float *all = s + (t - r0) * keys;
    const int64_t lo = first_key(start, t) - k0;
    for (int64_t j = 0; j < lo; j++) all[j] = 0.0f;
    float *row = all + lo;  // the window's keys, from its first
    const int64_t n = t + 1 - k0 - lo;
    const float mx = max_lanes16(row, n);
    int64_t j;
    // The exps in a loop of their own, which vectorizes (exp_v's clamps
    // became branches when the sum shared the loop: scalar, a sixth of a
    // tiny llama's step on the CPU), then the same eight-lane sum. The
    // exps run on to a whole vector where the block has the columns (the
    // masked ones are zeroed below), so no row ends in a scalar tail.
    const int64_t padded = std::min(keys - lo, (n + 15) / 16 * 16);
    for (j = 0; j < padded; j++) row[j] = exp_v(row[j] - mx);
    float sum8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    j = 0;
    for (; j + 8 <= n; j += 8)
      for (int k = 0; k < 8; k++) sum8[k] += row[j + k];
    for (; j < n; j++) sum8[0] += row[j];
    for (j = n; j < keys - lo; j++) row[j] = 0.0f;
    const float sum =
        ((sum8[0] + sum8[1]) + (sum8[2] + sum8[3])) + ((sum8[4] + sum8[5]) + (sum8[6] + sum8[7]));
    lse[t] = mx + std::log(sum);
    inv[t - r0] = 1.0f / sum;
  }
}

// dS = P (dP - Di) scale for the rows of a tile (keys k0..), P recomputed
// from lse into s, both zero outside each row's window.
TSR_OPS_CLONES void softmax_grad_rows(float *s, float *dp, int64_t r0, int64_t r1, int64_t k0,
                                      int64_t keys, const int64_t *start, const float *lse,
                                      const float *di, float scale) {
  for (int64_t t = r0; t < r1; t++) {
    float *srow = s + (t - r0) * keys, *drow = dp + (t - r0) * keys;
    const int64_t lo = first_key(start, t) - k0, n = t + 1 - k0;
    const float lt = lse[t], dt = di[t - r0];
    for (int64_t j = 0; j < lo; j++) srow[j] = drow[j] = 0.0f;
    // As in softmax_rows, on to a whole vector; the columns from n are
    // zeroed after.
    const int64_t padded = std::min(keys, lo + (n - lo + 15) / 16 * 16);
    for (int64_t j = lo; j < padded; j++) {
      const float p = exp_v(srow[j] - lt);
      srow[j] = p;
      drow[j] = scale * (p * (drow[j] - dt));
    }
    for (int64_t j = n; j < keys; j++) srow[j] = drow[j] = 0.0f;
  }
}

// The lowest first key of rows [r0, r1): where a tile's key block begins.
int64_t tile_first_key(const int64_t *start, int64_t r0, int64_t r1) {
  if (!start) return 0;
  int64_t k0 = r0;
  for (int64_t t = r0; t < r1; t++) k0 = std::min(k0, start[t]);
  return k0;
}

// `start`: sequence b's first keys [T], or NULL for causal attention.
void forward_head(const V4 &Q, const V4 &K, const V4 &Vv, const V4 &O, float *L, const Dims &d,
                  int64_t b, int64_t h, float scale, const int64_t *start) {
  const int64_t T = d.T, D = d.D, tile = std::min(kTile, T);
  float *q = scratch(static_cast<size_t>(3 * T * D + tile * T + tile * D + tile));
  float *k = q + T * D, *v = k + T * D, *s = v + T * D, *o = s + tile * T, *inv = o + tile * D;
  const Head qh = head_of(Q, b, h, d, q), kh = head_of(K, b, h / (d.H / d.Hk), d, k),
             vh = head_of(Vv, b, h / (d.H / d.Hk), d, v);
  float *lse = L + (b * d.H + h) * T;
  for (int64_t r0 = 0; r0 < T; r0 += tile) {
    const int64_t r1 = std::min(T, r0 + tile), rows = r1 - r0;
    const int64_t k0 = tile_first_key(start, r0, r1), keys = r1 - k0;
    sgemm(false, true, rows, keys, D, scale, qh.p + r0 * qh.ld, qh.ld, kh.p + k0 * kh.ld, kh.ld,
          0.0f, s, keys);
    softmax_rows(s, r0, r1, k0, keys, start, lse, inv);
    sgemm(false, false, rows, D, keys, 1.0f, s, keys, vh.p + k0 * vh.ld, vh.ld, 0.0f, o, D);
    for (int64_t t = r0; t < r1; t++) put_row(O, b, t, h, D, o + (t - r0) * D, inv[t - r0]);
  }
}

// Key/value head (b, hk) and the query heads h that read it: dq of each h,
// and dk, dv summed over them in order of h.
void backward_group(const V4 &Q, const V4 &K, const V4 &Vv, const V4 &O, const V4 &dO,
                    const float *L, const V4 &dQ, const V4 &dK, const V4 &dV, const Dims &d,
                    int64_t b, int64_t hk, float scale, const int64_t *start) {
  const int64_t T = d.T, D = d.D, tile = std::min(kTile, T), group = d.H / d.Hk;
  float *q = scratch(static_cast<size_t>(6 * T * D + 2 * tile * T + tile * D + tile));
  float *k = q + T * D, *v = k + T * D, *dout = v + T * D, *dk = dout + T * D, *dv = dk + T * D;
  float *s = dv + T * D, *dp = s + tile * T, *dq = dp + tile * T, *di = dq + tile * D;
  const Head kh = head_of(K, b, hk, d, k), vh = head_of(Vv, b, hk, d, v);
  for (int64_t i = 0; i < 2 * T * D; i++) dk[i] = 0.0f;  // dk and dv, adjacent
  for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
    const Head qh = head_of(Q, b, h, d, q), oh = head_of(dO, b, h, d, dout);
    const float *lse = L + (b * d.H + h) * T;
    for (int64_t r0 = 0; r0 < T; r0 += tile) {
      const int64_t r1 = std::min(T, r0 + tile), rows = r1 - r0;
      const int64_t k0 = tile_first_key(start, r0, r1), keys = r1 - k0;
      // Di = dO_t . O_t, the softmax's own gradient correction.
      for (int64_t t = r0; t < r1; t++) di[t - r0] = dot_row(O, b, t, h, D, oh.p + t * oh.ld);
      const float *kk = kh.p + k0 * kh.ld, *vk = vh.p + k0 * vh.ld;
      const float *qr = qh.p + r0 * qh.ld, *dor = oh.p + r0 * oh.ld;
      sgemm(false, true, rows, keys, D, scale, qr, qh.ld, kk, kh.ld, 0.0f, s, keys);
      sgemm(false, true, rows, keys, D, 1.0f, dor, oh.ld, vk, vh.ld, 0.0f, dp, keys);
      softmax_grad_rows(s, dp, r0, r1, k0, keys, start, lse, di, scale);           // s = P, dp = dS
      sgemm(false, false, rows, D, keys, 1.0f, dp, keys, kk, kh.ld, 0.0f, dq, D);  // dQ = dS K
      sgemm(true, false, keys, D, rows, 1.0f, dp, keys, qr, qh.ld, 1.0f, dk + k0 * D,
            D);  // dK += dS^T Q
      sgemm(true, false, keys, D, rows, 1.0f, s, keys, dor, oh.ld, 1.0f, dv + k0 * D,
            D);  // dV += P^T dO
      for (int64_t t = r0; t < r1; t++) put_row(dQ, b, t, h, D, dq + (t - r0) * D, 1.0f);
    }
  }
  for (int64_t j = 0; j < T; j++) {
    put_row(dK, b, j, hk, D, dk + j * D, 1.0f);
    put_row(dV, b, j, hk, D, dv + j * D, 1.0f);
  }
}

// Each query's first key from positions int32 [B, T] (compact): t -
// positions[b, t], refused unless the position lies in [0, t]. Empty (no
// positions) for causal attention.
std::vector<int64_t> window_starts(const char *op, const DLTensor *positions, const Dims &d) {
  std::vector<int64_t> start;
  if (!positions) return start;
  const Mat<int32_t> P = i32(op, "positions", positions);
  TSR_CHECK(positions->ndim == 2 && positions->shape[0] == d.B && positions->shape[1] == d.T,
            TSR_ERR_INVALID,
            std::string(op) + ": positions " + describe(positions) + " must be [B, T] = [" +
                std::to_string(d.B) + "," + std::to_string(d.T) + "]");
  start.resize(static_cast<size_t>(d.B * d.T));
  for (int64_t i = 0; i < d.B * d.T; i++) {
    const int64_t t = i % d.T, p = P.p[i];
    TSR_CHECK(p >= 0 && p <= t, TSR_ERR_INVALID,
              std::string(op) + ": positions[" + std::to_string(i / d.T) + ", " +
                  std::to_string(t) + "] = " + std::to_string(p) + " is outside [0, " +
                  std::to_string(t) + "]: a window cannot reach before its sequence's start");
    start[static_cast<size_t>(i)] = t - p;
  }
  return start;
}

const int64_t *starts_of(const std::vector<int64_t> &start, int64_t b, int64_t T) {
  return start.empty() ? nullptr : start.data() + b * T;
}

void attention_forward_impl(const char *op, bool gqa, const DLTensor *q, const DLTensor *k,
                            const DLTensor *v, const DLTensor *positions, float scale,
                            DLTensor *out, DLTensor *lse) {
  Dims d{};
  const V4 Q = bthd(op, "q", q, d, AttnRole::SetQ);
  d.Hk = d.H;
  const V4 K = bthd(op, "k", k, d, gqa ? AttnRole::SetKv : AttnRole::Kv),
           Vv = bthd(op, "v", v, d, AttnRole::Kv), O = bthd(op, "out", out, d, AttnRole::Q);
  float *L = lse_view(op, lse, d);
  const std::vector<int64_t> start = window_starts(op, positions, d);
  if (d.B * d.T * d.H == 0) return;
  if (d.D == 0) {  // empty heads: every score is 0, so row t averages its window's keys
    for (int64_t i = 0; i < d.B * d.H; i++) {
      const int64_t *st = starts_of(start, i / d.H, d.T);
      for (int64_t t = 0; t < d.T; t++)
        L[i * d.T + t] = std::log(static_cast<float>(t + 1 - first_key(st, t)));
    }
    return;
  }
  parallel_for(d.B * d.H, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++)
      forward_head(Q, K, Vv, O, L, d, i / d.H, i % d.H, scale, starts_of(start, i / d.H, d.T));
  });
}

void attention_backward_impl(const char *op, bool gqa, const DLTensor *q, const DLTensor *k,
                             const DLTensor *v, const DLTensor *positions, const DLTensor *out,
                             const DLTensor *dout, const DLTensor *lse, float scale, DLTensor *dq,
                             DLTensor *dk, DLTensor *dv) {
  Dims d{};
  const V4 Q = bthd(op, "q", q, d, AttnRole::SetQ);
  d.Hk = d.H;
  const V4 K = bthd(op, "k", k, d, gqa ? AttnRole::SetKv : AttnRole::Kv),
           Vv = bthd(op, "v", v, d, AttnRole::Kv), O = bthd(op, "out", out, d, AttnRole::Q),
           dO = bthd(op, "dout", dout, d, AttnRole::Q), dQ = bthd(op, "dq", dq, d, AttnRole::Q),
           dK = bthd(op, "dk", dk, d, AttnRole::Kv), dV = bthd(op, "dv", dv, d, AttnRole::Kv);
  const float *L = lse_view(op, lse, d);
  const std::vector<int64_t> start = window_starts(op, positions, d);
  if (d.B * d.T * d.H * d.D == 0) return;  // nothing to write
  parallel_for(d.B * d.Hk, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++)
      backward_group(Q, K, Vv, O, dO, L, dQ, dK, dV, d, i / d.Hk, i % d.Hk, scale,
                     starts_of(start, i / d.Hk, d.T));
  });
}

}  // namespace

tsr_status attention_forward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                             const DLTensor *v, float scale, DLTensor *out,
                             DLTensor *lse) noexcept {
  return guarded(ctx, [&] {
    attention_forward_impl("attention_forward", false, q, k, v, nullptr, scale, out, lse);
  });
}

tsr_status attention_backward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                              const DLTensor *v, const DLTensor *out, const DLTensor *dout,
                              const DLTensor *lse, float scale, DLTensor *dq, DLTensor *dk,
                              DLTensor *dv) noexcept {
  return guarded(ctx, [&] {
    attention_backward_impl("attention_backward", false, q, k, v, nullptr, out, dout, lse, scale,
                            dq, dk, dv);
  });
}

tsr_status attention_gqa_forward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                 const DLTensor *v, float scale, DLTensor *out,
                                 DLTensor *lse) noexcept {
  return guarded(ctx, [&] {
    attention_forward_impl("attention_gqa_forward", true, q, k, v, nullptr, scale, out, lse);
  });
}

tsr_status attention_gqa_backward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                  const DLTensor *v, const DLTensor *out, const DLTensor *dout,
                                  const DLTensor *lse, float scale, DLTensor *dq, DLTensor *dk,
                                  DLTensor *dv) noexcept {
  return guarded(ctx, [&] {
    attention_backward_impl("attention_gqa_backward", true, q, k, v, nullptr, out, dout, lse, scale,
                            dq, dk, dv);
  });
}

tsr_status attention_packed_forward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                    const DLTensor *v, const DLTensor *positions, float scale,
                                    DLTensor *out, DLTensor *lse) noexcept {
  return guarded(ctx, [&] {
    TSR_CHECK(positions != nullptr, TSR_ERR_INVALID, "attention_packed_forward: positions is NULL");
    attention_forward_impl("attention_packed_forward", true, q, k, v, positions, scale, out, lse);
  });
}

tsr_status attention_packed_backward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                     const DLTensor *v, const DLTensor *positions,
                                     const DLTensor *out, const DLTensor *dout, const DLTensor *lse,
                                     float scale, DLTensor *dq, DLTensor *dk,
                                     DLTensor *dv) noexcept {
  return guarded(ctx, [&] {
    TSR_CHECK(positions != nullptr, TSR_ERR_INVALID,
              "attention_packed_backward: positions is NULL");
    attention_backward_impl("attention_packed_backward", true, q, k, v, positions, out, dout, lse,
                            scale, dq, dk, dv);
  });
}

}  // namespace tessera::cpu
