// Causal attention backward on CUDA in float32, on CUDA cores without
// atomics (attention_backward.cu has the 16-bit tensor-core pass and the
// entry): one kernel for dq (a warp per query row), one for dk/dv (a warp
// per key row), both deterministic; the accuracy reference, not the fast
// path. With positions (ABI 1.8 attention_packed_*) P is 0 outside each
// query's window, pair by pair, and key tiles wholly before a query's
// window are skipped.
#include "backend/cuda/attention.cuh"

namespace tessera::cuda::attn {

namespace {

// ---------------------------------------------------------------------------
// fp32 (CUDA cores). Both kernels: 4 warps x 2 rows a block, a lane per
// key (dq) or per query (dk/dv) of a 32-wide tile, output dims lane + 32 c.

constexpr int kRows = 8;
constexpr int kTile = 32;

struct BwdF32Params {
  Ten<float> q, k, v, dout, dq, dk, dv;
  const float *lse, *di;
  int T_, H, D;
  float scale;
  const int32_t *pos;  // [B, T] positions (document masking), NULL: causal
};

// dq_i = scale * sum_{j <= i} P_ij (dP_ij - Di) k_j, dP_ij = dO_i . v_j
__global__ void __launch_bounds__(128) dq_f32_kernel(const BwdF32Params p) {
  __shared__ float sQ[kRows][128], sdO[kRows][128];
  __shared__ float sK[kTile][129], sV[kTile][129];
  const int r0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  const int b = blockIdx.y / p.H, h = blockIdx.y % p.H;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh_row = (static_cast<int64_t>(b) * p.H + h) * p.T_;
  const float *gq = p.q.at(b, h), *gdo = p.dout.at(b, h), *gk = p.k.at(b, h), *gv = p.v.at(b, h);
  for (int e = threadIdx.x; e < kRows * 128; e += 128) {
    const int r = e / 128, d = e % 128;
    const bool in = r0 + r < p.T_ && d < p.D;
    sQ[r][d] = in ? gq[(r0 + r) * p.q.st + d * p.q.sd] : 0.0f;
    sdO[r][d] = in ? gdo[(r0 + r) * p.dout.st + d * p.dout.sd] : 0.0f;
  }
  float acc[2][4] = {};
  const int last = min(r0 + kRows, p.T_) - 1;
  for (int k0 = 0; k0 <= last; k0 += kTile) {
    __syncthreads();
    for (int e = threadIdx.x; e < kTile * 128; e += 128) {
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
      const int first = window_start(p.pos, b, row, p.T_);
      if (k0 + kTile <= first) continue;  // warp-uniform: the tile is before the window
      float s = 0.0f, dp = 0.0f;
      for (int d = 0; d < p.D; d++) {
        s += sQ[rl][d] * sK[lane][d];
        dp += sdO[rl][d] * sV[lane][d];
      }
      const bool seen = k0 + lane <= row && k0 + lane >= first;
      const float pij = seen ? expf(s * p.scale - p.lse[bh_row + row]) : 0.0f;
      const float dsij = pij * (dp - p.di[bh_row + row]);
      for (int j = 0; j < kTile; j++) {
        const float db = __shfl_sync(0xffffffffu, dsij, j);
#pragma unroll
        for (int c = 0; c < 4; c++) acc[i][c] += db * sK[j][lane + 32 * c];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int row = r0 + warp * 2 + i;
    if (row >= p.T_) continue;
    float *g = p.dq.at(b, h) + row * p.dq.st;
#pragma unroll
    for (int c = 0; c < 4; c++)
      if (lane + 32 * c < p.D) g[(lane + 32 * c) * p.dq.sd] = acc[i][c] * p.scale;
  }
}

// dv_j = sum_{i >= j} P_ij dO_i;  dk_j = scale * sum_{i >= j} dS_ij q_i
__global__ void __launch_bounds__(128) dkdv_f32_kernel(const BwdF32Params p) {
  __shared__ float sK[kRows][128], sV[kRows][128];
  __shared__ float sQ[kTile][129], sdO[kTile][129];
  __shared__ float sLse[kTile], sDi[kTile];
  __shared__ int sFirst[kTile];       // the queries' window starts
  const int r0 = blockIdx.x * kRows;  // first key of this block; block 0 has most work
  const int b = blockIdx.y / p.H, h = blockIdx.y % p.H;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh_row = (static_cast<int64_t>(b) * p.H + h) * p.T_;
  const float *gq = p.q.at(b, h), *gdo = p.dout.at(b, h), *gk = p.k.at(b, h), *gv = p.v.at(b, h);
  for (int e = threadIdx.x; e < kRows * 128; e += 128) {
    const int r = e / 128, d = e % 128;
    const bool in = r0 + r < p.T_ && d < p.D;
    sK[r][d] = in ? gk[(r0 + r) * p.k.st + d * p.k.sd] : 0.0f;
    sV[r][d] = in ? gv[(r0 + r) * p.v.st + d * p.v.sd] : 0.0f;
  }
  float dk[2][4] = {}, dv[2][4] = {};
  for (int q0 = (r0 / kTile) * kTile; q0 < p.T_; q0 += kTile) {
    __syncthreads();
    for (int e = threadIdx.x; e < kTile * 128; e += 128) {
      const int r = e / 128, d = e % 128;
      const bool in = q0 + r < p.T_ && d < p.D;
      sQ[r][d] = in ? gq[(q0 + r) * p.q.st + d * p.q.sd] : 0.0f;
      sdO[r][d] = in ? gdo[(q0 + r) * p.dout.st + d * p.dout.sd] : 0.0f;
    }
    if (threadIdx.x < kTile) {
      const int qi = q0 + threadIdx.x;
      sLse[threadIdx.x] = qi < p.T_ ? p.lse[bh_row + qi] : INFINITY;
      sDi[threadIdx.x] = qi < p.T_ ? p.di[bh_row + qi] : 0.0f;
      sFirst[threadIdx.x] = qi < p.T_ ? window_start(p.pos, b, qi, p.T_) : 0;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const int rl = warp * 2 + i, key = r0 + rl;
      if (key >= p.T_ || q0 + kTile - 1 < key) continue;  // warp-uniform
      const int qi = q0 + lane;
      float s = 0.0f, dp = 0.0f;
      for (int d = 0; d < p.D; d++) {
        s += sK[rl][d] * sQ[lane][d];
        dp += sV[rl][d] * sdO[lane][d];
      }
      const bool seen = qi >= key && qi < p.T_ && key >= sFirst[lane];
      const float pij = seen ? expf(s * p.scale - sLse[lane]) : 0.0f;
      const float dsij = pij * (dp - sDi[lane]);
      for (int j = 0; j < kTile; j++) {
        const float pb = __shfl_sync(0xffffffffu, pij, j);
        const float db = __shfl_sync(0xffffffffu, dsij, j);
#pragma unroll
        for (int c = 0; c < 4; c++) {
          dv[i][c] += pb * sdO[j][lane + 32 * c];
          dk[i][c] += db * sQ[j][lane + 32 * c];
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int key = r0 + warp * 2 + i;
    if (key >= p.T_) continue;
    float *gdk = p.dk.at(b, h) + key * p.dk.st, *gdv = p.dv.at(b, h) + key * p.dv.st;
#pragma unroll
    for (int c = 0; c < 4; c++) {
      if (lane + 32 * c < p.D) {
        gdk[(lane + 32 * c) * p.dk.sd] = dk[i][c] * p.scale;
        gdv[(lane + 32 * c) * p.dv.sd] = dv[i][c];
      }
    }
  }
}

}  // namespace

// The float32 backward: dq and dk/dv by two kernels of their own, reading
// Di (the rows' dout . out) from `di`.
void backward_f32(const BwdViews &a, float scale, float *di, const int32_t *pos, cudaStream_t st) {
  const Dims &d = a.d;
  const int T_ = static_cast<int>(d.T), H = static_cast<int>(d.H), D = static_cast<int>(d.D);
  BwdF32Params p{ten<float>(a.q, d.D),
                 ten<float>(a.k, d.D, a.kv_group),
                 ten<float>(a.v, d.D, a.kv_group),
                 ten<float>(a.dout, d.D),
                 ten<float>(a.dq, d.D),
                 ten<float>(a.dk, d.D),
                 ten<float>(a.dv, d.D),
                 a.lse,
                 di,
                 T_,
                 H,
                 D,
                 scale,
                 pos};
  const int B = static_cast<int>(d.B);
  const dim3 grid((T_ + kRows - 1) / kRows, B * H);
  dq_f32_kernel<<<grid, 128, 0, st>>>(p);
  check_launch();
  dkdv_f32_kernel<<<grid, 128, 0, st>>>(p);
  check_launch();
}

}  // namespace tessera::cuda::attn
