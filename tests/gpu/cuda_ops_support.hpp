// Support for the tests of the CUDA ops table (test_cuda_matmul.cpp,
// test_cuda_ops_nn.cpp, test_cuda_ops_elementwise.cpp), which hold it against
// the CPU ops (float32, on the same values) and, for the ABI 1.1 entries,
// against references written out in the tests in double. bfloat16 and float16
// runs round their inputs to the dtype first, so the reference computes on
// exactly the values the GPU saw; the tolerances then only cover the output's
// rounding and the fp32 accumulation.
//
// Here: both ops tables and a host for their error messages, REQUIRE_OK, the
// dtypes with their rounding and tolerances, tensors owning GPU, pinned or host
// memory, random values, and expect_close. Inline, one definition for all the
// files that include it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <tessera/ops.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.hpp"
#include "backend/cuda/cuda_ops.hpp"
#include "backend/cuda/device.hpp"
#include "host/host.hpp"

namespace cuda_ops_test {

using tessera::cuda::device_alloc;
using tessera::cuda::device_free;

inline const tsr_ops &gpu() {
  return *tessera::cuda_ops();
}
inline const tsr_ops &cpu() {
  return *tessera::cpu_ops();
}

// A host for the error messages the ops report.
inline tessera::Host &host() {
  static tessera::Host h{tessera::Host::RunFacts{}};
  return h;
}
inline tsr_host_ctx *ctx() {
  return host().ctx();
}
inline std::string last_error() {
  return host().last_error();
}

// Fails with the op's own message when a call that should work does not.
#define REQUIRE_OK(call)                                                       \
  do {                                                                         \
    cuda_ops_test::host().clear_error();                                       \
    const tsr_status s_ = (call);                                              \
    INFO(#call << " -> status " << s_ << ": " << cuda_ops_test::last_error()); \
    REQUIRE(s_ == TSR_OK);                                                     \
  } while (0)

// ---------------------------------------------------------------------------
// dtypes

enum class Dt { F32, BF16, F16, I32 };
inline constexpr Dt kFloatDts[] = {Dt::F32, Dt::BF16, Dt::F16};

inline const char *name(Dt d) {
  switch (d) {
    case Dt::F32:
      return "float32";
    case Dt::BF16:
      return "bfloat16";
    case Dt::F16:
      return "float16";
    default:
      return "int32";
  }
}
inline DLDataType dl_type(Dt d) {
  switch (d) {
    case Dt::F32:
      return {kDLFloat, 32, 1};
    case Dt::BF16:
      return {kDLBfloat, 16, 1};
    case Dt::F16:
      return {kDLFloat, 16, 1};
    default:
      return {kDLInt, 32, 1};
  }
}
inline size_t size_of(Dt d) {
  return d == Dt::BF16 || d == Dt::F16 ? 2 : 4;
}

// The value a float becomes when stored as d (round to nearest even).
inline float round_to(Dt d, float x) {
  switch (d) {
    case Dt::BF16:
      return __bfloat162float(__float2bfloat16_rn(x));
    case Dt::F16:
      return __half2float(__float2half_rn(x));
    default:
      return x;
  }
}
inline std::vector<float> rounded(Dt d, std::vector<float> v) {
  for (float &x : v) x = round_to(d, x);
  return v;
}

// Relative tolerance of a result stored as d.
inline double tol(Dt d) {
  return d == Dt::F32 ? 1e-5 : (d == Dt::BF16 ? 1e-2 : 2e-3);
}

inline std::string shape_str(const std::vector<int64_t> &s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); i++) {
    if (i) r += ",";
    r += std::to_string(s[i]);
  }
  return r + "]";
}

