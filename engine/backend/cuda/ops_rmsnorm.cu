// CUDA ops, RMS normalization over the last dim (ABI 1.6): forward, the
// forward with the residual add before it, and backward, for float32,
// bfloat16 and float16 x (the weight in any of the three) with float32
// arithmetic inside. As Hugging Face's LlamaRMSNorm: rstd from the float32
// mean of squares, n = x * rstd rounded to x's dtype, y = n * weight.
// Semantics follow the CPU ops (backend/cpu/cpu_ops_rmsnorm.cpp).
//
// One warp per row (as ops_layernorm.cu): a pass for the sum of squares, a
// pass for the output, the second from cache; 8-element packs where the
// row allows. dweight is deterministic: partial column sums over fixed
// chunks of rows, added in chunk order by col_sums.cuh's finalize.
#include <cmath>

#include "backend/cpu/cpu_ops.hpp"
#include "backend/cuda/col_sums.cuh"
#include "backend/cuda/cuda_ops_internal.hpp"
#include "backend/cuda/ops_decoder.hpp"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;

// Row r's element j of a [rows, C] tensor: packs of 8 at p * 8 where vec,
// else single elements; each lane visits its own columns in both passes.
template <typename T, typename F>
__device__ __forceinline__ void for_row(int64_t C, bool vec, F f) {
  const int lane = threadIdx.x % 32;
  const int64_t packs = vec ? C / kPack : 0;
  for (int64_t p = lane; p < packs; p += 32) f(p * kPack, kPack);
  for (int64_t j = packs * kPack + lane; j < C; j += 32) f(j, 1);
}

template <typename T>
__device__ __forceinline__ void load_n(const T *p, int n, float (&v)[kPack]) {
  if (n == kPack) {
    load8(p, v);
  } else {
    v[0] = to_f(p[0]);
  }
}

template <typename T>
__device__ __forceinline__ void store_n(T *p, int n, const float (&v)[kPack]) {
  if (n == kPack) {
    store8(p, v);
  } else {
    p[0] = from_f<T>(v[0]);
  }
}

// kAdd: r = x + addend is stored (rounded to T) first and normalised as
// stored; the output pass reads it back from this lane's own writes.
template <typename T, typename W, bool kAdd>
__global__ void rmsnorm_forward_kernel(const T *x, const T *addend, T *sum_out, const W *weight,
                                       float eps, T *y, float *rstd_out, int64_t rows, int64_t C,
                                       bool vec) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const T *xr = kAdd ? sum_out + r * C : x + r * C;
  float ss = 0.0f;
  for_row<T>(C, vec, [&](int64_t j, int n) {
    float v[kPack];
    load_n(x + r * C + j, n, v);
    if constexpr (kAdd) {
      float u[kPack];
      load_n(addend + r * C + j, n, u);
      for (int i = 0; i < n; i++) v[i] = to_f(from_f<T>(v[i] + u[i]));
      store_n(sum_out + r * C + j, n, v);
    }
    for (int i = 0; i < n; i++) ss += v[i] * v[i];
  });
  ss = warp_sum(ss);
  const float s = rsqrtf(ss / static_cast<float>(C) + eps);
  for_row<T>(C, vec, [&](int64_t j, int n) {
    float v[kPack], w[kPack];
    load_n(xr + j, n, v);
    load_n(weight + j, n, w);
    for (int i = 0; i < n; i++) v[i] = to_f(from_f<T>(v[i] * s)) * w[i];
    store_n(y + r * C + j, n, v);
  });
  if (threadIdx.x % 32 == 0) rstd_out[r] = s;
}

// dx += rstd * (g - n * mean(g * n)), g = w * dy, n = x * rstd.
template <typename T, typename W>
__global__ void rmsnorm_dx_kernel(const T *dy, const T *x, const W *weight, const float *rstd,
                                  T *dx, int64_t rows, int64_t C, bool vec) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const float s = rstd[r];
  float gn = 0.0f;
  for_row<T>(C, vec, [&](int64_t j, int n) {
    float d[kPack], v[kPack], w[kPack];
    load_n(dy + r * C + j, n, d);
    load_n(x + r * C + j, n, v);
    load_n(weight + j, n, w);
    for (int i = 0; i < n; i++) gn += w[i] * d[i] * (v[i] * s);
  });
  gn = warp_sum(gn) / static_cast<float>(C);
  for_row<T>(C, vec, [&](int64_t j, int n) {
    float d[kPack], v[kPack], w[kPack], o[kPack];
    load_n(dy + r * C + j, n, d);
    load_n(x + r * C + j, n, v);
    load_n(weight + j, n, w);
    load_n(dx + r * C + j, n, o);
    for (int i = 0; i < n; i++) o[i] += s * (w[i] * d[i] - (v[i] * s) * gn);
    store_n(dx + r * C + j, n, o);
  });
}

