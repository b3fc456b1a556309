// CUDA ops: activations (identity, relu, gelu, tanh) forward and backward,
// bias_act (y = act(y + bias)) and the bias gradient, for float32, bfloat16
// and float16 tensors with float32 arithmetic inside. Semantics follow the
// CPU ops (backend/cpu/cpu_ops_nn.cpp). launch_act_forward and launch_bias_act are
// shared with ops_matmul.cpp (linear's epilogue).
//
// bias_grad is deterministic: partial column sums over fixed partitions,
// added up in a fixed order by a second pass (col_sums.cuh).
#include "backend/cpu/cpu_ops.hpp"
#include "backend/cuda/col_sums.cuh"
#include "backend/cuda/cuda_ops_internal.hpp"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;

// ---------------------------------------------------------------------------
// Activations: functors, so the switch on `act` happens once per call on the
// host and each kernel is a plain map. gelu is the tanh approximation of
// GPT-2 and torch's approximate="tanh"; tanhf, not the fast intrinsic, so
// float32 results agree with the CPU to rounding.

constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

struct Identity {
  __device__ float operator()(float x) const { return x; }
};
struct Relu {
  __device__ float operator()(float x) const { return x < 0.0f ? 0.0f : x; }  // NaN stays
};
struct Tanh {
  __device__ float operator()(float x) const { return tanhf(x); }
};
struct Gelu {
  __device__ float operator()(float x) const {
    const float u = kGeluS * (x + kGeluC * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
  }
};

// Derivatives, by the same rules as the CPU's.
struct IdentityGrad {
  __device__ float operator()(float) const { return 1.0f; }
};
struct ReluGrad {  // input or output alike: relu(x) > 0 exactly when x > 0
  __device__ float operator()(float v) const { return v > 0.0f ? 1.0f : 0.0f; }
};
struct TanhGradFromOutput {
  __device__ float operator()(float t) const { return 1.0f - t * t; }
};
struct TanhGrad {
  __device__ float operator()(float v) const {
    const float t = tanhf(v);
    return 1.0f - t * t;
  }
};
// kFast (16-bit tensors): tanh by the hardware's approximate instruction
// (relative error about 2^-11, below bf16's and fp16's own rounding of the
// result), as the accurate tanhf made the pass compute-bound.
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
template <bool kFast>
struct GeluGradOf {
  __device__ float operator()(float x) const {
    if (fabsf(x) > 10.0f) return x > 0.0f ? 1.0f : 0.0f;  // tanh is +-1; avoids inf * 0
    const float x2 = x * x;
    const float u = kGeluS * (x + kGeluC * x2 * x);
    const float t = kFast ? tanh_approx(u) : tanhf(u);
    const float du = kGeluS * (1.0f + 3.0f * kGeluC * x2);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
  }
};
using GeluGrad = GeluGradOf<false>;
using GeluGradFast = GeluGradOf<true>;

// Runs f(Act{}) with Act the functor of `act`.
template <typename F>
void dispatch_act(tsr_activation act, F &&f) {
  switch (act) {
    case TSR_ACT_NONE:
      f(Identity{});
      break;
    case TSR_ACT_RELU:
      f(Relu{});
      break;
    case TSR_ACT_GELU:
      f(Gelu{});
      break;
    case TSR_ACT_TANH:
      f(Tanh{});
      break;
    default:
      throw Error(TSR_ERR_INVALID, "unknown activation " + std::to_string(act));
  }
}

// map_kernel adapter: y = act(x).
template <typename Act>
struct ActMap {
  __device__ float operator()(float x, float) const { return Act{}(x); }
};

// dx = dy * g(x); each element is read before it is written by the same
// thread, so dx may alias dy (or x).
template <typename T, typename G>
__global__ void act_backward_kernel(const T *x, const T *dy, T *dx, int64_t n, int64_t packs) {
  const G g;
  for (int64_t p = global_thread(); p < packs; p += global_threads()) {
    float xv[kPack], dv[kPack];
    load8(x + p * kPack, xv);
    load8(dy + p * kPack, dv);
#pragma unroll
    for (int j = 0; j < kPack; j++) dv[j] *= g(xv[j]);
    store8(dx + p * kPack, dv);
  }
  for (int64_t i = packs * kPack + global_thread(); i < n; i += global_threads())
    dx[i] = from_f<T>(to_f(dy[i]) * g(to_f(x[i])));
}

// dx = dy * g(x) over [rows, cols] and the column partial sums of dx (the
// bias gradient of the matmul before the activation) in one pass over x and
// dy: col_partials' blocks and partials, with the activation's backward on
// the way. The sums add dx as stored (rounded to T), as bias_grad over dx
// would. Needs packs (cols % 8 == 0, aligned rows).
template <typename T, typename G>
__global__ void act_backward_partials(const T *x, const T *dy, T *dx, int64_t rows, int64_t cols,
                                      int64_t rows_per_chunk, float *partial) {
  __shared__ float sh[kColY][32 * kPack];
  const G g;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x) * kPack;
  const int64_t r_begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r_end = r_begin + rows_per_chunk < rows ? r_begin + rows_per_chunk : rows;
  float acc[kPack] = {};
  if (c0 < cols) {
    for (int64_t r = r_begin + threadIdx.y; r < r_end; r += kColY) {
      float xv[kPack], dv[kPack];
      load8(x + r * cols + c0, xv);
      load8(dy + r * cols + c0, dv);
#pragma unroll
      for (int j = 0; j < kPack; j++) dv[j] = to_f(from_f<T>(dv[j] * g(xv[j])));
      store8(dx + r * cols + c0, dv);
#pragma unroll
      for (int j = 0; j < kPack; j++) acc[j] += dv[j];
    }
  }
  block_partials<kPack>(sh, acc, cols, partial + blockIdx.y * cols);
}

