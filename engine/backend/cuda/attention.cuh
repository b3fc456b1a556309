// Causal attention on CUDA, shared by attention_forward.cu and
// attention_backward.cu: argument checks (host), and the device pieces of the
// flash-attention kernels: tile loads into shared memory, ldmatrix and
// mma.sync m16n8k16 wrappers (bf16/fp16 in, fp32 accumulate).
//
// Layout recap for mma.sync.m16n8k16 (g = lane / 4, t = lane % 4), which the
// kernels lean on to keep scores in registers:
//   A 16x16 (row-major):  a0 = (g, 2t..2t+1)  a1 = (g+8, 2t..)  a2 = (g, 2t+8..)  a3 = (g+8,
//   2t+8..) B 16x8  (k x n):      b0 = (k=2t..2t+1, n=g)                b1 = (k=2t+8.., n=g) C 16x8
//   (fp32):       c0,c1 = (g, 2t..2t+1)                 c2,c3 = (g+8, 2t..2t+1)
// so the C fragments of two adjacent 8-column tiles are exactly the A fragment
// of one 16-wide k step: S = Q K^T becomes P in registers and feeds P V with
// no trip through shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlpack/dlpack.h>
#include <tessera/ops.h>

#include <cstdint>
#include <string>

#include "backend/cuda/cuda_ops_internal.hpp"
#include "backend/cuda/device.hpp"
#include "util/error.hpp"

