// Causal attention backward on CUDA, flash-attention-2 style:
//
//   1. preprocess:  Di[b,h,t] = rowsum(dO * O)  (fp32 scratch), and dq's fp32
//                   accumulator zeroed (bf16/fp16 only).
//   2. main kernel: one block owns 64 keys of one (batch, head) and walks the
//                   query blocks at or after its diagonal. It recomputes
//                   P^T = exp(K Q^T * scale - lse) from the saved lse, and
//                   accumulates dV += P^T dO and dK += dS^T Q in registers, so
//                   dK and dV are written once, deterministically. dS^T goes
//                   through shared memory to form dQ's partial dS K, which is
//                   added into the fp32 accumulator with atomics (a query
//                   block receives one partial per key block).
//   3. cast:        dq = accumulator * scale, in dq's dtype and strides.
//
// fp32 runs on CUDA cores without atomics: one kernel for dq (a warp per
// query row), one for dk/dv (a warp per key row), both deterministic
// (attention_backward_f32.cu).
//
// With positions (ABI 1.8 attention_packed_*) P is 0 outside each query's
// window [window_start, i]: the tensor-core kernel's DOC instantiation
// keeps the window starts of its query blocks beside lse and Di, masks
// every block, and ends each key block's walk at the last query whose
// window reaches it (packed examples: the end of its document); the fp32
// kernels mask per pair and skip tiles wholly before a query's window.
#include <mutex>

#include "backend/cuda/attention.cuh"

