// CUDA ops, SwiGLU's gate (ABI 1.6): out = silu(gate) * up and its
// backward, element-wise over [rows, F] in float32 arithmetic for float32,
// bfloat16 and float16 tensors. A 2-D argument may carry a row stride
// (strides[0] >= F, unit column stride), so gate and up may be the halves
// of one [rows, 2F] linear output. 8-element packs where every argument's
// rows allow them. ABI 1.12's swiglu_backward_out writes the forward's
// output too, from the same reads of gate and up (a backward that did not
// keep it saves a pass over both). Semantics follow
// backend/cpu/cpu_ops_swiglu.cpp.
#include "backend/cpu/cpu_ops.hpp"
#include "backend/cuda/cuda_ops_internal.hpp"
#include "backend/cuda/ops_decoder.hpp"
#include "util/dltensor.hpp"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;

// [rows, cols] with row stride ld (elements), unit column stride.
struct Rows {
  void *p;
  int64_t rows, cols, ld;
  DType dt;
};

Rows rows_view(const char *op, const char *arg, const DLTensor *t) {
  if (t && t->ndim == 2 && t->shape && t->strides && (t->strides[1] == 1 || t->shape[1] <= 1) &&
      t->shape[0] > 1 && t->strides[0] != t->shape[1]) {
    TSR_CHECK(t->shape[1] >= 0 && t->strides[0] >= t->shape[1], TSR_ERR_UNSUPPORTED,
              std::string(op) + ": " + arg + " " + describe(t) + " has row stride " +
                  std::to_string(t->strides[0]) + ", less than its row length");
    DLTensor span = *t;
    int64_t shape[2] = {t->shape[0], t->strides[0]};
    span.shape = shape;
    span.strides = nullptr;
    const View v = floating(op, arg, &span, 2);
    return Rows{v.p, t->shape[0], t->shape[1], t->strides[0], v.dt};
  }
  const View v = floating(op, arg, t, 1);
  return Rows{v.p, v.rows, v.cols, v.cols, v.dt};
}

void check_like(const char *op, const char *arg, const DLTensor *t, const Rows &v,
                const DLTensor *gate, const Rows &g) {
  TSR_CHECK(v.rows == g.rows && v.cols == g.cols, TSR_ERR_INVALID,
            std::string(op) + ": " + arg + " " + describe(t) + " must have the shape of gate " +
                describe(gate));
  TSR_CHECK(v.dt == g.dt, TSR_ERR_UNSUPPORTED,
            std::string(op) + ": " + arg + " " + describe(t) + " must have gate's dtype " +
                dtype_name(g.dt));
}

bool packs_ok(const Rows &v) {
  return v.cols % kPack == 0 && v.ld % kPack == 0 && aligned16(v.p);
}

__device__ __forceinline__ float sigmoidf_(float g) {
  return 1.0f / (1.0f + __expf(-g));
}

// kBackward: a = gate, b = up, c = dout -> o1 = dgate, o2 = dup, and with
// kOut o3 = out as the forward writes it. Forward: a = gate, b = up -> o1 =
// out.
template <typename T, bool kBackward, bool kOut = false>
__global__ void swiglu_kernel(const T *a, int64_t lda, const T *b, int64_t ldb, const T *c,
                              int64_t ldc, T *o1, int64_t ld1, T *o2, int64_t ld2, T *o3,
                              int64_t ld3, int64_t rows, int64_t cols, bool vec) {
  const int64_t per_row = vec ? cols / kPack : cols, n = rows * per_row;
  const int w = vec ? kPack : 1;
  for (int64_t i = global_thread(); i < n; i += global_threads()) {
    const int64_t r = i / per_row, j = (i % per_row) * w;
    float g[kPack] = {}, u[kPack] = {}, d[kPack] = {};
    if (vec) {
      load8(a + r * lda + j, g);
      load8(b + r * ldb + j, u);
      if constexpr (kBackward) load8(c + r * ldc + j, d);
    } else {
      g[0] = to_f(a[r * lda + j]);
      u[0] = to_f(b[r * ldb + j]);
      if constexpr (kBackward) d[0] = to_f(c[r * ldc + j]);
    }
    float y1[kPack], y2[kPack], y3[kPack];
#pragma unroll
    for (int e = 0; e < kPack; e++) {
      const float s = sigmoidf_(g[e]);
      if constexpr (kBackward) {
        y1[e] = d[e] * u[e] * (s * (1.0f + g[e] * (1.0f - s)));
        y2[e] = d[e] * g[e] * s;
      } else {
        y1[e] = g[e] * s * u[e];
        y2[e] = 0.0f;
      }
      y3[e] = kOut ? g[e] * s * u[e] : 0.0f;  // the forward's expression, as written there
    }
    if (vec) {
      store8(o1 + r * ld1 + j, y1);
      if constexpr (kBackward) store8(o2 + r * ld2 + j, y2);
      if constexpr (kOut) store8(o3 + r * ld3 + j, y3);
    } else {
      o1[r * ld1 + j] = from_f<T>(y1[0]);
      if constexpr (kBackward) o2[r * ld2 + j] = from_f<T>(y2[0]);
      if constexpr (kOut) o3[r * ld3 + j] = from_f<T>(y3[0]);
    }
  }
}

