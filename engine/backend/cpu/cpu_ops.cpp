// CPU ops, part 1: tensor checks, matmul (OpenBLAS) and the element-wise
// helpers, plus the table itself; the other entries live in cpu_ops_*.cpp
// and cpu_attention.cpp. Every entry is noexcept at the boundary: checks
// throw tessera::Error and guarded() turns that into a status and a message
// for the host. Nothing here allocates on the success path except whatever
// OpenBLAS does internally.
#include "backend/cpu/cpu_ops.hpp"

#include <cblas.h>

#include <climits>
#include <cstring>

#include "backend/cpu/cpu_ops_internal.hpp"
#include "backend/cpu/cpu_pool.hpp"
#include "util/error.hpp"

// Declared by OpenBLAS's cblas.h but not by the reference one; repeating a
// matching declaration is harmless either way.
extern "C" void openblas_set_num_threads(int num_threads);
extern "C" int openblas_get_num_procs(void);

namespace tessera::cpu {

// ---------------------------------------------------------------------------
// Tensor checks

static std::string dims_str(int ndim, const int64_t *dims) {
  std::string s = "[";
  for (int i = 0; i < ndim; i++) {
    if (i) s += ",";
    s += dims ? std::to_string(dims[i]) : "?";
  }
  return s + "]";
}

static std::string where(const char *op, const char *arg) {
  return std::string(op) + ": " + arg + " ";
}

// Everything but the dtype: device, shape sanity, compactness, data pointer.
// Returns the element pointer (data + byte_offset) and fills rows/cols.
template <typename T>
static Mat<T> view(const char *op, const char *arg, const DLTensor *t, int min_ndim) {
  TSR_CHECK(t != nullptr, TSR_ERR_INVALID, where(op, arg) + "is NULL");
  // Pinned host memory (kDLCUDAHost) is ordinary host memory to a CPU loop.
  TSR_CHECK(
      t->device.device_type == kDLCPU || t->device.device_type == kDLCUDAHost, TSR_ERR_UNSUPPORTED,
      where(op, arg) + describe(t) + " is on device type " + std::to_string(t->device.device_type) +
          "; the CPU ops take kDLCPU or kDLCUDAHost tensors");
  TSR_CHECK(t->ndim >= min_ndim && (t->ndim == 0 || t->shape != nullptr), TSR_ERR_INVALID,
            where(op, arg) + "must have at least " + std::to_string(min_ndim) + " dims, got " +
                describe(t));
  // rows = product of the leading dims, checked for negatives and overflow
  // so the loops below can trust rows * cols.
  int64_t rows = 1, cols = t->ndim ? t->shape[t->ndim - 1] : 1, numel = 1;
  for (int i = 0; i < t->ndim; i++) {
    TSR_CHECK(t->shape[i] >= 0, TSR_ERR_INVALID,
              where(op, arg) + "has a negative dim: " + describe(t));
    bool overflow = __builtin_mul_overflow(numel, t->shape[i], &numel);
    if (i + 1 < t->ndim) overflow |= __builtin_mul_overflow(rows, t->shape[i], &rows);
    TSR_CHECK(!overflow, TSR_ERR_INVALID, where(op, arg) + "is too large: " + describe(t));
  }
  // Compact row-major: strides may be given as long as they match; a dim of
  // size 1 may carry any stride (DLPack producers disagree on what to put).
  if (t->strides && numel > 0) {
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
      TSR_CHECK(t->shape[i] == 1 || t->strides[i] == expect, TSR_ERR_UNSUPPORTED,
                where(op, arg) + describe(t) + " is not contiguous (strides " +
                    dims_str(t->ndim, t->strides) + "); the CPU ops need compact row-major");
      expect *= t->shape[i];
    }
  }
  TSR_CHECK(numel == 0 || t->data != nullptr, TSR_ERR_INVALID,
            where(op, arg) + describe(t) + " has NULL data");
  T *p = reinterpret_cast<T *>(static_cast<char *>(t->data) + t->byte_offset);
  TSR_CHECK(reinterpret_cast<uintptr_t>(p) % alignof(T) == 0, TSR_ERR_INVALID,
            where(op, arg) + describe(t) + " is misaligned (byte_offset " +
                std::to_string(t->byte_offset) + ")");
  return Mat<T>{p, rows, cols};
}

Mat<float> f32(const char *op, const char *arg, const DLTensor *t, int min_ndim) {
  Mat<float> m = view<float>(op, arg, t, min_ndim);
  TSR_CHECK(t->dtype.code == kDLFloat && t->dtype.bits == 32 && t->dtype.lanes == 1,
            TSR_ERR_UNSUPPORTED, where(op, arg) + "must be float32, got " + describe(t));
  return m;
}

