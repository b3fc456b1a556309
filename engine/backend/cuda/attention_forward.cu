// Causal attention forward on CUDA, flash-attention style: one block owns 64
// query rows of one (batch, head), streams the key/value blocks at or before
// its diagonal through shared memory, and keeps scores, the online softmax
// and the output accumulator in registers. The T x T matrix never exists.
//
//   bf16/fp16: tensor cores (mma.sync m16n8k16, fp32 accumulation), 4 warps,
//              each warp 16 query rows; K/V double-buffered with cp.async.
//              Head dims other than 64/128 run zero-padded to 64 or 128.
//   fp32:      CUDA cores (the fp32 run is the accuracy reference, not the
//              fast path): one warp per query row, a lane per key.
//
// With positions (ABI 1.8 attention_packed_*) query i sees keys
// window_start(i)..i only: the tensor-core kernel's DOC instantiation
// starts at the key block of its rows' lowest window start and masks every
// block, taking a row whose keys are all masked so far as empty (its
// running max stays -inf and contributes nothing); the fp32 kernel skips
// the key tiles before each row's window.
#include "backend/cuda/attention.cuh"

namespace tessera::cuda {
namespace attn {
namespace {

// ---------------------------------------------------------------------------
// Tensor-core kernel (bf16 / fp16)

constexpr int kBr = 64;  // query rows per block (4 warps x 16)
constexpr int kBc = 64;  // keys per block; kBr == kBc keeps the diagonal to one block
constexpr int kThreads = 128;

template <typename T>
struct FwdParams {
  Ten<T> q, k, v, o;
  float *lse;  // [B, H, T]
  int T_, H, D;
  float scale_log2;    // scale * log2(e): softmax runs in base 2 (exp2f is one instruction)
  const int32_t *pos;  // [B, T] positions (document masking), NULL: causal
};

template <int DP>
constexpr int fwd_smem_bytes() {
  return (kBr + 4 * kBc) * (DP + 8) * 2;  // Q, then K[2] and V[2]
}

// long-function: kept whole on purpose: its phases (load Q, then per
// key block the scores, the online softmax and P.V) share the register
// fragments that hold the scores and the output accumulator; split into
// device functions they would pass those arrays by reference, and whether
// they stay in registers would rest on the inliner.
template <typename T, int DP, bool DOC>
__global__ void __launch_bounds__(kThreads) fwd_mma_kernel(const FwdParams<T> p) {
  // Rows padded by 8 elements (16 bytes) so ldmatrix's 8 row addresses fall in
  // different banks.
  constexpr int PITCH = DP + 8;
  constexpr int KS = DP / 16;  // k steps over the head dim
  constexpr int ND = DP / 8;   // 8-wide column tiles of the output
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *sQ = reinterpret_cast<T *>(smem_raw);
  T *sK = sQ + kBr * PITCH;      // [2][kBc][PITCH]
  T *sV = sK + 2 * kBc * PITCH;  // [2][kBc][PITCH]

  // Longest rows (most key blocks) first, so the tail of the grid is short.
  const int qb = gridDim.x - 1 - blockIdx.x;
  const int b = blockIdx.y / p.H, h = blockIdx.y % p.H;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T *gq = p.q.at(b, h), *gk = p.k.at(b, h), *gv = p.v.at(b, h);

  // The first key block any row of this block sees: 0, or with document
  // masking the block of the rows' lowest window start.
  int kb0 = 0;
  if constexpr (DOC) {
    __shared__ int lowest;
    if (threadIdx.x == 0) lowest = qb * kBr;
    __syncthreads();
    for (int i = threadIdx.x; i < kBr; i += kThreads)
      if (qb * kBr + i < p.T_) atomicMin(&lowest, window_start(p.pos, b, qb * kBr + i, p.T_));
    __syncthreads();
    kb0 = lowest / kBc;
  }

  load_tile<T, kBr, DP, PITCH, kThreads>(sQ, gq, p.q.st, p.q.sd, p.q.vec, qb * kBr, p.T_, p.D);
  load_tile<T, kBc, DP, PITCH, kThreads>(sK, gk, p.k.st, p.k.sd, p.k.vec, kb0 * kBc, p.T_, p.D);
  load_tile<T, kBc, DP, PITCH, kThreads>(sV, gv, p.v.st, p.v.sd, p.v.vec, kb0 * kBc, p.T_, p.D);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // This warp's 16 query rows as A fragments, kept for the whole loop.
  uint32_t qf[KS][4];
#pragma unroll
  for (int ks = 0; ks < KS; ks++)
    ldsm4(qf[ks], sQ + (warp * 16 + lane % 16) * PITCH + ks * 16 + (lane / 16) * 8);

  float o[ND][4];
#pragma unroll
  for (int nt = 0; nt < ND; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  // Running max (base-2 scaled scores) and this thread's partial row sums for
  // rows g and g + 8; the sums are reduced across the quad only at the end.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int row_g = qb * kBr + warp * 16 + lane / 4;  // global query row of c0/c1
  // With document masking, the window starts of rows row_g and row_g + 8.
  int first[2] = {0, 0};
  if constexpr (DOC) {
    for (int i = 0; i < 2; i++)
      if (row_g + 8 * i < p.T_) first[i] = window_start(p.pos, b, row_g + 8 * i, p.T_);
  } else {
    (void)first;
  }

  const int nkb = qb + 1;  // causal: key blocks 0..qb (kb0..qb with document masking)
  for (int j = kb0; j < nkb; j++) {
    const int buf = (j - kb0) & 1;
    // Prefetch block j + 1 into the other buffer (free: everyone passed the
    // barrier at the end of iteration j - 1), then wait for block j only.
    if (j + 1 < nkb) {
      T *nk = sK + (buf ^ 1) * kBc * PITCH, *nv = sV + (buf ^ 1) * kBc * PITCH;
      load_tile<T, kBc, DP, PITCH, kThreads>(nk, gk, p.k.st, p.k.sd, p.k.vec, (j + 1) * kBc, p.T_,
                                             p.D);
      load_tile<T, kBc, DP, PITCH, kThreads>(nv, gv, p.v.st, p.v.sd, p.v.vec, (j + 1) * kBc, p.T_,
                                             p.D);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T *cK = sK + buf * kBc * PITCH, *cV = sV + buf * kBc * PITCH;

    // S = Q K^T for 16 rows x 64 keys: 8 column tiles of 8 keys.
    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
#pragma unroll
      for (int np = 0; np < 4; np++) {
        // K rows are keys: non-transposed ldmatrix gives B = K^T directly.
        uint32_t r[4];
        ldsm4(r,
              cK + (np * 16 + lane % 8 + (lane / 16) * 8) * PITCH + ks * 16 + ((lane / 8) % 2) * 8);
        mma16816<T>(s[2 * np], qf[ks], r[0], r[1]);
        mma16816<T>(s[2 * np + 1], qf[ks], r[2], r[3]);
      }
    }

    // Scale into base 2, mask keys after the query (only the diagonal block
    // has any), and take the new row maxima. Key 0 is visible to every row, so
    // after block 0 the maxima are finite and no -inf - -inf can arise.
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float x = s[nt][e] * p.scale_log2;
        if constexpr (DOC) {
          const int key = j * kBc + nt * 8 + (lane % 4) * 2 + (e & 1);
          if (key > row_g + (e >= 2 ? 8 : 0) || key < first[e >= 2]) x = -INFINITY;
        } else if (j == qb) {
          const int key = j * kBc + nt * 8 + (lane % 4) * 2 + (e & 1);
          if (key > row_g + (e >= 2 ? 8 : 0)) x = -INFINITY;
        }
        s[nt][e] = x;
        mx[e >= 2] = fmaxf(mx[e >= 2], x);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    }
    // With document masking a row may have seen no key yet (max -inf):
    // exponents then go from 0, so its scores and correction are 0, not NaN.
    float ref[2] = {mx[0], mx[1]};
    if constexpr (DOC) {
      for (int i = 0; i < 2; i++) ref[i] = mx[i] == -INFINITY ? 0.0f : mx[i];
    }
    const float corr[2] = {exp2f(m[0] - ref[0]), exp2f(m[1] - ref[1])};
    m[0] = mx[0], m[1] = mx[1];
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        s[nt][e] = exp2f(s[nt][e] - ref[e >= 2]);
        sum[e >= 2] += s[nt][e];
      }
    }
    l[0] = l[0] * corr[0] + sum[0];
    l[1] = l[1] * corr[1] + sum[1];
#pragma unroll
    for (int nt = 0; nt < ND; nt++) {
      o[nt][0] *= corr[0], o[nt][1] *= corr[0], o[nt][2] *= corr[1], o[nt][3] *= corr[1];
    }

