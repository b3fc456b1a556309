// Device memory for the GPU model tests (test_gpt2_gpu.cpp,
// test_llama_gpu.cpp): a tensor in the run's dtype (float32 or bfloat16)
// filled from and read back as doubles, and the norm-based relative error.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <tessera/cpp/half.hpp>
#include <vector>

namespace tessera::test::gpu {

// Device memory in the run's dtype, filled from / read back as doubles.
struct DeviceTensor {
  void *p = nullptr;
  size_t n = 0;
  bool bf16 = false;
  DeviceTensor(size_t count, bool b) : n(count), bf16(b) {
    REQUIRE(cudaMalloc(&p, n * (bf16 ? 2 : 4)) == cudaSuccess);
    REQUIRE(cudaMemset(p, 0, n * (bf16 ? 2 : 4)) == cudaSuccess);
    // Lands before any op: the ops' non-blocking stream does not wait for it.
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
  ~DeviceTensor() { cudaFree(p); }
  DeviceTensor(const DeviceTensor &) = delete;
  DeviceTensor(DeviceTensor &&o) noexcept : p(o.p), n(o.n), bf16(o.bf16) { o.p = nullptr; }
  // The first v.size() entries; the rest keep `pad`.
  void put(const std::vector<double> &v, float pad) {
    REQUIRE(v.size() <= n);
    std::vector<float> f(n, pad);
    for (size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(v[i]);
    if (bf16) {
      std::vector<uint16_t> h(n);
      for (size_t i = 0; i < n; ++i) h[i] = tessera::sdk::float_to_bf16(f[i]);
      REQUIRE(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice) == cudaSuccess);
      // Lands before any op: the ops' non-blocking stream does not wait for it.
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    } else {
      REQUIRE(cudaMemcpy(p, f.data(), n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
      // Lands before any op: the ops' non-blocking stream does not wait for it.
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    }
  }
  std::vector<double> get() const {
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<double> out(n);
    if (bf16) {
      std::vector<uint16_t> h(n);
      REQUIRE(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
      for (size_t i = 0; i < n; ++i) out[i] = tessera::sdk::bf16_to_float(h[i]);
    } else {
      std::vector<float> h(n);
      REQUIRE(cudaMemcpy(h.data(), p, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
      for (size_t i = 0; i < n; ++i) out[i] = h[i];
    }
    return out;
  }
};

// ||got - want|| / ||want|| over want's entries.
inline double rel_err(const std::vector<double> &got, const std::vector<double> &want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

}  // namespace tessera::test::gpu