// Runs go(G{}) with G the derivative functor of `act` for T.
template <typename T, typename F>
void dispatch_act_grad(tsr_activation act, int32_t from_output, F &&go) {
  switch (act) {
    case TSR_ACT_NONE:
      go(IdentityGrad{});
      break;
    case TSR_ACT_RELU:
      go(ReluGrad{});
      break;
    case TSR_ACT_GELU:
      if constexpr (sizeof(T) == 2) {
        go(GeluGradFast{});
      } else {
        go(GeluGrad{});
      }
      break;
    case TSR_ACT_TANH:
      if (from_output) {
        go(TanhGradFromOutput{});
      } else {
        go(TanhGrad{});
      }
      break;
  }
}

// y[r, :] = act(y[r, :] + bias[:]). With packs (cols % 8 == 0, y and bias
// aligned) a pack never straddles rows, and its bias is one aligned pack.
template <typename T, typename TB, typename Act>
__global__ void bias_act_kernel(T *y, const TB *bias, int64_t n, int64_t cols, bool vec) {
  const Act act;
  if (vec) {
    const int64_t packs = n / kPack;
    for (int64_t p = global_thread(); p < packs; p += global_threads()) {
      float v[kPack], b[kPack];
      load8(y + p * kPack, v);
      load8(bias + (p * kPack) % cols, b);
#pragma unroll
      for (int j = 0; j < kPack; j++) v[j] = act(v[j] + b[j]);
      store8(y + p * kPack, v);
    }
    return;
  }
  for (int64_t i = global_thread(); i < n; i += global_threads())
    y[i] = from_f<T>(act(to_f(y[i]) + to_f(bias[i % cols])));
}

}  // namespace

// ---------------------------------------------------------------------------
// Launchers shared with ops_matmul.cpp and ops_matmul_grad.cpp

