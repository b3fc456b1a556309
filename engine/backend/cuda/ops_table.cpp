// CUDA ops, the frame: tensor checks, the host/device routing every entry
// starts with, scratch memory, and the table itself. The entries live in
// ops_matmul.cpp and ops_matmul_grad.cpp (cuBLASLt), ops_elementwise.cu,
// ops_activation.cu, ops_cross_entropy.cu, ops_layernorm.cu,
// ops_embedding.cu and attention_select.cpp (cuDNN, attention_cudnn.cpp, or
// the kernels of attention*.cu); ABI 1.6's in ops_decoder.hpp's files.
#include <cstring>
#include <mutex>

#include "backend/cuda/cuda_ops.hpp"
#include "backend/cuda/cuda_ops_internal.hpp"
#include "backend/cuda/ops_decoder.hpp"
#include "util/dltensor.hpp"

namespace tessera::cuda {

// ---------------------------------------------------------------------------
// Tensor checks

const char *dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "float32";
    case DType::BF16:
      return "bfloat16";
    case DType::F16:
      return "float16";
    case DType::I32:
      return "int32";
  }
  return "?";
}

std::string describe(const DLTensor *t) {
  return tessera::describe(t);
}

static std::string where(const char *op, const char *arg) {
  return std::string(op) + ": " + arg + " ";
}

static bool on_host(const DLTensor *t) {
  return t->device.device_type == kDLCPU || t->device.device_type == kDLCUDAHost;
}

Side side_of(const char *op, std::initializer_list<Arg> args) {
  const Arg *host = nullptr, *dev = nullptr;
  for (const Arg &a : args) {
    if (!a.t) continue;
    const int type = a.t->device.device_type;
    if (on_host(a.t)) {
      if (!host) host = &a;
    } else if (type == kDLCUDA) {
      TSR_CHECK(a.t->device.device_id == current_device(), TSR_ERR_UNSUPPORTED,
                where(op, a.name) + describe(a.t) + " is on GPU " +
                    std::to_string(a.t->device.device_id) + " but this process drives GPU " +
                    std::to_string(current_device()));
      if (!dev) dev = &a;
    } else {
      throw Error(TSR_ERR_UNSUPPORTED, where(op, a.name) + describe(a.t) + " is on device type " +
                                           std::to_string(type) +
                                           "; the CUDA ops take kDLCUDA or host memory");
    }
  }
  if (host && dev) {
    throw Error(TSR_ERR_INVALID, where(op, host->name) + describe(host->t) + " is on device type " +
                                     std::to_string(host->t->device.device_type) +
                                     ", expected CUDA (as " + dev->name + " is)");
  }
  return host ? Side::Host : Side::Device;
}