namespace tessera::cuda {
namespace attn {
namespace {

constexpr int kBr = 64;  // queries per step
constexpr int kBc = 64;  // keys per block (4 warps x 16)
constexpr int kThreads = 128;

// ---------------------------------------------------------------------------
// Scratch: fp32 [B, H, T] for Di, then [B, H, T, D] for dq's accumulator.
// Grown on demand and kept; only the compute stream touches it, so a reuse
// is ordered after the last use.

std::mutex scratch_mu;
void *scratch_p = nullptr;
size_t scratch_cap = 0;

float *scratch_floats(size_t n) {
  std::lock_guard<std::mutex> lock(scratch_mu);
  const size_t bytes = n * sizeof(float);
  if (bytes > scratch_cap) {
    if (scratch_p) {
      // The old block may still be in use by queued kernels.
      TSR_CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
      device_free(scratch_p);
      scratch_p = nullptr;
      scratch_cap = 0;
    }
    const size_t grow = bytes + bytes / 4;  // some headroom against creeping sizes
    scratch_p = device_alloc(grow);
    scratch_cap = grow;
  }
  return static_cast<float *>(scratch_p);
}

// ---------------------------------------------------------------------------
// 1. Di = rowsum(dO * O): one warp per (b, t, h) row.

template <typename T>
__global__ void di_kernel(const Ten<T> o, const Ten<T> dout, float *di, int T_, int H, int D,
                          int64_t rows) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= rows) return;
  // rows ordered (b, h, t) so di's writes are contiguous.
  const int t = static_cast<int>(warp % T_);
  const int64_t bh = warp / T_;
  const int b = static_cast<int>(bh / H), h = static_cast<int>(bh % H);
  const T *po = o.at(b, h) + t * o.st, *pd = dout.at(b, h) + t * dout.st;
  float acc = 0.0f;
  for (int i = lane; i < D; i += 32) acc += to_f(po[i * o.sd]) * to_f(pd[i * dout.sd]);
  for (int off = 16; off; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) di[warp] = acc;
}

// The same for 2-byte types where the views move in 16-byte packs (vec16)
// and a row's D / 8 packs divide a warp (1 << lanes_log2 threads a row):
// a pack a thread, the row's sum over its threads' lanes.
template <typename T>
__global__ void di_vec_kernel(const Ten<T> o, const Ten<T> dout, float *di, int T_, int H,
                              int lanes_log2, int64_t rows) {
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = thread >> lanes_log2;
  const int part = static_cast<int>(thread & ((1 << lanes_log2) - 1));
  float acc = 0.0f;
  if (row < rows) {  // the rest of the warp still joins the shuffles below
    const int t = static_cast<int>(row % T_);
    const int64_t bh = row / T_;
    const int b = static_cast<int>(bh / H), h = static_cast<int>(bh % H);
    const uint4 op = *reinterpret_cast<const uint4 *>(o.at(b, h) + t * o.st + part * 8);
    const uint4 dp = *reinterpret_cast<const uint4 *>(dout.at(b, h) + t * dout.st + part * 8);
    const T *ov = reinterpret_cast<const T *>(&op), *dv = reinterpret_cast<const T *>(&dp);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc += to_f(ov[i]) * to_f(dv[i]);
  }
  for (int off = (1 << lanes_log2) / 2; off; off /= 2)
    acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (row < rows && part == 0) di[row] = acc;
}

template <typename T>
void launch_di(const Ten<T> &o, const Ten<T> &dout, float *di, int T_, int H, int D, int64_t rows,
               cudaStream_t st) {
  if constexpr (sizeof(T) == 2) {
    const int packs = D / 8;  // a row's 16-byte packs, where they divide a warp
    if (o.vec && dout.vec && packs <= 32 && (packs & (packs - 1)) == 0) {
      const int lanes_log2 = __builtin_ctz(static_cast<unsigned>(packs));
      const unsigned blocks = static_cast<unsigned>(((rows << lanes_log2) + 255) / 256);
      di_vec_kernel<T><<<blocks, 256, 0, st>>>(o, dout, di, T_, H, lanes_log2, rows);
      return check_launch();
    }
  }
  const unsigned blocks = static_cast<unsigned>((rows * 32 + 255) / 256);
  di_kernel<T><<<blocks, 256, 0, st>>>(o, dout, di, T_, H, D, rows);
  check_launch();
}

// ---------------------------------------------------------------------------
// 2. Tensor-core main kernel (bf16 / fp16)

template <typename T>
struct BwdParams {
  Ten<T> q, k, v, dout, dk, dv;
  const float *lse;  // [B, H, T]
  const float *di;   // [B, H, T]
  float *dq_acc;     // [B, H, T, D], unscaled
  int T_, H, D;
  float scale, scale_log2;
  const int32_t *pos;  // [B, T] positions (document masking), NULL: causal
};

template <int DP, bool DOC>
constexpr int bwd_smem_bytes() {
  // K, V, Q[2], dO[2] tiles, dS^T [kBc][kBr + 8], then lse[2] and Di[2]
  // rows, and with document masking the window starts [2].
  return (2 * kBc + 4 * kBr) * (DP + 8) * 2 + kBc * (kBr + 8) * 2 + (DOC ? 6 : 4) * kBr * 4;
}

// long-function: kept whole on purpose: one block's pass over its key
// block (recompute P, then dV, dP, dS, dK and the dQ atomics) keeps the
// dK/dV accumulators in registers from the first query block to the last;
// split into device functions they would pass those fragments by
// reference, and whether they stay in registers would rest on the inliner.
template <typename T, int DP, bool DOC>
__global__ void __launch_bounds__(kThreads) bwd_mma_kernel(const BwdParams<T> p) {
  constexpr int PITCH = DP + 8;
  constexpr int SP = kBr + 8;  // dS^T row pitch
  constexpr int KS = DP / 16;
  constexpr int ND = DP / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *sK = reinterpret_cast<T *>(smem_raw);
  T *sV = sK + kBc * PITCH;
  // Q, dO, lse and Di are double-buffered: the next query block streams in
  // (cp.async) while this one computes; 2 blocks fit an SM, too few warps to
  // hide a load's latency otherwise.
  T *sQ = sV + kBc * PITCH;                                 // [2][kBr][PITCH]
  T *sdO = sQ + 2 * kBr * PITCH;                            // [2][kBr][PITCH]
  T *sdS = sdO + 2 * kBr * PITCH;                           // [kBc keys][SP], dS^T
  float *sLse = reinterpret_cast<float *>(sdS + kBc * SP);  // [2][kBr] base-2 lse, +inf past T
  float *sDi = sLse + 2 * kBr;                              // [2][kBr]
  int *sFirst = reinterpret_cast<int *>(sDi + 2 * kBr);     // [2][kBr], DOC only

  const int kb = blockIdx.x;  // block 0 walks every query block: heaviest first
  const int b = blockIdx.y / p.H, h = blockIdx.y % p.H;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nqb = (p.T_ + kBr - 1) / kBr;
  const T *gq = p.q.at(b, h), *gdo = p.dout.at(b, h);
  const int64_t bh_row = (static_cast<int64_t>(b) * p.H + h) * p.T_;

  load_tile<T, kBc, DP, PITCH, kThreads>(sK, p.k.at(b, h), p.k.st, p.k.sd, p.k.vec, kb * kBc, p.T_,
                                         p.D);
  load_tile<T, kBc, DP, PITCH, kThreads>(sV, p.v.at(b, h), p.v.st, p.v.sd, p.v.vec, kb * kBc, p.T_,
                                         p.D);
  // Query block kb (the diagonal, always the first) into buffer 0.
  auto load_q = [&](int qb, int buf) {
    load_tile<T, kBr, DP, PITCH, kThreads>(sQ + buf * kBr * PITCH, gq, p.q.st, p.q.sd, p.q.vec,
                                           qb * kBr, p.T_, p.D);
    load_tile<T, kBr, DP, PITCH, kThreads>(sdO + buf * kBr * PITCH, gdo, p.dout.st, p.dout.sd,
                                           p.dout.vec, qb * kBr, p.T_, p.D);
    cp_async_commit();
    for (int i = threadIdx.x; i < kBr; i += kThreads) {
      const int row = qb * kBr + i;
      // A query past T gets lse = +inf, so its P (and so dS) is exactly 0.
      sLse[buf * kBr + i] = row < p.T_ ? p.lse[bh_row + row] * kLog2e : INFINITY;
      sDi[buf * kBr + i] = row < p.T_ ? p.di[bh_row + row] : 0.0f;
      if constexpr (DOC) sFirst[buf * kBr + i] = row < p.T_ ? window_start(p.pos, b, row, p.T_) : 0;
    }
  };
  load_q(kb, 0);

  float dv[ND][4], dk[ND][4];
#pragma unroll
  for (int nt = 0; nt < ND; nt++)
#pragma unroll
    for (int e = 0; e < 4; e++) dv[nt][e] = dk[nt][e] = 0.0f;
  const int key_g = kb * kBc + warp * 16 + lane / 4;  // key of c0/c1; c2/c3 is key_g + 8

  // With document masking only the rows whose window reaches back into
  // this key block see one of its keys; the query blocks past the last
  // such row have P = 0 here and are skipped (packed examples: the walk
  // ends with the block's document instead of at T). Exact for any
  // positions: every row past the block is asked.
  int nq_end = nqb;
  if constexpr (DOC) {
    __shared__ int last_row;
    const int last_key = min(kb * kBc + kBc - 1, p.T_ - 1);
    if (threadIdx.x == 0) last_row = last_key;
    __syncthreads();
    for (int r = last_key + 1 + threadIdx.x; r < p.T_; r += kThreads)
      if (window_start(p.pos, b, r, p.T_) <= last_key) atomicMax(&last_row, r);
    __syncthreads();
    nq_end = last_row / kBr + 1;
  }

  for (int qb = kb; qb < nq_end; qb++) {
    const int buf = (qb - kb) & 1;
    // Prefetch the next query block into the other buffer (free: everyone
    // passed the barrier closing the previous iteration), wait for this one.
    if (qb + 1 < nq_end) {
      load_q(qb + 1, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T *cQ = sQ + buf * kBr * PITCH, *cdO = sdO + buf * kBr * PITCH;
    const float *cLse = sLse + buf * kBr, *cDi = sDi + buf * kBr;
    const int *cFirst = sFirst + buf * kBr;
    (void)cFirst;  // read by the DOC instantiation only

    // S^T = K Q^T: this warp's 16 keys x 64 queries.
    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
      uint32_t a[4];
      ldsm4(a, sK + (warp * 16 + lane % 16) * PITCH + ks * 16 + (lane / 16) * 8);
#pragma unroll
      for (int np = 0; np < 4; np++) {
        uint32_t r[4];
        ldsm4(r,
              cQ + (np * 16 + lane % 8 + (lane / 16) * 8) * PITCH + ks * 16 + ((lane / 8) % 2) * 8);
        mma16816<T>(s[2 * np], a, r[0], r[1]);
        mma16816<T>(s[2 * np + 1], a, r[2], r[3]);
      }
    }
    // P^T = exp2(S^T * scale * log2e - lse * log2e), zero above the diagonal.
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int ql = nt * 8 + (lane % 4) * 2 + (e & 1);
        float pv = exp2f(s[nt][e] * p.scale_log2 - cLse[ql]);
        const int key = key_g + (e >= 2 ? 8 : 0);
        if constexpr (DOC) {
          if (key > qb * kBr + ql || key < cFirst[ql]) pv = 0.0f;
        } else if (qb == kb && key > qb * kBr + ql) {
          pv = 0.0f;
        }
        s[nt][e] = pv;
      }
    }

    // dV += P^T dO (k dim = queries: dO's rows, through the transposing ldmatrix).
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      uint32_t a[4];
      c_to_a<T>(a, s, kk);
#pragma unroll
      for (int dp = 0; dp < DP / 16; dp++) {
        uint32_t r[4];
        ldsm4t(r, cdO + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * PITCH + dp * 16 +
                      (lane / 16) * 8);
        mma16816<T>(dv[2 * dp], a, r[0], r[1]);
        mma16816<T>(dv[2 * dp + 1], a, r[2], r[3]);
      }
    }