namespace tessera::cuda::attn {

// ---------------------------------------------------------------------------
// Host side: checked [B, T, H, D] views

enum class Dt { F32, BF16, F16 };

// One [B, T, H, D] tensor: element pointer (byte_offset applied) and element
// strides.
struct Bthd {
  void *p;
  int64_t sb, st, sh, sd;
};

struct Dims {
  int64_t B = -1, T = -1, H = -1, D = -1;
};

inline std::string dims_str(const DLTensor *t) {
  std::string s = "[";
  for (int i = 0; t->shape && i < t->ndim; i++) {
    if (i) s += ",";
    s += std::to_string(t->shape[i]);  // appended piecewise: GCC 12 -Wrestrict false positive
  }
  s += "]";
  return s;
}

inline const char *dt_name(Dt d) {
  return d == Dt::F32 ? "float32" : d == Dt::BF16 ? "bfloat16" : "float16";
}

inline std::string desc(const DLTensor *t) {
  std::string s = std::to_string(t->dtype.code) + ":" + std::to_string(t->dtype.bits);
  if (t->dtype.code == kDLFloat && t->dtype.bits == 32) s = "float32";
  if (t->dtype.code == kDLFloat && t->dtype.bits == 16) s = "float16";
  if (t->dtype.code == kDLBfloat && t->dtype.bits == 16) s = "bfloat16";
  return s + dims_str(t);
}

inline void check_cuda_tensor(const char *op, const char *arg, const DLTensor *t) {
  const std::string w = std::string(op) + ": " + arg + " ";
  TSR_CHECK(t != nullptr, TSR_ERR_INVALID, w + "is NULL");
  TSR_CHECK(t->device.device_type == kDLCUDA, TSR_ERR_UNSUPPORTED,
            w + desc(t) + " is on device type " + std::to_string(t->device.device_type) +
                "; the CUDA attention takes kDLCUDA tensors");
  TSR_CHECK(t->dtype.lanes == 1, TSR_ERR_UNSUPPORTED, w + "has vector lanes");
}

// Checks a [B, T, H, D] float tensor; the first call (dims.B < 0) sets dims
// and dt, later calls must match them. Strides are honoured (NULL = compact);
// negative strides are refused.
inline Bthd check_bthd(const char *op, const char *arg, const DLTensor *t, Dims &dims, Dt &dt,
                       bool first) {
  check_cuda_tensor(op, arg, t);
  const std::string w = std::string(op) + ": " + arg + " ";
  TSR_CHECK(t->ndim == 4 && t->shape != nullptr, TSR_ERR_INVALID,
            w + "must be 4-D [B, T, H, D], got " + desc(t));
  Dt d;
  if (t->dtype.code == kDLFloat && t->dtype.bits == 32) {
    d = Dt::F32;
  } else if (t->dtype.code == kDLBfloat && t->dtype.bits == 16) {
    d = Dt::BF16;
  } else if (t->dtype.code == kDLFloat && t->dtype.bits == 16) {
    d = Dt::F16;
  } else {
    throw Error(TSR_ERR_UNSUPPORTED, w + "must be float32, bfloat16 or float16, got " + desc(t));
  }
  for (int i = 0; i < 4; i++)
    TSR_CHECK(t->shape[i] >= 0, TSR_ERR_INVALID, w + "has a negative dim: " + desc(t));
  if (first) {
    dims = Dims{t->shape[0], t->shape[1], t->shape[2], t->shape[3]};
    dt = d;
  } else {
    TSR_CHECK(t->shape[0] == dims.B && t->shape[1] == dims.T && t->shape[2] == dims.H &&
                  t->shape[3] == dims.D,
              TSR_ERR_INVALID,
              w + desc(t) + " does not match q's shape [" + std::to_string(dims.B) + "," +
                  std::to_string(dims.T) + "," + std::to_string(dims.H) + "," +
                  std::to_string(dims.D) + "]");
    TSR_CHECK(d == dt, TSR_ERR_INVALID, w + desc(t) + " must have q's dtype " + dt_name(dt));
  }
  Bthd v{};
  const int64_t esz = d == Dt::F32 ? 4 : 2;
  if (t->strides) {
    for (int i = 0; i < 4; i++)
      TSR_CHECK(t->strides[i] >= 0, TSR_ERR_UNSUPPORTED,
                w + desc(t) + " has a negative stride; not supported");
    v.sb = t->strides[0], v.st = t->strides[1], v.sh = t->strides[2], v.sd = t->strides[3];
  } else {
    v.sd = 1, v.sh = t->shape[3], v.st = t->shape[2] * t->shape[3],
    v.sb = t->shape[1] * t->shape[2] * t->shape[3];
  }
  const bool empty = t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3] == 0;
  TSR_CHECK(empty || t->data != nullptr, TSR_ERR_INVALID, w + desc(t) + " has NULL data");
  v.p = static_cast<char *>(t->data) + t->byte_offset;
  TSR_CHECK(reinterpret_cast<uintptr_t>(v.p) % esz == 0, TSR_ERR_INVALID,
            w + desc(t) + " is misaligned (byte_offset " + std::to_string(t->byte_offset) + ")");
  return v;
}

// lse [B, H, T] float32, compact.
inline float *check_lse(const char *op, const DLTensor *t, const Dims &d) {
  check_cuda_tensor(op, "lse", t);
  const std::string w = std::string(op) + ": lse ";
  TSR_CHECK(t->dtype.code == kDLFloat && t->dtype.bits == 32, TSR_ERR_UNSUPPORTED,
            w + "must be float32, got " + desc(t));
  TSR_CHECK(
      t->ndim == 3 && t->shape && t->shape[0] == d.B && t->shape[1] == d.H && t->shape[2] == d.T,
      TSR_ERR_INVALID,
      w + "must be [B, H, T] = [" + std::to_string(d.B) + "," + std::to_string(d.H) + "," +
          std::to_string(d.T) + "], got " + desc(t));
  if (t->strides) {
    TSR_CHECK((d.T <= 1 || t->strides[2] == 1) && (d.H <= 1 || t->strides[1] == d.T) &&
                  (d.B <= 1 || t->strides[0] == d.H * d.T),
              TSR_ERR_UNSUPPORTED, w + desc(t) + " must be compact");
  }
  TSR_CHECK(d.B * d.H * d.T == 0 || t->data != nullptr, TSR_ERR_INVALID, w + "has NULL data");
  float *p = reinterpret_cast<float *>(static_cast<char *>(t->data) + t->byte_offset);
  TSR_CHECK(reinterpret_cast<uintptr_t>(p) % 4 == 0, TSR_ERR_INVALID, w + "is misaligned");
  return p;
}

