// The engine's grouped-query attention on CUDA where cuDNN does not take
// the call (attention_gqa.cpp): the multi-head flash kernels run on key and
// value heads repeated per query head, and the gradients of those copies
// are summed back over each group. These are the two copies.
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
    group_sum_kernel<E><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(
        static_cast<const E *>(src), d, T, Hk, D, group, n);
    check_launch();
  });
}

}  // namespace tessera::cuda