    // dP^T = V dO^T: 16 keys x 64 queries.
    float ds[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++) ds[nt][0] = ds[nt][1] = ds[nt][2] = ds[nt][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
      uint32_t a[4];
      ldsm4(a, sV + (warp * 16 + lane % 16) * PITCH + ks * 16 + (lane / 16) * 8);
#pragma unroll
      for (int np = 0; np < 4; np++) {
        uint32_t r[4];
        ldsm4(r, cdO + (np * 16 + lane % 8 + (lane / 16) * 8) * PITCH + ks * 16 +
                     ((lane / 8) % 2) * 8);
        mma16816<T>(ds[2 * np], a, r[0], r[1]);
        mma16816<T>(ds[2 * np + 1], a, r[2], r[3]);
      }
    }
    // dS^T = P^T * (dP^T - Di) (unscaled; scale is applied to dK and dQ once).
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int ql = nt * 8 + (lane % 4) * 2 + (e & 1);
        ds[nt][e] = s[nt][e] * (ds[nt][e] - cDi[ql]);
      }
    }

    // dK += dS^T Q.
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      uint32_t a[4];
      c_to_a<T>(a, ds, kk);
#pragma unroll
      for (int dp = 0; dp < DP / 16; dp++) {
        uint32_t r[4];
        ldsm4t(r, cQ + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * PITCH + dp * 16 +
                      (lane / 16) * 8);
        mma16816<T>(dk[2 * dp], a, r[0], r[1]);
        mma16816<T>(dk[2 * dp + 1], a, r[2], r[3]);
      }
    }

    // dS^T to shared memory, so each warp can take 16 queries x all 64 keys.
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
      const int col = nt * 8 + (lane % 4) * 2;
      *reinterpret_cast<uint32_t *>(sdS + (warp * 16 + lane / 4) * SP + col) =
          pack2<T>(ds[nt][0], ds[nt][1]);
      *reinterpret_cast<uint32_t *>(sdS + (warp * 16 + lane / 4 + 8) * SP + col) =
          pack2<T>(ds[nt][2], ds[nt][3]);
    }
    __syncthreads();

    // dQ partial = dS K for queries warp*16.. : A = dS (queries x keys) read
    // transposed out of dS^T; B = K (keys x d), rows are the k dim: transposed.
    {
      float dq[ND][4];
#pragma unroll
      for (int nt = 0; nt < ND; nt++) dq[nt][0] = dq[nt][1] = dq[nt][2] = dq[nt][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < 4; kk++) {
        uint32_t a[4];
        ldsm4t(a, sdS + (kk * 16 + lane % 8 + (lane / 16) * 8) * SP + warp * 16 +
                      ((lane / 8) % 2) * 8);
#pragma unroll
        for (int dp = 0; dp < DP / 16; dp++) {
          uint32_t r[4];
          ldsm4t(r, sK + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * PITCH + dp * 16 +
                        (lane / 16) * 8);
          mma16816<T>(dq[2 * dp], a, r[0], r[1]);
          mma16816<T>(dq[2 * dp + 1], a, r[2], r[3]);
        }
      }
      const int q_g = qb * kBr + warp * 16 + lane / 4;
      float *acc = p.dq_acc + (bh_row + q_g) * p.D;
#pragma unroll
      for (int nt = 0; nt < ND; nt++) {
        const int col = nt * 8 + (lane % 4) * 2;
        if (q_g < p.T_) {
          if (col < p.D) atomicAdd(acc + col, dq[nt][0]);
          if (col + 1 < p.D) atomicAdd(acc + col + 1, dq[nt][1]);
        }
        if (q_g + 8 < p.T_) {
          if (col < p.D) atomicAdd(acc + 8 * p.D + col, dq[nt][2]);
          if (col + 1 < p.D) atomicAdd(acc + 8 * p.D + col + 1, dq[nt][3]);
        }
      }
    }
    __syncthreads();  // sQ, sdO, sdS are refilled next iteration
  }

  // dK (scaled) and dV through the now idle Q / dO tiles, coalesced stores.
  const float one[2] = {1.0f, 1.0f}, sc[2] = {p.scale, p.scale};
  frag_to_smem<T, DP, PITCH>(sQ, dk, warp * 16, sc);
  frag_to_smem<T, DP, PITCH>(sdO, dv, warp * 16, one);
  __syncthreads();
  store_tile<T, kBc, DP, PITCH, kThreads>(p.dk.at(b, h), sQ, p.dk.st, p.dk.sd, p.dk.vec, kb * kBc,
                                          p.T_, p.D);
  store_tile<T, kBc, DP, PITCH, kThreads>(p.dv.at(b, h), sdO, p.dv.st, p.dv.sd, p.dv.vec, kb * kBc,
                                          p.T_, p.D);
}