static std::string dims_str(int ndim, const int64_t *dims) {
  std::string s = "[";
  for (int i = 0; i < ndim; i++) {
    if (i) s += ",";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

View any_view(const char *op, const char *arg, const DLTensor *t, int min_ndim) {
  TSR_CHECK(t != nullptr, TSR_ERR_INVALID, where(op, arg) + "is NULL");
  TSR_CHECK(t->device.device_type == kDLCUDA, TSR_ERR_INVALID,
            where(op, arg) + describe(t) + " is on device type " +
                std::to_string(t->device.device_type) + ", expected CUDA");
  TSR_CHECK(t->ndim >= min_ndim && (t->ndim == 0 || t->shape != nullptr), TSR_ERR_INVALID,
            where(op, arg) + "must have at least " + std::to_string(min_ndim) + " dims, got " +
                describe(t));
  const DLDataType d = t->dtype;
  DType dt;
  if (d.lanes == 1 && d.code == kDLFloat && d.bits == 32) {
    dt = DType::F32;
  } else if (d.lanes == 1 && d.code == kDLBfloat && d.bits == 16) {
    dt = DType::BF16;
  } else if (d.lanes == 1 && d.code == kDLFloat && d.bits == 16) {
    dt = DType::F16;
  } else if (d.lanes == 1 && d.code == kDLInt && d.bits == 32) {
    dt = DType::I32;
  } else {
    throw Error(TSR_ERR_UNSUPPORTED,
                where(op, arg) + describe(t) +
                    " has a dtype the CUDA ops do not take (float32, bfloat16, float16, int32)");
  }
  int64_t rows = 1, cols = t->ndim ? t->shape[t->ndim - 1] : 1, numel = 1;
  for (int i = 0; i < t->ndim; i++) {
    TSR_CHECK(t->shape[i] >= 0, TSR_ERR_INVALID,
              where(op, arg) + "has a negative dim: " + describe(t));
    bool overflow = __builtin_mul_overflow(numel, t->shape[i], &numel);
    if (i + 1 < t->ndim) overflow |= __builtin_mul_overflow(rows, t->shape[i], &rows);
    // Kernels index with int64 element offsets times up to 4 bytes.
    TSR_CHECK(!overflow && numel < (int64_t(1) << 60), TSR_ERR_INVALID,
              where(op, arg) + "is too large: " + describe(t));
  }
  if (t->strides && numel > 0) {
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
      TSR_CHECK(t->shape[i] == 1 || t->strides[i] == expect, TSR_ERR_UNSUPPORTED,
                where(op, arg) + describe(t) + " is not contiguous (strides " +
                    dims_str(t->ndim, t->strides) + "); the CUDA ops need compact row-major");
      expect *= t->shape[i];
    }
  }
  TSR_CHECK(numel == 0 || t->data != nullptr, TSR_ERR_INVALID,
            where(op, arg) + describe(t) + " has NULL data");
  void *p = static_cast<char *>(t->data) + t->byte_offset;
  TSR_CHECK(reinterpret_cast<uintptr_t>(p) % dtype_size(dt) == 0, TSR_ERR_INVALID,
            where(op, arg) + describe(t) + " is misaligned (byte_offset " +
                std::to_string(t->byte_offset) + ")");
  return View{p, rows, cols, dt};
}

View floating(const char *op, const char *arg, const DLTensor *t, int min_ndim) {
  View v = any_view(op, arg, t, min_ndim);
  TSR_CHECK(v.dt != DType::I32, TSR_ERR_UNSUPPORTED,
            where(op, arg) + "must be float32, bfloat16 or float16, got " + describe(t));
  return v;
}

View f32(const char *op, const char *arg, const DLTensor *t, int min_ndim) {
  View v = any_view(op, arg, t, min_ndim);
  TSR_CHECK(v.dt == DType::F32, TSR_ERR_UNSUPPORTED,
            where(op, arg) + "must be float32, got " + describe(t));
  return v;
}

View i32(const char *op, const char *arg, const DLTensor *t, int min_ndim) {
  View v = any_view(op, arg, t, min_ndim);
  TSR_CHECK(v.dt == DType::I32, TSR_ERR_UNSUPPORTED,
            where(op, arg) + "must be int32, got " + describe(t));
  return v;
}

void check_same_numel(const char *op, const char *a_name, const DLTensor *a, const View &va,
                      const char *b_name, const DLTensor *b, const View &vb) {
  TSR_CHECK(va.numel() == vb.numel(), TSR_ERR_INVALID,
            std::string(op) + ": " + a_name + " " + describe(a) + " and " + b_name + " " +
                describe(b) + " differ in element count (" + std::to_string(va.numel()) + " vs " +
                std::to_string(vb.numel()) + ")");
}

void check_same_dtype(const char *op, const char *a_name, const DLTensor *a, const View &va,
                      const char *b_name, const DLTensor *b, const View &vb) {
  TSR_CHECK(va.dt == vb.dt, TSR_ERR_UNSUPPORTED,
            std::string(op) + ": " + a_name + " " + describe(a) + " and " + b_name + " " +
                describe(b) + " must have the same dtype");
}

void check_activation(const char *op, tsr_activation act) {
  tessera::check_activation(op, act);
}

// ---------------------------------------------------------------------------
// Device state

int sm_count() {
  // One GPU per process, selected before any op runs.
  static const int n = [] {
    int v = 0;
    TSR_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, current_device()));
    return v > 0 ? v : 1;
  }();
  return n;
}