Mat<int32_t> i32(const char *op, const char *arg, const DLTensor *t, int min_ndim) {
  Mat<int32_t> m = view<int32_t>(op, arg, t, min_ndim);
  TSR_CHECK(t->dtype.code == kDLInt && t->dtype.bits == 32 && t->dtype.lanes == 1,
            TSR_ERR_UNSUPPORTED, where(op, arg) + "must be int32, got " + describe(t));
  return m;
}

Flat flat(const char *op, const char *arg, const DLTensor *t) {
  // The shape, device and stride checks do not depend on the element type;
  // alignment is checked below against the element size.
  const Mat<unsigned char> m = view<unsigned char>(op, arg, t, 0);
  const DLDataType d = t->dtype;
  TSR_CHECK(d.bits > 0 && d.bits % 8 == 0 && d.lanes >= 1, TSR_ERR_UNSUPPORTED,
            where(op, arg) + "has an element type of " + std::to_string(d.bits) + " bits x " +
                std::to_string(d.lanes) + " lanes, not a whole number of bytes: " + describe(t));
  const size_t elem = static_cast<size_t>(d.bits / 8) * d.lanes;
  TSR_CHECK(reinterpret_cast<uintptr_t>(m.p) % (d.bits / 8) == 0, TSR_ERR_INVALID,
            where(op, arg) + describe(t) + " is misaligned (byte_offset " +
                std::to_string(t->byte_offset) + ")");
  return Flat{m.p, m.numel(), d, elem};
}

void check_same_numel(const char *op, const char *a_name, const DLTensor *a, const char *b_name,
                      const DLTensor *b) {
  const int64_t na = f32(op, a_name, a).numel(), nb = f32(op, b_name, b).numel();
  TSR_CHECK(na == nb, TSR_ERR_INVALID,
            std::string(op) + ": " + a_name + " " + describe(a) + " and " + b_name + " " +
                describe(b) + " differ in element count (" + std::to_string(na) + " vs " +
                std::to_string(nb) + ")");
}

// ---------------------------------------------------------------------------
// matmul

// Do the byte ranges of two views overlap? sgemm must not write its input.
template <typename T>
static bool overlaps(const Mat<T> &x, const Mat<T> &y) {
  if (x.numel() == 0 || y.numel() == 0) return false;
  const auto x0 = reinterpret_cast<uintptr_t>(x.p), y0 = reinterpret_cast<uintptr_t>(y.p);
  const auto x1 = x0 + sizeof(T) * x.numel(), y1 = y0 + sizeof(T) * y.numel();
  return x0 < y1 && y0 < x1;
}