template <typename T, int DP, bool DOC>
void launch_bwd_mma_as(const BwdParams<T> &p, int B) {
  constexpr int smem = bwd_smem_bytes<DP, DOC>();
  static const bool attr = [] {
    TSR_CUDA_CHECK(cudaFuncSetAttribute(bwd_mma_kernel<T, DP, DOC>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)attr;
  const dim3 grid((p.T_ + kBc - 1) / kBc, B * p.H);
  bwd_mma_kernel<T, DP, DOC><<<grid, kThreads, smem, compute_stream()>>>(p);
  check_launch();
}

template <typename T, int DP>
void launch_bwd_mma(const BwdParams<T> &p, int B) {
  if (p.pos)
    launch_bwd_mma_as<T, DP, true>(p, B);
  else
    launch_bwd_mma_as<T, DP, false>(p, B);
}

// 3. dq = acc * scale in dq's dtype and strides; acc is [B, H, T, D].
template <typename T>
__global__ void dq_cast_kernel(const float *acc, Ten<T> dq, int T_, int H, int D, float scale,
                               int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int d = static_cast<int>(i % D);
    const int64_t r = i / D;
    const int t = static_cast<int>(r % T_);
    const int64_t bh = r / T_;
    const int b = static_cast<int>(bh / H), h = static_cast<int>(bh % H);
    dq.at(b, h)[t * dq.st + d * dq.sd] = from_f<T>(acc[i] * scale);
  }
}

// The same, 8 elements a thread: two 16-byte loads of acc (16-byte
// aligned, backward_native) and one 16-byte store where dq moves in packs.
template <typename T>
__global__ void dq_cast_vec_kernel(const float *acc, Ten<T> dq, int T_, int H, int packs_per_row,
                                   float scale, int64_t packs) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int d = static_cast<int>(i % packs_per_row) * 8;
    const int64_t r = i / packs_per_row;
    const int t = static_cast<int>(r % T_);
    const int64_t bh = r / T_;
    const int b = static_cast<int>(bh / H), h = static_cast<int>(bh % H);
    const float4 lo = reinterpret_cast<const float4 *>(acc)[2 * i];
    const float4 hi = reinterpret_cast<const float4 *>(acc)[2 * i + 1];
    const float x[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    uint4 pack;
    T *out = reinterpret_cast<T *>(&pack);
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = from_f<T>(x[k] * scale);
    *reinterpret_cast<uint4 *>(dq.at(b, h) + t * dq.st + d) = pack;
  }
}