template <bool kBackward, bool kOut = false>
void launch(const Rows &a, const Rows &b, const Rows *c, const Rows &o1, const Rows *o2,
            const Rows *o3 = nullptr) {
  if (a.rows == 0 || a.cols == 0) return;
  bool vec = packs_ok(a) && packs_ok(b) && packs_ok(o1);
  if (kBackward) vec = vec && packs_ok(*c) && packs_ok(*o2);
  if (kOut) vec = vec && packs_ok(*o3);
  const int64_t work = a.rows * (vec ? a.cols / kPack : a.cols);
  dispatch_float(a.dt, [&](auto tag) {
    using T = decltype(tag);
    const auto out = [](const Rows *o) { return o ? static_cast<T *>(o->p) : nullptr; };
    swiglu_kernel<T, kBackward, kOut><<<grid_for(work, kThreads), kThreads, 0, compute_stream()>>>(
        static_cast<const T *>(a.p), a.ld, static_cast<const T *>(b.p), b.ld,
        c ? static_cast<const T *>(c->p) : nullptr, c ? c->ld : 0, static_cast<T *>(o1.p), o1.ld,
        out(o2), o2 ? o2->ld : 0, out(o3), o3 ? o3->ld : 0, a.rows, a.cols, vec);
    check_launch();
  });
}

}  // namespace

tsr_status swiglu_forward(tsr_host_ctx *ctx, const DLTensor *gate, const DLTensor *up,
                          DLTensor *out) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "swiglu_forward";
    if (side_of(op, {{"gate", gate}, {"up", up}, {"out", out}}) == Side::Host) {
      AsCpu hg(gate), hu(up), ho(out);
      host_result(need_cpu(cpu_ops()->swiglu_forward, op)(ctx, hg.p, hu.p, ho.mut()));
      return;
    }
    const Rows G = rows_view(op, "gate", gate), U = rows_view(op, "up", up),
               O = rows_view(op, "out", out);
    check_like(op, "up", up, U, gate, G);
    check_like(op, "out", out, O, gate, G);
    launch<false>(G, U, nullptr, O, nullptr);
  });
}

tsr_status swiglu_backward(tsr_host_ctx *ctx, const DLTensor *gate, const DLTensor *up,
                           const DLTensor *dout, DLTensor *dgate, DLTensor *dup) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "swiglu_backward";
    if (side_of(op, {{"gate", gate}, {"up", up}, {"dout", dout}, {"dgate", dgate}, {"dup", dup}}) ==
        Side::Host) {
      AsCpu hg(gate), hu(up), hd(dout), hdg(dgate), hdu(dup);
      host_result(
          need_cpu(cpu_ops()->swiglu_backward, op)(ctx, hg.p, hu.p, hd.p, hdg.mut(), hdu.mut()));
      return;
    }
    const Rows G = rows_view(op, "gate", gate), U = rows_view(op, "up", up),
               D = rows_view(op, "dout", dout), DG = rows_view(op, "dgate", dgate),
               DU = rows_view(op, "dup", dup);
    check_like(op, "up", up, U, gate, G);
    check_like(op, "dout", dout, D, gate, G);
    check_like(op, "dgate", dgate, DG, gate, G);
    check_like(op, "dup", dup, DU, gate, G);
    launch<true>(G, U, &D, DG, &DU);
  });
}

tsr_status swiglu_backward_out(tsr_host_ctx *ctx, const DLTensor *gate, const DLTensor *up,
                               const DLTensor *dout, DLTensor *dgate, DLTensor *dup,
                               DLTensor *out) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "swiglu_backward_out";
    if (side_of(op, {{"gate", gate},
                     {"up", up},
                     {"dout", dout},
                     {"dgate", dgate},
                     {"dup", dup},
                     {"out", out}}) == Side::Host) {
      AsCpu hg(gate), hu(up), hd(dout), hdg(dgate), hdu(dup), ho(out);
      host_result(need_cpu(cpu_ops()->swiglu_backward_out, op)(ctx, hg.p, hu.p, hd.p, hdg.mut(),
                                                               hdu.mut(), ho.mut()));
      return;
    }
    const Rows G = rows_view(op, "gate", gate), U = rows_view(op, "up", up),
               D = rows_view(op, "dout", dout), DG = rows_view(op, "dgate", dgate),
               DU = rows_view(op, "dup", dup), O = rows_view(op, "out", out);
    check_like(op, "up", up, U, gate, G);
    check_like(op, "dout", dout, D, gate, G);
    check_like(op, "dgate", dgate, DG, gate, G);
    check_like(op, "dup", dup, DU, gate, G);
    check_like(op, "out", out, O, gate, G);
    if (G.rows == 0 || G.cols == 0) return;
    check_apart(op, "out", out,
                {{"gate", gate}, {"up", up}, {"dout", dout}, {"dgate", dgate}, {"dup", dup}});
    launch<true, true>(G, U, &D, DG, &DU, &O);
  });
}

}  // namespace tessera::cuda