void launch_act_forward(tsr_activation act, const View &x, const View &y) {
  dispatch_float(y.dt, [&](auto tag) {
    using T = decltype(tag);
    dispatch_act(act, [&](auto a) {
      launch_map<T, T, true, false>(x.as<T>(), y.as<T>(), y.numel(), ActMap<decltype(a)>{});
    });
  });
}

void launch_bias_act(const View &y, const View *bias, tsr_activation act) {
  if (!bias) {
    if (act != TSR_ACT_NONE) launch_act_forward(act, y, y);
    return;
  }
  const int64_t n = y.numel();
  if (n == 0) return;
  const bool vec = y.cols % kPack == 0 && aligned16(y.p) && aligned16(bias->p);
  const unsigned grid = grid_for(vec ? n / kPack : n, kThreads);
  dispatch_float(y.dt, [&](auto ytag) {
    using T = decltype(ytag);
    dispatch_float(bias->dt, [&](auto btag) {
      using TB = decltype(btag);
      dispatch_act(act, [&](auto a) {
        bias_act_kernel<T, TB, decltype(a)>
            <<<grid, kThreads, 0, compute_stream()>>>(y.as<T>(), bias->as<TB>(), n, y.cols, vec);
        check_launch();
      });
    });
  });
}

void launch_act_backward(tsr_activation act, int32_t from_output, const View &x, const View &dy,
                         const View &dx) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const bool vec = aligned16(x.p) && aligned16(dy.p) && aligned16(dx.p);
  const int64_t packs = vec ? n / kPack : 0;
  const unsigned grid = grid_for(packs > 0 ? packs : n, kThreads);
  dispatch_float(x.dt, [&](auto tag) {
    using T = decltype(tag);
    dispatch_act_grad<T>(act, from_output, [&](auto g) {
      act_backward_kernel<T, decltype(g)>
          <<<grid, kThreads, 0, compute_stream()>>>(x.as<T>(), dy.as<T>(), dx.as<T>(), n, packs);
      check_launch();
    });
  });
}

void launch_act_backward_bias_grad(tsr_activation act, const View &x, const View &dy,
                                   const View &dx, const View &dbias) {
  const int64_t rows = x.rows, cols = x.cols;
  if (rows == 0 || cols == 0) return;
  const bool vec = cols % kPack == 0 && aligned16(x.p) && aligned16(dy.p) && aligned16(dx.p);
  if (!vec) {
    launch_act_backward(act, 0, x, dy, dx);
    launch_bias_grad(dx, dbias, 1.0f);
    return;
  }
  const int64_t tiles = (cols + 32 * kPack - 1) / (32 * kPack);
  int64_t rows_per_chunk = 0;
  const int64_t chunks = col_chunks(rows, tiles, &rows_per_chunk);
  auto *partial = static_cast<float *>(scratch(Slot::Partials, sizeof(float) * chunks * cols));
  dispatch_float(x.dt, [&](auto tag) {
    using T = decltype(tag);
    dispatch_act_grad<T>(act, 0, [&](auto g) {
      act_backward_partials<T, decltype(g)>
          <<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks)), dim3(32, kColY), 0,
             compute_stream()>>>(x.as<T>(), dy.as<T>(), dx.as<T>(), rows, cols, rows_per_chunk,
                                 partial);
      check_launch();
    });
  });
  launch_col_finalize(partial, chunks, dbias, 1.0f);
}

void launch_bias_grad(const View &dy, const View &dbias, float scale) {
  if (dy.cols == 0 || dy.rows == 0) return;
  dispatch_float(dy.dt, [&](auto tag) {
    using T = decltype(tag);
    int64_t chunks = 0;
    const float *partial = launch_col_partials<T, false>(dy.as<T>(), nullptr, nullptr, nullptr,
                                                         dy.rows, dy.cols, &chunks);
    launch_col_finalize(partial, chunks, dbias, scale);
  });
}

// ---------------------------------------------------------------------------
// Entries