BwdViews check_backward_args(const DLTensor *q, const DLTensor *k, const DLTensor *v,
                             const DLTensor *out, const DLTensor *dout, const DLTensor *lse,
                             float scale, DLTensor *dq, DLTensor *dk, DLTensor *dv,
                             int64_t kv_group) {
  const char *op = "attention_backward";
  BwdViews a;
  a.q = check_bthd(op, "q", q, a.d, a.dt, true);
  a.kv_group = kv_group;
  Dims dkv = kv_dims(op, a.d, kv_group);
  a.k = check_bthd(op, "k", k, dkv, a.dt, false);
  a.v = check_bthd(op, "v", v, dkv, a.dt, false);
  a.out = check_bthd(op, "out", out, a.d, a.dt, false);
  a.dout = check_bthd(op, "dout", dout, a.d, a.dt, false);
  a.dq = check_bthd(op, "dq", dq, a.d, a.dt, false);
  a.dk = check_bthd(op, "dk", dk, a.d, a.dt, false);
  a.dv = check_bthd(op, "dv", dv, a.d, a.dt, false);
  a.lse = check_lse(op, lse, a.d);
  check_dims(op, a.d);
  TSR_CHECK(std::isfinite(scale), TSR_ERR_INVALID, "attention_backward: scale is not finite");
  return a;
}