inline void check_dims(const char *op, const Dims &d) {
  TSR_CHECK(d.D >= 1 && d.D <= 128, TSR_ERR_UNSUPPORTED,
            std::string(op) + ": head dim D = " + std::to_string(d.D) +
                " is not supported (1 <= D <= 128)");
  TSR_CHECK(d.T < (int64_t(1) << 30) && d.B * d.H < (int64_t(1) << 31), TSR_ERR_UNSUPPORTED,
            std::string(op) + ": T or B*H too large");
}

// attention_backward's tensors, checked: one [B, T, H, D] view each, the
// shared dims and dtype, and lse.
struct BwdViews {
  Dims d;
  Dt dt = Dt::F32;
  Bthd q, k, v, out, dout, dq, dk, dv;  // k, v: d.H / kv_group heads; dk, dv: d.H
  const float *lse = nullptr;
  int64_t kv_group = 1;
};

// attention_backward_f32.cu: the float32 backward (dq, dk, dv) on `st`,
// reading Di (the rows' dout . out) from `di`; `pos` (device positions
// [B, T]) or NULL.
void backward_f32(const BwdViews &a, float scale, float *di, const int32_t *pos, cudaStream_t st);

// May a [B,T,H,D] view be moved in 16-byte packs of 8 elements (2-byte types)?
// Needs unit stride along D, D a multiple of 8, and every other stride and the
// base 16-byte aligned.
inline bool vec16(const Bthd &v, int64_t D) {
  return v.sd == 1 && D % 8 == 0 && v.st % 8 == 0 && v.sh % 8 == 0 && v.sb % 8 == 0 &&
         reinterpret_cast<uintptr_t>(v.p) % 16 == 0;
}

#ifdef __CUDACC__
// ---------------------------------------------------------------------------
// Device side

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ABI 1.8 document masking: the first key query `row` of sequence b sees,
// row - positions[b, row] with the position clamped into [0, row] (ops.h:
// CUDA clamps rather than checks); 0 without positions (causal).
__device__ __forceinline__ int window_start(const int32_t *pos, int b, int row, int T_) {
  if (!pos) return 0;
  const int p = pos[static_cast<int64_t>(b) * T_ + row];
  return row - min(max(p, 0), row);
}

// Kernel view of one [B, T, H, D] tensor.
template <typename T>
struct Ten {
  T *p;
  int64_t sb, st, sh, sd;
  bool vec;       // 16-byte packs allowed (see vec16)
  int group = 1;  // query heads per head of this tensor: K and V of grouped attention
  __device__ T *at(int b, int h) const { return p + b * sb + (h / group) * sh; }
};

template <typename T>
inline Ten<T> ten(const Bthd &v, int64_t D, int64_t group = 1) {
  return Ten<T>{static_cast<T *>(v.p),  v.sb, v.st, v.sh, v.sd, vec16(v, D),
                static_cast<int>(group)};
}

// q's dims with the head count of K and V where kv_group query heads share
// one (the native kernels' grouped form); a kv_group that does not divide
// q's heads is the caller's error.
inline Dims kv_dims(const char *op, const Dims &q, int64_t kv_group) {
  TSR_CHECK(kv_group >= 1 && q.H % kv_group == 0, TSR_ERR_INTERNAL,
            std::string(op) + ": " + std::to_string(kv_group) +
                " query heads per key/value head do not divide q's " + std::to_string(q.H));
  Dims d = q;
  d.H = q.H / kv_group;
  return d;
}

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lane i gives the address of row i % 8 of matrix i / 8.
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// The same, each matrix transposed on the way.
__device__ __forceinline__ void ldsm4t(uint32_t (&r)[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c += a * b for one 16x8x16 step, fp32 accumulators.
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, __half>);
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats as one packed pair (lo in the low half: the lower column).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
  }
}