namespace {
struct Buffer {
  void *p = nullptr;
  size_t bytes = 0;
};
std::mutex g_scratch_mu;
Buffer g_scratch[static_cast<int>(Slot::kCount)];
void *g_pinned = nullptr;
constexpr size_t kPinnedBytes = 4096;
}  // namespace

void *scratch(Slot slot, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_scratch_mu);
  Buffer &b = g_scratch[static_cast<int>(slot)];
  if (bytes > b.bytes) {
    // Grow geometrically so a slowly rising demand reallocates rarely. The
    // old block goes back to the caching allocator; whatever still reads it
    // is queued on the compute stream ahead of any new user.
    size_t want = b.bytes * 2 > bytes ? b.bytes * 2 : bytes;
    want = (want + 255) / 256 * 256;
    void *p = device_alloc(want);
    if (b.p) device_free(b.p);
    b.p = p;
    b.bytes = want;
  }
  return b.p;
}

void read_back(void *dst, const void *src, size_t bytes) {
  TSR_CHECK(bytes <= kPinnedBytes, TSR_ERR_INTERNAL, "read_back: too many bytes");
  std::lock_guard<std::mutex> lock(g_scratch_mu);
  if (!g_pinned) g_pinned = pinned_alloc(kPinnedBytes);
  TSR_CUDA_CHECK(cudaMemcpyAsync(g_pinned, src, bytes, cudaMemcpyDeviceToHost, compute_stream()));
  TSR_CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
  std::memcpy(dst, g_pinned, bytes);
}

}  // namespace tessera::cuda

namespace tessera {

const tsr_ops *cuda_ops() {
  static const tsr_ops table = {
      .struct_size = tsr_ops_STRUCT_SIZE,
      .matmul = cuda::matmul,
      .bias_act = cuda::bias_act,
      .bias_grad = cuda::bias_grad,
      .act_forward = cuda::act_forward,
      .act_backward = cuda::act_backward,
      .cross_entropy = cuda::cross_entropy,
      .fill = cuda::fill,
      .copy = cuda::copy,
      .axpy = cuda::axpy,
      .scale = cuda::scale,
      .sum_squares = cuda::sum_squares,
      .cast = cuda::cast,
      .linear = cuda::linear,
      .layernorm_forward = cuda::layernorm_forward,
      .layernorm_backward = cuda::layernorm_backward,
      .embedding_forward = cuda::embedding_forward,
      .embedding_backward = cuda::embedding_backward,
      .attention_forward = cuda::attention_forward,
      .attention_backward = cuda::attention_backward,
      // ABI 1.3
      .add_layernorm_forward = cuda::add_layernorm_forward,
      .matmul_bias_grad = cuda::matmul_bias_grad,
      .matmul_act_backward = cuda::matmul_act_backward,
      // ABI 1.4
      .layernorm_backward_sum = cuda::layernorm_backward_sum,
      // ABI 1.6
      .rmsnorm_forward = cuda::rmsnorm_forward,
      .rmsnorm_backward = cuda::rmsnorm_backward,
      .add_rmsnorm_forward = cuda::add_rmsnorm_forward,
      .rope_forward = cuda::rope_forward,
      .rope_backward = cuda::rope_backward,
      .swiglu_forward = cuda::swiglu_forward,
      .swiglu_backward = cuda::swiglu_backward,
      .attention_gqa_forward = cuda::attention_gqa_forward,
      .attention_gqa_backward = cuda::attention_gqa_backward,
      // ABI 1.8
      .attention_packed_forward = cuda::attention_packed_forward,
      .attention_packed_backward = cuda::attention_packed_backward,
      // ABI 1.9
      .dropout = cuda::dropout,
      // ABI 1.10
      .lowrank_dropout = cuda::lowrank_dropout,
      // ABI 1.12
      .swiglu_backward_out = cuda::swiglu_backward_out,
  };
  return &table;
}

}  // namespace tessera