// The 16-bit backward: one tensor-core pass that writes dk and dv and
// accumulates dq in float32 (dq_acc), then dq cast to T and scaled.
template <typename T>
void backward_mma(const BwdViews &a, float scale, float *di, float *dq_acc, const int32_t *pos,
                  cudaStream_t st) {
  const Dims &d = a.d;
  const int T_ = static_cast<int>(d.T), H = static_cast<int>(d.H), D = static_cast<int>(d.D);
  const int64_t rows = d.B * d.H * d.T;
  TSR_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, static_cast<size_t>(rows * d.D) * sizeof(float), st));
  BwdParams<T> p{ten<T>(a.q, d.D),
                 ten<T>(a.k, d.D, a.kv_group),
                 ten<T>(a.v, d.D, a.kv_group),
                 ten<T>(a.dout, d.D),
                 ten<T>(a.dk, d.D),
                 ten<T>(a.dv, d.D),
                 a.lse,
                 di,
                 dq_acc,
                 T_,
                 H,
                 D,
                 scale,
                 scale * kLog2e,
                 pos};
  if (D <= 64) {
    launch_bwd_mma<T, 64>(p, static_cast<int>(d.B));
  } else {
    launch_bwd_mma<T, 128>(p, static_cast<int>(d.B));
  }
  const Ten<T> dq = ten<T>(a.dq, d.D);
  const int64_t n = rows * d.D, work = dq.vec ? n / 8 : n;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((work + 255) / 256, 65535));
  if (dq.vec)
    dq_cast_vec_kernel<T><<<blocks, 256, 0, st>>>(dq_acc, dq, T_, H, D / 8, scale, work);
  else
    dq_cast_kernel<T><<<blocks, 256, 0, st>>>(dq_acc, dq, T_, H, D, scale, n);
  check_launch();
}

}  // namespace
}  // namespace attn

tsr_status attention_backward_native(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                     const DLTensor *v, const DLTensor *out, const DLTensor *dout,
                                     const DLTensor *lse, float scale, DLTensor *dq, DLTensor *dk,
                                     DLTensor *dv, const int32_t *positions,
                                     int64_t kv_group) noexcept {
  using namespace attn;
  return guarded(ctx, [&] {
    const BwdViews a = check_backward_args(q, k, v, out, dout, lse, scale, dq, dk, dv, kv_group);
    const Dims &d = a.d;
    if (d.B * d.T * d.H == 0) return;
    const int T_ = static_cast<int>(d.T), H = static_cast<int>(d.H), D = static_cast<int>(d.D);
    const int64_t rows = d.B * d.H * d.T;
    const bool f32 = a.dt == Dt::F32;
    // dq's accumulator after Di, 16-byte aligned for dq_cast_vec_kernel.
    const size_t di_floats = (static_cast<size_t>(rows) + 3) / 4 * 4;
    float *di = scratch_floats(di_floats + (f32 ? 0 : static_cast<size_t>(rows * d.D)));
    float *dq_acc = di + di_floats;
    cudaStream_t st = compute_stream();

    auto run = [&](auto zero) {
      using T = decltype(zero);
      launch_di<T>(ten<T>(a.out, d.D), ten<T>(a.dout, d.D), di, T_, H, D, rows, st);
      if constexpr (std::is_same_v<T, float>)
        backward_f32(a, scale, di, positions, st);
      else
        backward_mma<T>(a, scale, di, dq_acc, positions, st);
    };
    if (a.dt == Dt::F32) {
      run(float{});
    } else if (a.dt == Dt::BF16) {
      run(__nv_bfloat16{});
    } else {
      run(__half{});
    }
  });
}

}  // namespace tessera::cuda