void gemm(const char *op, const DLTensor *a, int32_t trans_a, const DLTensor *b, int32_t trans_b,
          DLTensor *c, float alpha, float beta) {
  const std::string name(op);
  const Mat<float> A = f32(op, "a", a, 1), B = f32(op, "b", b, 2), C = f32(op, "c", c, 1);
  TSR_CHECK(b->ndim == 2, TSR_ERR_INVALID, name + ": b must be 2-D, got " + describe(b));
  TSR_CHECK((trans_a == 0 || trans_a == 1) && (trans_b == 0 || trans_b == 1), TSR_ERR_INVALID,
            name + ": trans flags must be 0 or 1, got trans_a=" + std::to_string(trans_a) +
                " trans_b=" + std::to_string(trans_b));
  // op(a) is m x k, op(b) is k x n, c is m x n.
  const int64_t m = trans_a ? A.cols : A.rows, k = trans_a ? A.rows : A.cols;
  const int64_t kb = trans_b ? B.cols : B.rows, n = trans_b ? B.rows : B.cols;
  const std::string shapes = " (a " + describe(a) + " trans_a=" + std::to_string(trans_a) + ", b " +
                             describe(b) + " trans_b=" + std::to_string(trans_b) + ", c " +
                             describe(c) + ")";
  TSR_CHECK(k == kb, TSR_ERR_INVALID,
            name + ": inner dimensions differ: op(a) is " + std::to_string(m) + "x" +
                std::to_string(k) + ", op(b) is " + std::to_string(kb) + "x" + std::to_string(n) +
                shapes);
  TSR_CHECK(C.rows == m && C.cols == n, TSR_ERR_INVALID,
            name + ": c must be " + std::to_string(m) + "x" + std::to_string(n) +
                " viewed as (rows, last dim), got " + std::to_string(C.rows) + "x" +
                std::to_string(C.cols) + shapes);
  // cblas takes int dims (LP64 OpenBLAS).
  TSR_CHECK(A.rows <= INT_MAX && A.cols <= INT_MAX && B.rows <= INT_MAX && B.cols <= INT_MAX &&
                C.rows <= INT_MAX && C.cols <= INT_MAX,
            TSR_ERR_UNSUPPORTED, name + ": a dimension exceeds INT_MAX" + shapes);
  TSR_CHECK(!overlaps(C, A) && !overlaps(C, B), TSR_ERR_INVALID,
            name + ": c overlaps a or b in memory" + shapes);

  if (m == 0 || n == 0) return;
  if (k == 0) {
    // An empty product: c = beta * c. Done by hand because a zero-width
    // operand gives a leading dimension of 0, which BLAS rejects loudly.
    float *p = C.p;
    const int64_t len = C.numel();
    if (beta == 0.0f) {
      for (int64_t i = 0; i < len; i++) p[i] = 0.0f;  // BLAS semantics: c is not read
    } else {
      for (int64_t i = 0; i < len; i++) p[i] *= beta;
    }
    return;
  }
  // OpenBLAS runs single-threaded (cpu_ops_set_threads): a large product
  // is split here into independent sgemms on slices of c, one per pool
  // thread, along its longer side. OpenBLAS's own threads spin in
  // sched_yield between calls and fought the pool's threads for the cores
  // (a quarter of a GPT-2 step on 2 cores went to the scheduler).
  const auto slice = [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    // Row r of op(a) starts at a + r * lda untransposed, at column r of a
    // transposed; column j of op(b) likewise.
    const float *ap = trans_a ? A.p + m0 : A.p + m0 * A.cols;
    const float *bp = trans_b ? B.p + n0 * B.cols : B.p + n0;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m1 - m0),
                static_cast<int>(n1 - n0), static_cast<int>(k), alpha, ap, static_cast<int>(A.cols),
                bp, static_cast<int>(B.cols), beta, C.p + m0 * n + n0, static_cast<int>(n));
  };
  constexpr double kSplitFlops = 1 << 21;  // below this a split costs more than it saves
  constexpr int64_t kMinSide = 32;         // rows or columns per slice, at least
  if (pool_threads() <= 1 ||
      2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) <
          kSplitFlops) {
    slice(0, m, 0, n);
  } else if (m >= n) {
    parallel_for(m, kMinSide, [&](int64_t b, int64_t e) { slice(b, e, 0, n); });
  } else {
    parallel_for(n, kMinSide, [&](int64_t b, int64_t e) { slice(0, m, b, e); });
  }
}

static tsr_status matmul(tsr_host_ctx *ctx, const DLTensor *a, int32_t trans_a, const DLTensor *b,
                         int32_t trans_b, DLTensor *c, float alpha, float beta) noexcept {
  return guarded(ctx, [&] { gemm("matmul", a, trans_a, b, trans_b, c, alpha, beta); });
}

// ---------------------------------------------------------------------------
// Element-wise helpers. Plain loops over contiguous floats: -O3 vectorizes
// them, and they are memory-bound, so they stay on one thread (the
// activations, attention and the softmax, which compute, use the pool).

static tsr_status fill(tsr_host_ctx *ctx, DLTensor *x, float value) noexcept {
  return guarded(ctx, [&] {
    const Mat<float> X = f32("fill", "x", x);
    float *p = X.p;
    const int64_t n = X.numel();
    for (int64_t i = 0; i < n; i++) p[i] = value;
  });
}

// copy moves bytes, so unlike the other ops it takes any dtype (bfloat16
// activations, int32 ids), as long as src and dst agree; converting is cast's
// job.
static tsr_status copy(tsr_host_ctx *ctx, const DLTensor *src, DLTensor *dst) noexcept {
  return guarded(ctx, [&] {
    const Flat S = flat("copy", "src", src), D = flat("copy", "dst", dst);
    TSR_CHECK(S.dtype.code == D.dtype.code && S.dtype.bits == D.dtype.bits &&
                  S.dtype.lanes == D.dtype.lanes,
              TSR_ERR_INVALID,
              "copy: src " + describe(src) + " and dst " + describe(dst) +
                  " differ in dtype (cast converts)");
    TSR_CHECK(S.numel == D.numel, TSR_ERR_INVALID,
              "copy: src " + describe(src) + " and dst " + describe(dst) +
                  " differ in element count (" + std::to_string(S.numel) + " vs " +
                  std::to_string(D.numel) + ")");
    // memmove: src and dst may overlap (a shifted view of one buffer).
    if (S.numel > 0 && S.p != D.p) std::memmove(D.p, S.p, S.elem_bytes * S.numel);
  });
}