// partial[chunk][c] = sum over the chunk's rows of dy * x * rstd, block
// (32, kColY): threadIdx.x picks the column, threadIdx.y strides the rows,
// and the kColY sums are added in y order.
template <typename T>
__global__ void rmsnorm_dw_partials(const T *dy, const T *x, const float *rstd, int64_t rows,
                                    int64_t C, int64_t rows_per_chunk, float *partial) {
  __shared__ float sh[kColY][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float acc = 0.0f;
  if (c < C)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColY)
      acc += to_f(dy[r * C + c]) * (to_f(x[r * C + c]) * rstd[r]);
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  float t = 0.0f;
  for (int y = 0; y < kColY; y++) t += sh[y][threadIdx.x];
  partial[blockIdx.y * C + c] = t;
}

void check_rows(const char *op, const char *arg, const DLTensor *t, const View &v,
                const DLTensor *x, const View &X) {
  TSR_CHECK(v.rows == X.rows && v.cols == X.cols, TSR_ERR_INVALID,
            std::string(op) + ": " + arg + " " + describe(t) + " must match x " + describe(x));
  check_same_dtype(op, "x", x, X, arg, t, v);
}

void check_n(const char *op, const char *arg, const DLTensor *t, const View &v, int64_t n,
             const char *what) {
  TSR_CHECK(v.numel() == n, TSR_ERR_INVALID,
            std::string(op) + ": " + arg + " " + describe(t) + " must have " + std::to_string(n) +
                " elements (" + what + ")");
}

// The forward of both entries on checked views (R = the stored sum when
// add_x is given).
void launch_forward(const View &X, const View *add_x, const View *add_y, const View &W,
                    const View &Y, const View &S, float eps) {
  if (X.rows == 0) return;
  bool vec = X.cols % kPack == 0 && aligned16(X.p) && aligned16(Y.p) && aligned16(W.p);
  if (add_x) vec = vec && aligned16(add_x->p) && aligned16(add_y->p);
  const unsigned grid = static_cast<unsigned>((X.rows + kRowsPerBlock - 1) / kRowsPerBlock);
  dispatch_float(X.dt, [&](auto xtag) {
    using T = decltype(xtag);
    dispatch_float(W.dt, [&](auto wtag) {
      using TW = decltype(wtag);
      if (add_x) {
        rmsnorm_forward_kernel<T, TW, true><<<grid, kThreads, 0, compute_stream()>>>(
            add_x->as<T>(), add_y->as<T>(), X.as<T>(), W.as<TW>(), eps, Y.as<T>(), S.as<float>(),
            X.rows, X.cols, vec);
      } else {
        rmsnorm_forward_kernel<T, TW, false><<<grid, kThreads, 0, compute_stream()>>>(
            X.as<T>(), nullptr, nullptr, W.as<TW>(), eps, Y.as<T>(), S.as<float>(), X.rows, X.cols,
            vec);
      }
      check_launch();
    });
  });
}

void check_eps(const char *op, float eps) {
  TSR_CHECK(std::isfinite(eps) && eps >= 0.0f, TSR_ERR_INVALID,
            std::string(op) + ": eps must be finite and >= 0, got " + std::to_string(eps));
}

}  // namespace

tsr_status rmsnorm_forward(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *weight, float eps,
                           DLTensor *y, DLTensor *rstd) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "rmsnorm_forward";
    if (side_of(op, {{"x", x}, {"weight", weight}, {"y", y}, {"rstd", rstd}}) == Side::Host) {
      AsCpu hx(x), hw(weight), hy(y), hr(rstd);
      host_result(
          need_cpu(cpu_ops()->rmsnorm_forward, op)(ctx, hx.p, hw.p, eps, hy.mut(), hr.mut()));
      return;
    }
    const View X = floating(op, "x", x, 1), W = floating(op, "weight", weight),
               Y = floating(op, "y", y, 1), S = f32(op, "rstd", rstd);
    check_rows(op, "y", y, Y, x, X);
    check_n(op, "weight", weight, W, X.cols, "the last dim of x");
    check_n(op, "rstd", rstd, S, X.rows, "one per row of x");
    check_eps(op, eps);
    TSR_CHECK(X.cols > 0 || X.rows == 0, TSR_ERR_INVALID,
              std::string(op) + ": x " + describe(x) + " has rows of no elements");
    launch_forward(X, nullptr, nullptr, W, Y, S, eps);
  });
}

