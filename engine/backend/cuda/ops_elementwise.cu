// CUDA ops: the element-wise helpers fill, copy, cast, axpy, scale and
// sum_squares. Memory-bound maps through map_kernel (128-bit accesses,
// grid-stride; cast converts between float32, bfloat16 and float16 there);
// sum_squares is a fixed-shape two-pass reduction in double, so its result
// repeats bit for bit.
#include "backend/cpu/cpu_ops.hpp"
#include "backend/cuda/cuda_ops_internal.hpp"

namespace tessera::cuda {

namespace {

struct FillF {
  float v;
  __device__ float operator()(float, float) const { return v; }
};
// y = x, in y's dtype: map_kernel converts on the way in and out.
struct CastF {
  __device__ float operator()(float x, float) const { return x; }
};
struct AxpyF {
  float alpha;
  __device__ float operator()(float x, float y) const { return alpha * x + y; }
};
struct ScaleF {
  float alpha;
  __device__ float operator()(float, float y) const { return alpha * y; }
};

// Pass 1 of sum_squares: each block sums its grid-stride share of x^2 in
// double and writes one partial. The grid depends on n alone, so the
// partition, and with it the rounding, is the same every call.
template <typename T>
__global__ void sum_squares_partial(const T *x, int64_t n, int64_t packs, double *partial) {
  __shared__ double shared[32];
  double acc = 0.0;
  for (int64_t p = global_thread(); p < packs; p += global_threads()) {
    float v[kPack];
    load8(x + p * kPack, v);
#pragma unroll
    for (int j = 0; j < kPack; j++) acc += static_cast<double>(v[j]) * v[j];
  }
  for (int64_t i = packs * kPack + global_thread(); i < n; i += global_threads()) {
    const double v = to_f(x[i]);
    acc += v * v;
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// Pass 2: one block adds the partials in a fixed order.
__global__ void sum_partials(const double *partial, int count, double *out) {
  __shared__ double shared[32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) *out = acc;
}

bool host_side(const DLTensor *t) {
  return t->device.device_type == kDLCPU || t->device.device_type == kDLCUDAHost;
}

// copy's checks for a tensor on any side: any_view's checks, which want
// kDLCUDA, run on a header marked as device memory.
View copy_view(const char *arg, const DLTensor *t) {
  TSR_CHECK(t != nullptr, TSR_ERR_INVALID, std::string("copy: ") + arg + " is NULL");
  const int type = t->device.device_type;
  TSR_CHECK(type == kDLCPU || type == kDLCUDAHost || type == kDLCUDA, TSR_ERR_UNSUPPORTED,
            std::string("copy: ") + arg + " " + describe(t) + " is on device type " +
                std::to_string(type) + "; the CUDA ops take kDLCUDA or host memory");
  TSR_CHECK(type != kDLCUDA || t->device.device_id == current_device(), TSR_ERR_UNSUPPORTED,
            std::string("copy: ") + arg + " " + describe(t) + " is on GPU " +
                std::to_string(t->device.device_id) + " but this process drives GPU " +
                std::to_string(current_device()));
  DLTensor as_dev = *t;
  as_dev.device = DLDevice{kDLCUDA, current_device()};
  return any_view("copy", arg, &as_dev);
}

}  // namespace

void launch_scale(const View &y, float alpha) {
  dispatch_float(y.dt, [&](auto tag) {
    using T = decltype(tag);
    launch_map<T, T, false, true>(nullptr, y.as<T>(), y.numel(), ScaleF{alpha});
  });
}

tsr_status fill(tsr_host_ctx *ctx, DLTensor *x, float value) noexcept {
  return guarded(ctx, [&] {
    if (side_of("fill", {{"x", x}}) == Side::Host) {
      AsCpu hx(x);
      host_result(cpu_ops()->fill(ctx, hx.mut(), value));
      return;
    }
    const View X = floating("fill", "x", x);
    dispatch_float(X.dt, [&](auto tag) {
      using T = decltype(tag);
      launch_map<T, T, false, false>(nullptr, X.as<T>(), X.numel(), FillF{value});
    });
  });
}

tsr_status copy(tsr_host_ctx *ctx, const DLTensor *src, DLTensor *dst) noexcept {
  return guarded(ctx, [&] {
    TSR_CHECK(src != nullptr && dst != nullptr, TSR_ERR_INVALID, "copy: src or dst is NULL");
    if (host_side(src) && host_side(dst)) {
      AsCpu hs(src), hd(dst);
      host_result(cpu_ops()->copy(ctx, hs.p, hd.mut()));
      return;
    }
    const View S = copy_view("src", src), D = copy_view("dst", dst);
    check_same_numel("copy", "src", src, S, "dst", dst, D);
    TSR_CHECK(S.dt == D.dt, TSR_ERR_INVALID,
              "copy: src " + describe(src) + " and dst " + describe(dst) +
                  " differ in dtype (cast converts)");
    if (S.numel() == 0 || S.p == D.p) return;
    cudaStream_t stream = compute_stream();
    const auto s0 = reinterpret_cast<uintptr_t>(S.p), d0 = reinterpret_cast<uintptr_t>(D.p);
    if (s0 < d0 + D.bytes() && d0 < s0 + S.bytes()) {
      // Overlapping views of one buffer (memmove semantics): cudaMemcpy
      // does not promise them, so go through a scratch copy.
      void *tmp = scratch(Slot::Temp, S.bytes());
      TSR_CUDA_CHECK(cudaMemcpyAsync(tmp, S.p, S.bytes(), cudaMemcpyDefault, stream));
      TSR_CUDA_CHECK(cudaMemcpyAsync(D.p, tmp, S.bytes(), cudaMemcpyDefault, stream));
    } else {
      TSR_CUDA_CHECK(cudaMemcpyAsync(D.p, S.p, S.bytes(), cudaMemcpyDefault, stream));
    }
    // Pageable memory on either end: wait, so the caller may read dst, or
    // free or reuse src, as soon as we return. Pinned memory (kDLCUDAHost)
    // stays asynchronous, ordered on the compute stream like every op.
    if (dst->device.device_type == kDLCPU || src->device.device_type == kDLCPU)
      TSR_CUDA_CHECK(cudaStreamSynchronize(stream));
  });
}

tsr_status cast(tsr_host_ctx *ctx, const DLTensor *x, DLTensor *y) noexcept {
  return guarded(ctx, [&] {
    if (side_of("cast", {{"x", x}, {"y", y}}) == Side::Host) {
      AsCpu hx(x), hy(y);
      host_result(need_cpu(cpu_ops()->cast, "cast")(ctx, hx.p, hy.mut()));
      return;
    }
    const View X = floating("cast", "x", x), Y = floating("cast", "y", y);
    check_same_numel("cast", "x", x, X, "y", y, Y);
    if (X.numel() == 0) return;
    if (X.dt == Y.dt) {
      if (X.p != Y.p)
        TSR_CUDA_CHECK(
            cudaMemcpyAsync(Y.p, X.p, X.bytes(), cudaMemcpyDeviceToDevice, compute_stream()));
      return;
    }
    const auto x0 = reinterpret_cast<uintptr_t>(X.p), y0 = reinterpret_cast<uintptr_t>(Y.p);
    TSR_CHECK(!(x0 < y0 + Y.bytes() && y0 < x0 + X.bytes()), TSR_ERR_INVALID,
              "cast: x " + describe(x) + " and y " + describe(y) + " overlap in memory");
    dispatch_float(X.dt, [&](auto xtag) {
      using Tx = decltype(xtag);
      dispatch_float(Y.dt, [&](auto ytag) {
        using Ty = decltype(ytag);
        launch_map<Tx, Ty, true, false>(X.as<Tx>(), Y.as<Ty>(), X.numel(), CastF{});
      });
    });
  });
}

void launch_axpy(float alpha, const View &x, const View &y) {
  dispatch_float(x.dt, [&](auto xtag) {
    using Tx = decltype(xtag);
    dispatch_float(y.dt, [&](auto ytag) {
      using Ty = decltype(ytag);
      launch_map<Tx, Ty, true, true>(x.as<Tx>(), y.as<Ty>(), x.numel(), AxpyF{alpha});
    });
  });
}

tsr_status axpy(tsr_host_ctx *ctx, float alpha, const DLTensor *x, DLTensor *y) noexcept {
  return guarded(ctx, [&] {
    if (side_of("axpy", {{"x", x}, {"y", y}}) == Side::Host) {
      AsCpu hx(x), hy(y);
      host_result(cpu_ops()->axpy(ctx, alpha, hx.p, hy.mut()));
      return;
    }
    const View X = floating("axpy", "x", x), Y = floating("axpy", "y", y);
    check_same_numel("axpy", "x", x, X, "y", y, Y);
    // x and y may differ in dtype (a bf16 gradient into a float32 sum).
    launch_axpy(alpha, X, Y);
  });
}

tsr_status scale(tsr_host_ctx *ctx, float alpha, DLTensor *y) noexcept {
  return guarded(ctx, [&] {
    if (side_of("scale", {{"y", y}}) == Side::Host) {
      AsCpu hy(y);
      host_result(cpu_ops()->scale(ctx, alpha, hy.mut()));
      return;
    }
    launch_scale(floating("scale", "y", y), alpha);
  });
}

tsr_status sum_squares(tsr_host_ctx *ctx, const DLTensor *x, double *out) noexcept {
  return guarded(ctx, [&] {
    if (side_of("sum_squares", {{"x", x}}) == Side::Host) {
      AsCpu hx(x);
      host_result(cpu_ops()->sum_squares(ctx, hx.p, out));
      return;
    }
    const View X = floating("sum_squares", "x", x);
    TSR_CHECK(out != nullptr, TSR_ERR_INVALID, "sum_squares: out is NULL");
    const int64_t n = X.numel();
    constexpr int kThreads = 256;
    const int64_t packs = aligned16(X.p) ? n / kPack : 0;
    // A fixed grid for a given n (see sum_squares_partial).
    const unsigned grid = grid_for(packs > 0 ? packs : n, kThreads);
    double *partial = static_cast<double *>(scratch(Slot::Partials, sizeof(double) * (grid + 1)));
    cudaStream_t stream = compute_stream();
    dispatch_float(X.dt, [&](auto tag) {
      using T = decltype(tag);
      sum_squares_partial<T><<<grid, kThreads, 0, stream>>>(X.as<T>(), n, packs, partial);
      check_launch();
    });
    sum_partials<<<1, 1024, 0, stream>>>(partial, static_cast<int>(grid), partial + grid);
    check_launch();
    read_back(out, partial + grid, sizeof(double));
  });
}

}  // namespace tessera::cuda
