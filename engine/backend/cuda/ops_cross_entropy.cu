// CUDA op: softmax cross-entropy over the rows of float32, bfloat16 or
// float16 logits, with float32 arithmetic inside: the loss sum, the counts
// of counted and correctly predicted rows, and optionally the gradient.
// Semantics follow the CPU op (backend/cpu/cpu_ops_nn.cpp).
//
// Deterministic: the rows' losses are added up in a fixed order by a
// second pass, so the loss repeats bit for bit.
#include "backend/cpu/cpu_ops.hpp"
#include "backend/cuda/cuda_ops_internal.hpp"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;

// ---------------------------------------------------------------------------
// Cross-entropy. Pass 0 checks the targets; pass 1 is one block per row
// (online max / sum-of-exp / argmax, then the gradient), and writes the
// row's loss; pass 2 adds the rows up in a fixed order. Pass 1 does nothing
// when pass 0 found a bad target, so a failed call writes no gradient.

struct CeResult {
  double loss;
  long long count;
  long long correct;
  long long bad_row;
  long long bad_target;
};

__global__ void ce_check(const int32_t *targets, int64_t rows, int64_t valid, long long *bad_row) {
  for (int64_t r = global_thread(); r < rows; r += global_threads())
    if (targets[r] >= valid) atomicMin(bad_row, static_cast<long long>(r));
}

// The running state of a softmax over part of a row: max, sum of
// exp(x - max), and the first index of the max.
struct Online {
  float m;
  float s;
  int64_t arg;
};

__device__ __forceinline__ void online_add(Online &o, float x, int64_t j) {
  if (x > o.m) {
    o.s = o.s * __expf(o.m - x) + 1.0f;  // o.m = -inf at first: 0 * 0 + 1
    o.m = x;
    o.arg = j;
  } else {
    o.s += expf(x - o.m);
  }
}

// Eight values at once: their max first, so the running sum is rescaled at
// most once per pack and each value costs one fast exp (x - max <= 0, where
// __expf's error is a few ulp) instead of a branch and an accurate expf.
__device__ __forceinline__ void online_pack(Online &o, const float (&v)[kPack], int64_t base) {
  float pm = v[0];
  int pj = 0;
#pragma unroll
  for (int j = 1; j < kPack; j++)
    if (v[j] > pm) pm = v[j], pj = j;  // the first index of the pack's max
  if (pm > o.m) {
    o.s *= __expf(o.m - pm);  // o.m = -inf at first: 0 * 0
    o.m = pm;
    o.arg = base + pj;
  }
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < kPack; j++) acc += __expf(v[j] - o.m);
  o.s += acc;
}

__device__ __forceinline__ Online online_merge(const Online &a, const Online &b) {
  if (b.s == 0.0f) return a;  // an empty side
  if (a.s == 0.0f) return b;
  Online o;
  o.m = fmaxf(a.m, b.m);
  o.s = a.s * expf(a.m - o.m) + b.s * expf(b.m - o.m);
  // The first index among equal maxima, as the CPU's `>` scan keeps.
  o.arg = a.m > b.m ? a.arg : (b.m > a.m ? b.arg : (a.arg < b.arg ? a.arg : b.arg));
  return o;
}

__device__ __forceinline__ Online online_warp(Online o) {
#pragma unroll
  for (int k = 16; k > 0; k >>= 1) {
    Online other;
    other.m = __shfl_xor_sync(0xffffffffu, o.m, k);
    other.s = __shfl_xor_sync(0xffffffffu, o.s, k);
    other.arg = __shfl_xor_sync(0xffffffffu, o.arg, k);
    // Merge in lane order so every lane computes the same result.
    o = (threadIdx.x & k) ? online_merge(other, o) : online_merge(o, other);
  }
  return o;
}