tsr_status add_rmsnorm_forward(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *y,
                               const DLTensor *weight, float eps, DLTensor *r, DLTensor *out,
                               DLTensor *rstd) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "add_rmsnorm_forward";
    if (side_of(op,
                {{"x", x}, {"y", y}, {"weight", weight}, {"r", r}, {"out", out}, {"rstd", rstd}}) ==
        Side::Host) {
      AsCpu hx(x), hy(y), hw(weight), hr(r), ho(out), hs(rstd);
      host_result(need_cpu(cpu_ops()->add_rmsnorm_forward, op)(ctx, hx.p, hy.p, hw.p, eps, hr.mut(),
                                                               ho.mut(), hs.mut()));
      return;
    }
    const View X = floating(op, "x", x, 1), Yv = floating(op, "y", y, 1),
               Rs = floating(op, "r", r, 1), O = floating(op, "out", out, 1),
               W = floating(op, "weight", weight), S = f32(op, "rstd", rstd);
    check_rows(op, "y", y, Yv, x, X);
    check_rows(op, "r", r, Rs, x, X);
    check_rows(op, "out", out, O, x, X);
    check_n(op, "weight", weight, W, X.cols, "the last dim of x");
    check_n(op, "rstd", rstd, S, X.rows, "one per row of x");
    check_eps(op, eps);
    TSR_CHECK(O.p != X.p && O.p != Yv.p && O.p != Rs.p, TSR_ERR_INVALID,
              std::string(op) + ": out must not alias x, y or r");
    TSR_CHECK(X.cols > 0 || X.rows == 0, TSR_ERR_INVALID,
              std::string(op) + ": x " + describe(x) + " has rows of no elements");
    launch_forward(Rs, &X, &Yv, W, O, S, eps);
  });
}

tsr_status rmsnorm_backward(tsr_host_ctx *ctx, const DLTensor *dy, const DLTensor *x,
                            const DLTensor *weight, const DLTensor *rstd, DLTensor *dx,
                            DLTensor *dweight) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "rmsnorm_backward";
    if (side_of(op, {{"dy", dy},
                     {"x", x},
                     {"weight", weight},
                     {"rstd", rstd},
                     {"dx", dx},
                     {"dweight", dweight}}) == Side::Host) {
      AsCpu hdy(dy), hx(x), hw(weight), hr(rstd), hdx(dx), hdw(dweight);
      host_result(need_cpu(cpu_ops()->rmsnorm_backward, op)(ctx, hdy.p, hx.p, hw.p, hr.p, hdx.mut(),
                                                            hdw.mut()));
      return;
    }
    const View DY = floating(op, "dy", dy, 1), X = floating(op, "x", x, 1),
               W = floating(op, "weight", weight), S = f32(op, "rstd", rstd),
               DX = floating(op, "dx", dx, 1);
    check_rows(op, "dy", dy, DY, x, X);
    check_rows(op, "dx", dx, DX, x, X);
    check_n(op, "weight", weight, W, X.cols, "the last dim of x");
    check_n(op, "rstd", rstd, S, X.rows, "one per row of x");
    // ABI 1.11: no dweight, no weight gradient (a frozen weight's pass).
    View DW{};
    if (dweight) {
      DW = floating(op, "dweight", dweight);
      check_n(op, "dweight", dweight, DW, X.cols, "the last dim of x");
    }
    if (X.rows == 0 || X.cols == 0) return;
    dispatch_float(X.dt, [&](auto xtag) {
      using T = decltype(xtag);
      // dweight first: it reads dy, which dx may alias.
      if (dweight) {
        const int64_t tiles = (X.cols + 31) / 32;
        int64_t rpc = 0;
        const int64_t chunks = col_chunks(X.rows, tiles, &rpc);
        float *partial =
            static_cast<float *>(scratch(Slot::Partials, sizeof(float) * chunks * X.cols));
        rmsnorm_dw_partials<T><<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks)),
                                 dim3(32, kColY), 0, compute_stream()>>>(
            DY.as<T>(), X.as<T>(), S.as<float>(), X.rows, X.cols, rpc, partial);
        check_launch();
        launch_col_finalize(partial, chunks, DW);
      }
      const bool vec = X.cols % kPack == 0 && aligned16(X.p) && aligned16(DY.p) &&
                       aligned16(DX.p) && aligned16(W.p);
      const unsigned grid = static_cast<unsigned>((X.rows + kRowsPerBlock - 1) / kRowsPerBlock);
      dispatch_float(W.dt, [&](auto wtag) {
        using TW = decltype(wtag);
        rmsnorm_dx_kernel<T, TW><<<grid, kThreads, 0, compute_stream()>>>(
            DY.as<T>(), X.as<T>(), W.as<TW>(), S.as<float>(), DX.as<T>(), X.rows, X.cols, vec);
        check_launch();
      });
    });
  });
}

}  // namespace tessera::cuda