inline int64_t numel_of(const std::vector<int64_t> &s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// ---------------------------------------------------------------------------
// Tensors: owned memory on the GPU (kDLCUDA), in pinned host memory
// (kDLCUDAHost) or in plain host memory (kDLCPU).

struct Tensor {
  std::vector<int64_t> shape;
  Dt dt;
  int device_type;
  void *data = nullptr;
  size_t bytes = 0;
  DLTensor t{};

  Tensor(std::vector<int64_t> s, Dt d, int type = kDLCUDA)
      : shape(std::move(s)), dt(d), device_type(type) {
    bytes = static_cast<size_t>(numel_of(shape)) * size_of(dt);
    const size_t b = bytes ? bytes : 1;
    if (type == kDLCUDA) {
      data = device_alloc(b);
    } else if (type == kDLCUDAHost) {
      data = tessera::cuda::pinned_alloc(b);
    } else {
      data = std::malloc(b);
    }
  }
  ~Tensor() {
    if (device_type == kDLCUDA) {
      device_free(data);
    } else if (device_type == kDLCUDAHost) {
      tessera::cuda::pinned_free(data);
    } else {
      std::free(data);
    }
  }
  Tensor(const Tensor &) = delete;
  Tensor &operator=(const Tensor &) = delete;

  int64_t numel() const { return numel_of(shape); }
  // Rebuilt on every call, so a test may break a field on purpose.
  DLTensor *dl() {
    t.data = data;
    t.device = DLDevice{static_cast<DLDeviceType>(device_type),
                        device_type == kDLCUDA ? tessera::cuda::current_device() : 0};
    t.ndim = static_cast<int>(shape.size());
    t.dtype = dl_type(dt);
    t.shape = shape.data();
    t.strides = nullptr;
    t.byte_offset = 0;
    return &t;
  }
  std::string desc() const {
    return std::string(name(dt)) + shape_str(shape) + " on device type " +
           std::to_string(device_type);
  }

  void put_bytes(const void *src) {
    if (!bytes) return;
    if (device_type == kDLCUDA) {
      // cudaMemcpy from pageable memory may return before the DMA lands,
      // and the ops run on a non-blocking stream that does not wait for
      // the legacy stream: finish the copy before any op can read it.
      REQUIRE(cudaMemcpy(data, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    } else {
      std::memcpy(data, src, bytes);
    }
  }
  void get_bytes(void *dst) const {
    if (!bytes) return;
    tessera::cuda::synchronize();
    if (device_type == kDLCUDA) {
      REQUIRE(cudaMemcpy(dst, data, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    } else {
      std::memcpy(dst, data, bytes);
    }
  }

  // Stores v converted to the dtype (which rounds: pass rounded values to
  // know exactly what was stored).
  void set(const std::vector<float> &v) {
    REQUIRE(static_cast<int64_t>(v.size()) == numel());
    std::vector<unsigned char> raw(bytes);
    for (size_t i = 0; i < v.size(); i++) {
      if (dt == Dt::F32) {
        std::memcpy(&raw[4 * i], &v[i], 4);
      } else if (dt == Dt::BF16) {
        const __nv_bfloat16 h = __float2bfloat16_rn(v[i]);
        std::memcpy(&raw[2 * i], &h, 2);
      } else {
        const __half h = __float2half_rn(v[i]);
        std::memcpy(&raw[2 * i], &h, 2);
      }
    }
    put_bytes(raw.data());
  }
  void set_i32(const std::vector<int32_t> &v) {
    REQUIRE(static_cast<int64_t>(v.size()) == numel());
    put_bytes(v.data());
  }
  std::vector<float> get() const {
    std::vector<unsigned char> raw(bytes);
    get_bytes(raw.data());
    std::vector<float> v(static_cast<size_t>(numel()));
    for (size_t i = 0; i < v.size(); i++) {
      if (dt == Dt::F32) {
        std::memcpy(&v[i], &raw[4 * i], 4);
      } else if (dt == Dt::BF16) {
        __nv_bfloat16 h;
        std::memcpy(&h, &raw[2 * i], 2);
        v[i] = __bfloat162float(h);
      } else {
        __half h;
        std::memcpy(&h, &raw[2 * i], 2);
        v[i] = __half2float(h);
      }
    }
    return v;
  }
};

inline std::vector<float> randn(size_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float &x : v) x = u(rng);
  return v;
}

// A float32 host tensor holding v, for the CPU ops.
struct Cpu : Tensor {
  Cpu(std::vector<int64_t> s, const std::vector<float> &v) : Tensor(std::move(s), Dt::F32, kDLCPU) {
    set(v);
  }
};

// A device tensor of dtype d holding v rounded to d; `vals` keeps the
// rounded values for the reference.
struct Gpu : Tensor {
  std::vector<float> vals;
  Gpu(std::vector<int64_t> s, Dt d, const std::vector<float> &v)
      : Tensor(std::move(s), d), vals(rounded(d, v)) {
    set(vals);
  }
};

// Norm-relative error plus the worst element, with a message naming the
// case; max-abs is held to a few times the relative tolerance of the
// largest magnitude.
inline void expect_close(const std::string &what, const std::vector<float> &got,
                         const std::vector<double> &want, double rel_tol) {
  REQUIRE(got.size() == want.size());
  double num = 0, den = 0, worst = 0, scale = 0;
  size_t at = 0;
  bool finite = true;
  for (size_t i = 0; i < got.size(); i++) {
    const double d = got[i] - want[i];
    finite = finite && std::isfinite(got[i]);
    num += d * d;
    den += want[i] * want[i];
    scale = std::max(scale, std::fabs(want[i]));
    if (std::fabs(d) > worst) worst = std::fabs(d), at = i;
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  INFO(what << ": rel err " << rel << " (tol " << rel_tol << "), max abs err " << worst << " at "
            << at << " (got " << (got.empty() ? 0.0 : got[at]) << ", want "
            << (want.empty() ? 0.0 : want[at]) << "), max |want| " << scale);
  CHECK(finite);
  CHECK(rel <= rel_tol);
  CHECK(worst <= 4 * rel_tol * std::max(1.0, scale));
}
inline void expect_close(const std::string &what, const std::vector<float> &got,
                         const std::vector<float> &want, double rel_tol) {
  expect_close(what, got, std::vector<double>(want.begin(), want.end()), rel_tol);
}

inline double ref_act(tsr_activation act, double x) {
  switch (act) {
    case TSR_ACT_RELU:
      return x > 0 ? x : 0;
    case TSR_ACT_TANH:
      return std::tanh(x);
    case TSR_ACT_GELU:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    default:
      return x;
  }
}
inline const char *act_name(tsr_activation a) {
  static const char *names[] = {"none", "relu", "gelu", "tanh"};
  return names[a];
}
inline constexpr tsr_activation kActs[] = {TSR_ACT_NONE, TSR_ACT_RELU, TSR_ACT_GELU, TSR_ACT_TANH};

inline std::string case_name(const char *op, Dt d, const std::vector<int64_t> &shape,
                             const std::string &extra = "") {
  return std::string(op) + " " + name(d) + shape_str(shape) + (extra.empty() ? "" : " " + extra);
}

}  // namespace cuda_ops_test