template <typename T>
__global__ void __launch_bounds__(256)
    ce_rows(const T *logits, const int32_t *targets, int64_t cols, int64_t valid, float grad_scale,
            T *dlogits, bool vec, const long long *bad_row, double *row_loss, int8_t *row_state) {
  if (*bad_row != kNoBadRow) return;
  __shared__ Online sh[32];
  __shared__ float sh_xt;
  const int64_t r = blockIdx.x;
  const T *x = logits + r * cols;
  T *d = dlogits ? dlogits + r * cols : nullptr;
  const int32_t t = targets[r];
  if (t < 0) {  // ignored row: no loss, zero gradient
    if (d)
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) d[j] = from_f<T>(0.0f);
    if (threadIdx.x == 0) {
      row_loss[r] = 0.0;
      row_state[r] = 0;
    }
    return;
  }
  // vec: packs, as rows are 16-byte aligned (cols % 8 == 0, aligned bases).
  const int64_t packs = vec ? valid / kPack : 0;
  Online o{-INFINITY, 0.0f, 0};
  // Four packs' loads in flight a thread before their math (measured on an
  // H200 at [16384, 50304] bf16: 1.21 ms against 1.29 one pack at a time).
  constexpr int kAhead = 4;
  const int64_t step = blockDim.x;
  int64_t p = threadIdx.x;
  for (; p + (kAhead - 1) * step < packs; p += kAhead * step) {
    float v[kAhead][kPack];
#pragma unroll
    for (int k = 0; k < kAhead; k++) load8(x + (p + k * step) * kPack, v[k]);
#pragma unroll
    for (int k = 0; k < kAhead; k++) online_pack(o, v[k], (p + k * step) * kPack);
  }
  for (; p < packs; p += step) {
    float v[kPack];
    load8(x + p * kPack, v);
    online_pack(o, v, p * kPack);
  }
  for (int64_t j = packs * kPack + threadIdx.x; j < valid; j += blockDim.x)
    online_add(o, to_f(x[j]), j);
  o = online_warp(o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) sh[warp] = o;
  if (threadIdx.x == 0) sh_xt = to_f(x[t]);  // read before any gradient write (aliasing)
  __syncthreads();
  o = lane < static_cast<int>(blockDim.x / 32) ? sh[lane] : Online{-INFINITY, 0.0f, 0};
  o = online_warp(o);
  const float xt = sh_xt;
  if (threadIdx.x == 0) {
    row_loss[r] = static_cast<double>(o.m) + log(static_cast<double>(o.s)) - xt;
    row_state[r] = o.arg == t ? 2 : 1;
  }
  if (!d) return;
  // softmax_j = exp(x_j - max) / sum; each x_j is read before d_j is
  // written, by the same thread, so d may alias x.
  const float g = grad_scale / o.s;
  const int64_t tpacks = vec ? cols / kPack : 0;
  for (int64_t p = threadIdx.x; p < tpacks; p += blockDim.x) {
    float v[kPack];
    load8(x + p * kPack, v);
#pragma unroll
    for (int j = 0; j < kPack; j++) {
      const int64_t col = p * kPack + j;
      v[j] = col < valid ? g * __expf(v[j] - o.m) - (col == t ? grad_scale : 0.0f) : 0.0f;
    }
    store8(d + p * kPack, v);
  }
  for (int64_t j = tpacks * kPack + threadIdx.x; j < cols; j += blockDim.x) {
    const float v = j < valid ? g * __expf(to_f(x[j]) - o.m) - (j == t ? grad_scale : 0.0f) : 0.0f;
    d[j] = from_f<T>(v);
  }
}

__global__ void ce_total(const double *row_loss, const int8_t *row_state, const int32_t *targets,
                         int64_t rows, const long long *bad_row, CeResult *out) {
  __shared__ double sh_d[32];
  __shared__ long long sh_i[32];
  double loss = 0.0;
  long long count = 0, correct = 0;
  const bool bad = *bad_row != kNoBadRow;
  if (!bad) {
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
      loss += row_loss[r];
      count += row_state[r] > 0;
      correct += row_state[r] == 2;
    }
  }
  loss = block_sum(loss, sh_d);
  count = block_sum(count, sh_i);
  correct = block_sum(correct, sh_i);
  if (threadIdx.x == 0) {
    out->loss = loss;
    out->count = count;
    out->correct = correct;
    out->bad_row = *bad_row;
    out->bad_target = bad ? targets[*bad_row] : 0;
  }
}

}  // namespace