    // O += P V: P straight from the score registers; V rows are keys (the k
    // dim here), so the B fragments come through the transposing ldmatrix.
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      uint32_t a[4];
      c_to_a<T>(a, s, kk);
#pragma unroll
      for (int dp = 0; dp < DP / 16; dp++) {
        uint32_t r[4];
        ldsm4t(r, cV + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * PITCH + dp * 16 +
                      (lane / 16) * 8);
        mma16816<T>(o[2 * dp], a, r[0], r[1]);
        mma16816<T>(o[2 * dp + 1], a, r[2], r[3]);
      }
    }
    __syncthreads();  // buffer `buf` is refilled by the next iteration's prefetch
  }

  // Finish the rows: full sums across the quad, normalise, lse in natural log.
#pragma unroll
  for (int i = 0; i < 2; i++) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
  const float inv[2] = {1.0f / l[0], 1.0f / l[1]};
  if (lane % 4 == 0) {
    float *lse = p.lse + (static_cast<int64_t>(b) * p.H + h) * p.T_;
    if (row_g < p.T_) lse[row_g] = (m[0] + log2f(l[0])) * kLn2;
    if (row_g + 8 < p.T_) lse[row_g + 8] = (m[1] + log2f(l[1])) * kLn2;
  }
  // Stage O through this warp's own rows of sQ (read only at the start), then
  // store the block with coalesced 16-byte writes.
  frag_to_smem<T, DP, PITCH>(sQ, o, warp * 16, inv);
  __syncthreads();
  store_tile<T, kBr, DP, PITCH, kThreads>(p.o.at(b, h), sQ, p.o.st, p.o.sd, p.o.vec, qb * kBr, p.T_,
                                          p.D);
}