tsr_status bias_act(tsr_host_ctx *ctx, DLTensor *y, const DLTensor *bias,
                    tsr_activation act) noexcept {
  return guarded(ctx, [&] {
    if (side_of("bias_act", {{"y", y}, {"bias", bias}}) == Side::Host) {
      AsCpu hy(y), hb(bias);
      host_result(cpu_ops()->bias_act(ctx, hy.mut(), hb.p, act));
      return;
    }
    const View Y = floating("bias_act", "y", y, 1), B = floating("bias_act", "bias", bias, 1);
    TSR_CHECK(B.numel() == Y.cols, TSR_ERR_INVALID,
              "bias_act: bias " + describe(bias) + " must have the last dim of y " + describe(y) +
                  " (" + std::to_string(Y.cols) + " elements)");
    check_activation("bias_act", act);
    launch_bias_act(Y, &B, act);
  });
}

tsr_status bias_grad(tsr_host_ctx *ctx, const DLTensor *dy, DLTensor *dbias) noexcept {
  return guarded(ctx, [&] {
    if (side_of("bias_grad", {{"dy", dy}, {"dbias", dbias}}) == Side::Host) {
      AsCpu hd(dy), hb(dbias);
      host_result(cpu_ops()->bias_grad(ctx, hd.p, hb.mut()));
      return;
    }
    const View D = floating("bias_grad", "dy", dy, 1), G = floating("bias_grad", "dbias", dbias, 1);
    TSR_CHECK(G.numel() == D.cols, TSR_ERR_INVALID,
              "bias_grad: dbias " + describe(dbias) + " must have the last dim of dy " +
                  describe(dy) + " (" + std::to_string(D.cols) + " elements)");
    launch_bias_grad(D, G, 1.0f);
  });
}

tsr_status act_forward(tsr_host_ctx *ctx, tsr_activation act, const DLTensor *x,
                       DLTensor *y) noexcept {
  return guarded(ctx, [&] {
    if (side_of("act_forward", {{"x", x}, {"y", y}}) == Side::Host) {
      AsCpu hx(x), hy(y);
      host_result(cpu_ops()->act_forward(ctx, act, hx.p, hy.mut()));
      return;
    }
    const View X = floating("act_forward", "x", x), Y = floating("act_forward", "y", y);
    check_same_numel("act_forward", "x", x, X, "y", y, Y);
    check_same_dtype("act_forward", "x", x, X, "y", y, Y);
    check_activation("act_forward", act);
    launch_act_forward(act, X, Y);
  });
}

tsr_status act_backward(tsr_host_ctx *ctx, tsr_activation act, const DLTensor *x,
                        int32_t from_output, const DLTensor *dy, DLTensor *dx) noexcept {
  return guarded(ctx, [&] {
    if (side_of("act_backward", {{"x", x}, {"dy", dy}, {"dx", dx}}) == Side::Host) {
      AsCpu hx(x), hdy(dy), hdx(dx);
      host_result(cpu_ops()->act_backward(ctx, act, hx.p, from_output, hdy.p, hdx.mut()));
      return;
    }
    const View X = floating("act_backward", "x", x), DY = floating("act_backward", "dy", dy),
               DX = floating("act_backward", "dx", dx);
    check_same_numel("act_backward", "x", x, X, "dy", dy, DY);
    check_same_numel("act_backward", "dy", dy, DY, "dx", dx, DX);
    check_same_dtype("act_backward", "x", x, X, "dy", dy, DY);
    check_same_dtype("act_backward", "dy", dy, DY, "dx", dx, DX);
    check_activation("act_backward", act);
    TSR_CHECK(from_output == 0 || from_output == 1, TSR_ERR_INVALID,
              "act_backward: from_output must be 0 or 1, got " + std::to_string(from_output));
    TSR_CHECK(!(act == TSR_ACT_GELU && from_output), TSR_ERR_INVALID,
              "act_backward: gelu needs its input (from_output must be 0)");
    launch_act_backward(act, from_output, X, DY, DX);
  });
}

}  // namespace tessera::cuda