tsr_status cross_entropy(tsr_host_ctx *ctx, const DLTensor *logits, const DLTensor *targets,
                         int64_t valid_classes, float grad_scale, DLTensor *dlogits,
                         double *loss_sum, int64_t *count, int64_t *correct) noexcept {
  return guarded(ctx, [&] {
    if (side_of("cross_entropy",
                {{"logits", logits}, {"targets", targets}, {"dlogits", dlogits}}) == Side::Host) {
      AsCpu hl(logits), ht(targets), hd(dlogits);
      host_result(cpu_ops()->cross_entropy(ctx, hl.p, ht.p, valid_classes, grad_scale, hd.mut(),
                                           loss_sum, count, correct));
      return;
    }
    const View L = floating("cross_entropy", "logits", logits, 1);
    const View T = i32("cross_entropy", "targets", targets);
    TSR_CHECK(T.numel() == L.rows, TSR_ERR_INVALID,
              "cross_entropy: targets " + describe(targets) + " must have one entry per row of " +
                  "logits " + describe(logits) + " (" + std::to_string(L.rows) + " rows)");
    TSR_CHECK(valid_classes <= L.cols, TSR_ERR_INVALID,
              "cross_entropy: valid_classes " + std::to_string(valid_classes) +
                  " exceeds the last dim of logits " + describe(logits));
    TSR_CHECK(loss_sum != nullptr && count != nullptr, TSR_ERR_INVALID,
              "cross_entropy: loss_sum and count must not be NULL");
    TSR_CHECK(L.rows < (int64_t(1) << 31), TSR_ERR_UNSUPPORTED,
              "cross_entropy: too many rows in logits " + describe(logits));
    View DL{};
    if (dlogits) {
      DL = floating("cross_entropy", "dlogits", dlogits, 1);
      TSR_CHECK(
          DL.rows == L.rows && DL.cols == L.cols && DL.dt == L.dt, TSR_ERR_INVALID,
          "cross_entropy: dlogits " + describe(dlogits) + " must match logits " + describe(logits));
    }
    const int64_t rows = L.rows, V = valid_classes > 0 ? valid_classes : L.cols;
    CeResult res{0.0, 0, 0, kNoBadRow, 0};
    if (rows > 0) {
      TSR_CHECK(V > 0, TSR_ERR_INVALID,
                "cross_entropy: logits " + describe(logits) + " have no classes");
      cudaStream_t stream = compute_stream();
      // One scratch block: [result | bad_row | row losses | row states].
      const size_t off_flag = 64, off_loss = 128, off_state = off_loss + sizeof(double) * rows;
      char *base = static_cast<char *>(scratch(Slot::Rows, off_state + rows));
      auto *out = reinterpret_cast<CeResult *>(base);
      auto *flag = reinterpret_cast<long long *>(base + off_flag);
      auto *row_loss = reinterpret_cast<double *>(base + off_loss);
      auto *row_state = reinterpret_cast<int8_t *>(base + off_state);
      TSR_CUDA_CHECK(cudaMemsetAsync(flag, 0x7f, sizeof(long long), stream));
      ce_check<<<grid_for(rows, kThreads), kThreads, 0, stream>>>(T.as<int32_t>(), rows, V, flag);
      check_launch();
      // Small blocks for wide rows: more rows in flight an SM hide the
      // latency of the reads better than more threads a row (measured on an
      // H200 at [16384, 50304] bf16: 256 threads 1.29 ms, 512 1.40, 1024 1.69).
      const int threads = V >= 1024 ? 256 : 128;
      const bool vec = L.cols % kPack == 0 && aligned16(L.p) && (!dlogits || aligned16(DL.p));
      dispatch_float(L.dt, [&](auto tag) {
        using TT = decltype(tag);
        ce_rows<TT><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
            L.as<TT>(), T.as<int32_t>(), L.cols, V, grad_scale, dlogits ? DL.as<TT>() : nullptr,
            vec, flag, row_loss, row_state);
        check_launch();
      });
      ce_total<<<1, 1024, 0, stream>>>(row_loss, row_state, T.as<int32_t>(), rows, flag, out);
      check_launch();
      read_back(&res, out, sizeof(res));
    }
    TSR_CHECK(res.bad_row == kNoBadRow, TSR_ERR_INVALID,
              "cross_entropy: row " + std::to_string(res.bad_row) + " has target " +
                  std::to_string(res.bad_target) + " but only " + std::to_string(V) +
                  " valid classes (logits " + describe(logits) + ")");
    *loss_sum = res.loss;
    *count = res.count;
    if (correct) *correct = res.correct;
  });
}

}  // namespace tessera::cuda
