// CUDA ops, rotary position embedding (ABI 1.6), Hugging Face's rotate_half
// convention, in place on q and k (float32, bfloat16 or float16; strided
// views with unit stride along D, so they may be parts of a fused qkv
// buffer). One block per token: its cos and sin are computed once, in
// double from position * inv_freq and rounded to float32 (the CPU op's
// values), into shared memory, then every head of q and k is rotated with
// float32 arithmetic. inv_freq comes from util/dltensor.hpp, as on the CPU.
#include <vector>

#include "backend/cpu/cpu_ops.hpp"
#include "backend/cuda/attention.cuh"
#include "backend/cuda/cuda_ops_internal.hpp"
#include "backend/cuda/ops_decoder.hpp"
#include "util/dltensor.hpp"

namespace tessera::cuda {

namespace {

using attn::Bthd;
using attn::Dims;
using attn::Dt;

constexpr int kMaxHalf = 256;  // head dims up to 512
constexpr int kThreads = 128;

struct Freqs {
  double inv[kMaxHalf];
};

template <typename T>
struct Side4 {
  T *p;
  int64_t sb, st, sh;
  int H;
};

template <typename T>
__device__ __forceinline__ void rotate_heads(const Side4<T> &x, int b, int t, int half,
                                             const float *c, const float *s, float sign) {
  if (!x.p) return;
  for (int e = threadIdx.x; e < x.H * half; e += blockDim.x) {
    const int h = e / half, i = e % half;
    T *row = x.p + b * x.sb + t * x.st + h * x.sh;
    const float x1 = to_f(row[i]), x2 = to_f(row[i + half]), ci = c[i], si = sign * s[i];
    row[i] = from_f<T>(x1 * ci - x2 * si);
    row[i + half] = from_f<T>(x2 * ci + x1 * si);
  }
}

template <typename T>
__global__ void rope_kernel(Side4<T> q, Side4<T> k, const int32_t *pos, int T_, int half,
                            const Freqs f, float sign) {
  __shared__ float c[kMaxHalf], s[kMaxHalf];
  const int b = blockIdx.x / T_, t = blockIdx.x % T_;
  const double p = pos[blockIdx.x];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    double sv, cv;
    sincos(p * f.inv[i], &sv, &cv);
    c[i] = static_cast<float>(cv);
    s[i] = static_cast<float>(sv);
  }
  __syncthreads();
  rotate_heads(q, b, t, half, c, s, sign);
  rotate_heads(k, b, t, half, c, s, sign);
}

template <typename T>
Side4<T> side4(const Bthd *v, const Dims &d) {
  if (!v) return Side4<T>{nullptr, 0, 0, 0, 0};
  return Side4<T>{static_cast<T *>(v->p), v->sb, v->st, v->sh, static_cast<int>(d.H)};
}

void rope(tsr_host_ctx *ctx, const char *op, const tsr_rope_params *rp, const DLTensor *positions,
          DLTensor *q, DLTensor *k, bool forward) {
  const char *qn = forward ? "q" : "dq", *kn = forward ? "k" : "dk";
  if (side_of(op, {{"positions", positions}, {qn, q}, {kn, k}}) == Side::Host) {
    AsCpu hp(positions), hq(q), hk(k);
    const tsr_ops *cpu = cpu_ops();
    auto fn = forward ? cpu->rope_forward : cpu->rope_backward;
    host_result(need_cpu(fn, op)(ctx, rp, hp.p, hq.mut(), hk.mut()));
    return;
  }
  TSR_CHECK(q || k, TSR_ERR_INVALID, std::string(op) + ": " + qn + " and " + kn + " are both NULL");
  Dims dq, dk;
  Dt tq = Dt::F32, tk = Dt::F32;
  Bthd vq{}, vk{};
  if (q) vq = attn::check_bthd(op, qn, q, dq, tq, true);
  if (k) vk = attn::check_bthd(op, kn, k, dk, tk, true);
  if (q && k)
    TSR_CHECK(dq.B == dk.B && dq.T == dk.T && dq.D == dk.D && tq == tk, TSR_ERR_INVALID,
              std::string(op) + ": " + kn + " " + describe(k) +
                  " must match the B, T, D and dtype of " + qn + " " + describe(q));
  const Dims &d = q ? dq : dk;
  const Dt dt = q ? tq : tk;
  for (const Bthd *v : {q ? &vq : nullptr, k ? &vk : nullptr})
    TSR_CHECK(!v || v->sd == 1 || d.D <= 1, TSR_ERR_UNSUPPORTED,
              std::string(op) + ": q and k need unit stride along D");
  const View P = i32(op, "positions", positions);
  TSR_CHECK(positions->ndim == 2 && positions->shape[0] == d.B && positions->shape[1] == d.T,
            TSR_ERR_INVALID,
            std::string(op) + ": positions " + describe(positions) + " must be [B, T] = [" +
                std::to_string(d.B) + "," + std::to_string(d.T) + "]");
  const std::vector<double> inv = rope_inv_freq(op, rp, d.D);
  const int64_t half = d.D / 2;
  TSR_CHECK(half <= kMaxHalf, TSR_ERR_UNSUPPORTED,
            std::string(op) + ": head dim " + std::to_string(d.D) + " is over the CUDA op's " +
                std::to_string(2 * kMaxHalf));
  TSR_CHECK(d.B * d.T < (int64_t(1) << 31), TSR_ERR_UNSUPPORTED,
            std::string(op) + ": B * T is too large");
  if (d.B * d.T == 0) return;
  Freqs f{};
  for (int64_t i = 0; i < half; i++) f.inv[i] = inv[i];
  const float sign = forward ? 1.0f : -1.0f;
  const auto run = [&](auto tag) {
    using T = decltype(tag);
    rope_kernel<T><<<static_cast<unsigned>(d.B * d.T), kThreads, 0, compute_stream()>>>(
        side4<T>(q ? &vq : nullptr, dq), side4<T>(k ? &vk : nullptr, dk), P.as<int32_t>(),
        static_cast<int>(d.T), static_cast<int>(half), f, sign);
    check_launch();
  };
  if (dt == Dt::F32) {
    run(float{});
  } else if (dt == Dt::BF16) {
    run(__nv_bfloat16{});
  } else {
    run(__half{});
  }
}

}  // namespace

tsr_status rope_forward(tsr_host_ctx *ctx, const tsr_rope_params *rope_params,
                        const DLTensor *positions, DLTensor *q, DLTensor *k) noexcept {
  return guarded(ctx, [&] { rope(ctx, "rope_forward", rope_params, positions, q, k, true); });
}

tsr_status rope_backward(tsr_host_ctx *ctx, const tsr_rope_params *rope_params,
                         const DLTensor *positions, DLTensor *dq, DLTensor *dk) noexcept {
  return guarded(ctx, [&] { rope(ctx, "rope_backward", rope_params, positions, dq, dk, false); });
}

}  // namespace tessera::cuda