static tsr_status axpy(tsr_host_ctx *ctx, float alpha, const DLTensor *x, DLTensor *y) noexcept {
  return guarded(ctx, [&] {
    check_same_numel("axpy", "x", x, "y", y);
    const Mat<float> X = f32("axpy", "x", x), Y = f32("axpy", "y", y);
    const float *xp = X.p;
    float *yp = Y.p;
    const int64_t n = X.numel();
    for (int64_t i = 0; i < n; i++) yp[i] += alpha * xp[i];
  });
}

static tsr_status scale(tsr_host_ctx *ctx, float alpha, DLTensor *y) noexcept {
  return guarded(ctx, [&] {
    const Mat<float> Y = f32("scale", "y", y);
    float *p = Y.p;
    const int64_t n = Y.numel();
    for (int64_t i = 0; i < n; i++) p[i] *= alpha;
  });
}

static tsr_status sum_squares(tsr_host_ctx *ctx, const DLTensor *x, double *out) noexcept {
  return guarded(ctx, [&] {
    const Mat<float> X = f32("sum_squares", "x", x);
    TSR_CHECK(out != nullptr, TSR_ERR_INVALID, "sum_squares: out is NULL");
    const float *p = X.p;
    const int64_t n = X.numel();
    // Eight independent double lanes: the compiler may vectorize them (it may
    // not reorder one running sum without -ffast-math), and splitting the sum
    // also shortens each lane's chain of roundings.
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      for (int j = 0; j < 8; j++) acc[j] += static_cast<double>(p[i + j]) * p[i + j];
    }
    for (; i < n; i++) acc[0] += static_cast<double>(p[i]) * p[i];
    *out = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  });
}

}  // namespace tessera::cpu

namespace tessera {

const tsr_ops *cpu_ops() {
  cpu_blas_select_core();
  static const tsr_ops table = {
      .struct_size = tsr_ops_STRUCT_SIZE,
      .matmul = cpu::matmul,
      .bias_act = cpu::bias_act,
      .bias_grad = cpu::bias_grad,
      .act_forward = cpu::act_forward,
      .act_backward = cpu::act_backward,
      .cross_entropy = cpu::cross_entropy,
      .fill = cpu::fill,
      .copy = cpu::copy,
      .axpy = cpu::axpy,
      .scale = cpu::scale,
      .sum_squares = cpu::sum_squares,
      // ABI 1.1
      .cast = cpu::cast,
      .linear = cpu::linear,
      .layernorm_forward = cpu::layernorm_forward,
      .layernorm_backward = cpu::layernorm_backward,
      .embedding_forward = cpu::embedding_forward,
      .embedding_backward = cpu::embedding_backward,
      .attention_forward = cpu::attention_forward,
      .attention_backward = cpu::attention_backward,
      // ABI 1.3
      .add_layernorm_forward = cpu::add_layernorm_forward,
      .matmul_bias_grad = cpu::matmul_bias_grad,
      .matmul_act_backward = cpu::matmul_act_backward,
      // ABI 1.4
      .layernorm_backward_sum = cpu::layernorm_backward_sum,
      // ABI 1.6
      .rmsnorm_forward = cpu::rmsnorm_forward,
      .rmsnorm_backward = cpu::rmsnorm_backward,
      .add_rmsnorm_forward = cpu::add_rmsnorm_forward,
      .rope_forward = cpu::rope_forward,
      .rope_backward = cpu::rope_backward,
      .swiglu_forward = cpu::swiglu_forward,
      .swiglu_backward = cpu::swiglu_backward,
      .attention_gqa_forward = cpu::attention_gqa_forward,
      .attention_gqa_backward = cpu::attention_gqa_backward,
      // ABI 1.8
      .attention_packed_forward = cpu::attention_packed_forward,
      .attention_packed_backward = cpu::attention_packed_backward,
      // ABI 1.9
      .dropout = cpu::dropout,
      // ABI 1.10
      .lowrank_dropout = cpu::lowrank_dropout,
      // ABI 1.12
      .swiglu_backward_out = cpu::swiglu_backward_out,
  };
  return &table;
}

void cpu_ops_set_threads(int n) {
  if (n <= 0) n = openblas_get_num_procs();
  if (n < 1) n = 1;
  // One OpenBLAS thread: gemm splits large products over the pool itself.
  openblas_set_num_threads(1);
  cpu::pool_set_threads(n);
}

}  // namespace tessera