template <typename T, int DP, bool DOC>
void launch_fwd_mma_as(const FwdParams<T> &p, int B) {
  constexpr int smem = fwd_smem_bytes<DP>();
  static const bool attr = [] {
    TSR_CUDA_CHECK(cudaFuncSetAttribute(fwd_mma_kernel<T, DP, DOC>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)attr;
  const dim3 grid((p.T_ + kBr - 1) / kBr, B * p.H);
  fwd_mma_kernel<T, DP, DOC><<<grid, kThreads, smem, compute_stream()>>>(p);
  check_launch();
}

template <typename T, int DP>
void launch_fwd_mma(const FwdParams<T> &p, int B) {
  if (p.pos)
    launch_fwd_mma_as<T, DP, true>(p, B);
  else
    launch_fwd_mma_as<T, DP, false>(p, B);
}

// ---------------------------------------------------------------------------
// CUDA-core kernel (fp32): one warp per query row, lane j scores key j of a
// 32-key tile held in shared memory; each lane owns output dims lane + 32 i.

constexpr int kRowsPerBlock = 8;  // 4 warps x 2 rows
constexpr int kKeyTile = 32;

struct FwdF32Params {
  Ten<float> q, k, v, o;
  float *lse;
  int T_, H, D;
  float scale;
  const int32_t *pos;  // [B, T] positions (document masking), NULL: causal
};

__global__ void __launch_bounds__(128) fwd_f32_kernel(const FwdF32Params p) {
  __shared__ float sQ[kRowsPerBlock][128];
  __shared__ float sK[kKeyTile][129];  // +1: lane j reads row j, conflict-free
  __shared__ float sV[kKeyTile][128];
  const int r0 = (gridDim.x - 1 - blockIdx.x) * kRowsPerBlock;
  const int b = blockIdx.y / p.H, h = blockIdx.y % p.H;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float *gq = p.q.at(b, h), *gk = p.k.at(b, h), *gv = p.v.at(b, h);
  for (int e = threadIdx.x; e < kRowsPerBlock * 128; e += 128) {
    const int r = e / 128, d = e % 128;
    sQ[r][d] = (r0 + r < p.T_ && d < p.D) ? gq[(r0 + r) * p.q.st + d * p.q.sd] : 0.0f;
  }
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0}, o[2][4] = {};
  const int last = min(r0 + kRowsPerBlock, p.T_) - 1;  // last key any row here sees
  for (int k0 = 0; k0 <= last; k0 += kKeyTile) {
    __syncthreads();
    for (int e = threadIdx.x; e < kKeyTile * 128; e += 128) {
      const int r = e / 128, d = e % 128;
      const bool in = k0 + r < p.T_ && d < p.D;
      sK[r][d] = in ? gk[(k0 + r) * p.k.st + d * p.k.sd] : 0.0f;
      sV[r][d] = in ? gv[(k0 + r) * p.v.st + d * p.v.sd] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const int rl = warp * 2 + i, row = r0 + rl;
      if (row >= p.T_ || k0 > row) continue;  // warp-uniform
      // The row's window start; tiles wholly before it are skipped, so the
      // first tile taken holds a key the row sees.
      const int first = window_start(p.pos, b, row, p.T_);
      if (k0 + kKeyTile <= first) continue;  // warp-uniform
      const int key = k0 + lane;
      float s = 0.0f;
      for (int d = 0; d < p.D; d++) s += sQ[rl][d] * sK[lane][d];
      s = key <= row && key >= first ? s * p.scale : -INFINITY;
      float mx = s;
      for (int off = 16; off; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float mnew = fmaxf(m[i], mx);  // finite: this tile holds a key the row sees
      const float pj = expf(s - mnew), corr = expf(m[i] - mnew);
      float sum = pj;
      for (int off = 16; off; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      l[i] = l[i] * corr + sum;
      m[i] = mnew;
#pragma unroll
      for (int c = 0; c < 4; c++) o[i][c] *= corr;
      for (int j = 0; j < kKeyTile; j++) {
        const float pb = __shfl_sync(0xffffffffu, pj, j);
#pragma unroll
        for (int c = 0; c < 4; c++) o[i][c] += pb * sV[j][lane + 32 * c];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int row = r0 + warp * 2 + i;
    if (row >= p.T_) continue;
    float *go = p.o.at(b, h) + row * p.o.st;
#pragma unroll
    for (int c = 0; c < 4; c++)
      if (lane + 32 * c < p.D) go[(lane + 32 * c) * p.o.sd] = o[i][c] / l[i];
    if (lane == 0) p.lse[(static_cast<int64_t>(b) * p.H + h) * p.T_ + row] = m[i] + logf(l[i]);
  }
}

}  // namespace
}  // namespace attn

tsr_status attention_forward_native(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                    const DLTensor *v, float scale, DLTensor *out, DLTensor *lse,
                                    const int32_t *positions, int64_t kv_group) noexcept {
  using namespace attn;
  return guarded(ctx, [&] {
    const char *op = "attention_forward";
    Dims d;
    Dt dt = Dt::F32;
    const Bthd vq = check_bthd(op, "q", q, d, dt, true);
    Dims dkv = kv_dims(op, d, kv_group);
    const Bthd vk = check_bthd(op, "k", k, dkv, dt, false);
    const Bthd vv = check_bthd(op, "v", v, dkv, dt, false);
    const Bthd vo = check_bthd(op, "out", out, d, dt, false);
    float *plse = check_lse(op, lse, d);
    check_dims(op, d);
    TSR_CHECK(std::isfinite(scale), TSR_ERR_INVALID, "attention_forward: scale is not finite");
    if (d.B * d.T * d.H == 0) return;
    const int T_ = static_cast<int>(d.T), H = static_cast<int>(d.H), D = static_cast<int>(d.D);
    const int B = static_cast<int>(d.B);
    if (dt == Dt::F32) {
      FwdF32Params p{ten<float>(vq, d.D),
                     ten<float>(vk, d.D, kv_group),
                     ten<float>(vv, d.D, kv_group),
                     ten<float>(vo, d.D),
                     plse,
                     T_,
                     H,
                     D,
                     scale,
                     positions};
      const dim3 grid((T_ + kRowsPerBlock - 1) / kRowsPerBlock, B * H);
      fwd_f32_kernel<<<grid, 128, 0, compute_stream()>>>(p);
      check_launch();
      return;
    }
    auto run = [&](auto zero) {
      using T = decltype(zero);
      FwdParams<T> p{ten<T>(vq, d.D),
                     ten<T>(vk, d.D, kv_group),
                     ten<T>(vv, d.D, kv_group),
                     ten<T>(vo, d.D),
                     plse,
                     T_,
                     H,
                     D,
                     scale * kLog2e,
                     positions};
      if (D <= 64) {
        launch_fwd_mma<T, 64>(p, B);
      } else {
        launch_fwd_mma<T, 128>(p, B);
      }
    };
    if (dt == Dt::BF16) {
      run(__nv_bfloat16{});
    } else {
      run(__half{});
    }
  });
}

}  // namespace tessera::cuda
