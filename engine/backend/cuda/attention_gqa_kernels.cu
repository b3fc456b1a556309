// The engine's grouped-query attention on CUDA where cuDNN does not take
// the call (attention_gqa.cpp): the multi-head flash kernels run on key and
// value heads repeated per query head, and the gradients of those copies
// are summed back over each group. These are the two copies.
#include <cstdint>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/ops_decoder.hpp"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;

// dst [B, T, H, D] compact = src [B, T, Hk, D] (strided) repeated: head h
// of dst is head h / group of src.
template <typename T>
__global__ void expand_kernel(const attn::Ten<T> src, T *dst, int64_t T_, int64_t H, int64_t D,
                              int64_t group, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += global_threads()) {
    const int64_t d = i % D, h = (i / D) % H, t = (i / (D * H)) % T_, b = i / (D * H * T_);
    dst[i] = src.p[b * src.sb + t * src.st + (h / group) * src.sh + d * src.sd];
  }
}

// dst [B, T, Hk, D] (strided) = the sum over each group of src [B, T, H, D]
// compact, added in head order in float32 and rounded once.
template <typename T>
__global__ void group_sum_kernel(const T *src, attn::Ten<T> dst, int64_t T_, int64_t Hk, int64_t D,
                                 int64_t group, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += global_threads()) {
    const int64_t d = i % D, hk = (i / D) % Hk, t = (i / (D * Hk)) % T_, b = i / (D * Hk * T_);
    const T *s = src + ((b * T_ + t) * Hk * group + hk * group) * D + d;
    float acc = 0.0f;
    for (int64_t j = 0; j < group; j++) acc += to_f(s[j * D]);
    dst.p[b * dst.sb + t * dst.st + hk * dst.sh + d * dst.sd] = from_f<T>(acc);
  }
}

// The same two copies a row (b, t) per block and 16 bytes per thread
// (8 bf16/fp16 or 4 float32 elements), where the heads are contiguous in
// D and every row and head starts 16-byte aligned (what `vectorizable`
// checks): the index arithmetic is one division per block, not four
// 64-bit ones per element as above. The sums keep the head order, so both
// forms give the same bits.
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

template <typename T>
__global__ void expand_rows_kernel(const attn::Ten<T> src, T *dst, int64_t T_, int H, int D,
                                   int group) {
  const int64_t row = blockIdx.x;  // b * T_ + t
  const T *s = src.p + (row / T_) * src.sb + (row % T_) * src.st;
  T *d_row = dst + row * H * D;
  for (int e = threadIdx.x * kVec<T>; e < H * D; e += blockDim.x * kVec<T>) {
    const int h = e / D, d = e - h * D;
    *reinterpret_cast<uint4 *>(d_row + e) =
        *reinterpret_cast<const uint4 *>(s + (h / group) * src.sh + d);
  }
}

template <typename T>
__global__ void group_sum_rows_kernel(const T *src, attn::Ten<T> dst, int64_t T_, int Hk, int D,
                                      int group) {
  const int64_t row = blockIdx.x;
  const T *s_row = src + row * Hk * group * D;
  T *d = dst.p + (row / T_) * dst.sb + (row % T_) * dst.st;
  for (int e = threadIdx.x * kVec<T>; e < Hk * D; e += blockDim.x * kVec<T>) {
    const int hk = e / D, dd = e - hk * D;
    float acc[kVec<T>];
#pragma unroll
    for (int k = 0; k < kVec<T>; k++) acc[k] = 0.0f;
    for (int j = 0; j < group; j++) {
      const uint4 raw = *reinterpret_cast<const uint4 *>(s_row + (hk * group + j) * D + dd);
      const T *v = reinterpret_cast<const T *>(&raw);
#pragma unroll
      for (int k = 0; k < kVec<T>; k++) acc[k] += to_f(v[k]);
    }
    uint4 out;
    T *o = reinterpret_cast<T *>(&out);
#pragma unroll
    for (int k = 0; k < kVec<T>; k++) o[k] = from_f<T>(acc[k]);
    *reinterpret_cast<uint4 *>(d + hk * dst.sh + dd) = out;
  }
}

// Whether a strided [B, T, heads, D] tensor takes the 16-byte kernels.
template <typename T>
bool vectorizable(const attn::Bthd &t, int64_t D) {
  const int64_t v = kVec<T>;
  return t.sd == 1 && D % v == 0 && t.sb % v == 0 && t.st % v == 0 && t.sh % v == 0 &&
         reinterpret_cast<uintptr_t>(t.p) % 16 == 0;
}

template <typename F>
void dispatch_dt(attn::Dt dt, F &&f) {
  if (dt == attn::Dt::F32) {
    f(float{});
  } else if (dt == attn::Dt::BF16) {
    f(__nv_bfloat16{});
  } else {
    f(__half{});
  }
}

}  // namespace

void launch_gqa_expand(const attn::Bthd &src, attn::Dt dt, void *dst, int64_t B, int64_t T,
                       int64_t H, int64_t D, int64_t group) {
  const int64_t n = B * T * H * D;
  if (n == 0) return;
  dispatch_dt(dt, [&](auto tag) {
    using E = decltype(tag);
    const attn::Ten<E> s{static_cast<E *>(src.p), src.sb, src.st, src.sh, src.sd, false};
    if (vectorizable<E>(src, D) && reinterpret_cast<uintptr_t>(dst) % 16 == 0)
      expand_rows_kernel<E><<<static_cast<unsigned>(B * T), kThreads, 0, compute_stream()>>>(
          s, static_cast<E *>(dst), T, static_cast<int>(H), static_cast<int>(D),
          static_cast<int>(group));
    else
      expand_kernel<E><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(
          s, static_cast<E *>(dst), T, H, D, group, n);
    check_launch();
  });
}

void launch_gqa_group_sum(const void *src, attn::Dt dt, const attn::Bthd &dst, int64_t B, int64_t T,
                          int64_t Hk, int64_t D, int64_t group) {
  const int64_t n = B * T * Hk * D;
  if (n == 0) return;
  dispatch_dt(dt, [&](auto tag) {
    using E = decltype(tag);
    const attn::Ten<E> d{static_cast<E *>(dst.p), dst.sb, dst.st, dst.sh, dst.sd, false};
    if (vectorizable<E>(dst, D) && reinterpret_cast<uintptr_t>(src) % 16 == 0)
      group_sum_rows_kernel<E><<<static_cast<unsigned>(B * T), kThreads, 0, compute_stream()>>>(
          static_cast<const E *>(src), d, T, static_cast<int>(Hk), static_cast<int>(D),
          static_cast<int>(group));
    else
      group_sum_kernel<E><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(
          static_cast<const E *>(src), d, T, Hk, D, group, n);
    check_launch();
  });
}

}  // namespace tessera::cuda