// The A fragment for k step kk of a 16-row strip held as C fragments of 8
// column tiles (the layout recap at the top).
template <typename T>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c)[8][4], int kk) {
  a[0] = pack2<T>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack2<T>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// Copies rows [r0, r0 + ROWS) of one (b, h) slice (g = its row 0, row stride
// st, column stride sd) into shared memory s[ROWS][PITCH], zero-filling rows
// >= T and columns >= D up to DP, so padded rows and columns add nothing to
// the products. 16-byte cp.async where the view allows (call
// cp_async_commit() after), element loads otherwise.
template <typename T, int ROWS, int DP, int PITCH, int NTHREADS>
__device__ __forceinline__ void load_tile(T *s, const T *g, int64_t st, int64_t sd, bool vec,
                                          int r0, int T_, int D) {
  if (vec) {
    constexpr int CH = DP / 8;
    for (int c = threadIdx.x; c < ROWS * CH; c += NTHREADS) {
      const int r = c / CH, col = (c % CH) * 8;
      T *dst = s + r * PITCH + col;
      if (r0 + r < T_ && col < D) {
        cp_async16(dst, g + (r0 + r) * st + col);
      } else {
        *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
      }
    }
  } else {
    for (int e = threadIdx.x; e < ROWS * DP; e += NTHREADS) {
      const int r = e / DP, col = e % DP;
      T val = from_f<T>(0.0f);
      if (r0 + r < T_ && col < D) val = g[(r0 + r) * st + col * sd];
      s[r * PITCH + col] = val;
    }
  }
}

// The reverse: s[ROWS][PITCH] to rows [r0, r0 + ROWS) of a slice, rows < T
// and columns < D only.
template <typename T, int ROWS, int DP, int PITCH, int NTHREADS>
__device__ __forceinline__ void store_tile(T *g, const T *s, int64_t st, int64_t sd, bool vec,
                                           int r0, int T_, int D) {
  if (vec) {
    constexpr int CH = DP / 8;
    for (int c = threadIdx.x; c < ROWS * CH; c += NTHREADS) {
      const int r = c / CH, col = (c % CH) * 8;
      if (r0 + r < T_ && col < D)
        *reinterpret_cast<uint4 *>(g + (r0 + r) * st + col) =
            *reinterpret_cast<const uint4 *>(s + r * PITCH + col);
    }
  } else {
    for (int e = threadIdx.x; e < ROWS * DP; e += NTHREADS) {
      const int r = e / DP, col = e % DP;
      if (r0 + r < T_ && col < D) g[(r0 + r) * st + col * sd] = s[r * PITCH + col];
    }
  }
}

// Writes a warp's 16 x DP strip of C fragments (rows row0.., scaled by
// `mul[0]` for rows g and `mul[1]` for rows g + 8) into shared memory as T.
template <typename T, int DP, int PITCH>
__device__ __forceinline__ void frag_to_smem(T *s, const float (&c)[DP / 8][4], int row0,
                                             const float (&mul)[2]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int nt = 0; nt < DP / 8; nt++) {
    const int col = nt * 8 + (lane % 4) * 2;
    *reinterpret_cast<uint32_t *>(s + (row0 + lane / 4) * PITCH + col) =
        pack2<T>(c[nt][0] * mul[0], c[nt][1] * mul[0]);
    *reinterpret_cast<uint32_t *>(s + (row0 + lane / 4 + 8) * PITCH + col) =
        pack2<T>(c[nt][2] * mul[1], c[nt][3] * mul[1]);
  }
}
#endif  // __CUDACC__

}  // namespace tessera::cuda::attn
