// Support for the tests of the CPU ops added in ABI 1.1
// (test_cpu_ops_nn11.cpp, test_cpu_ops_nn11_cast.cpp): the CPU ops table,
// owning host tensors of any element type, random fill, and a host to read
// the ops' error messages from.
#pragma once

#include <tessera/ops.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.hpp"
#include "host/host.hpp"

namespace tessera::test::cpu_ops_nn11_support {

inline const tsr_ops &ops() {
  return *tessera::cpu_ops();
}

inline constexpr DLDataType kF32{kDLFloat, 32, 1};
inline constexpr DLDataType kBF16{kDLBfloat, 16, 1};
inline constexpr DLDataType kF16{kDLFloat, 16, 1};
inline constexpr DLDataType kI32{kDLInt, 32, 1};

inline int64_t numel_of(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// An owning host tensor of element type T (storage) and DLPack dtype `dtype`
// (float16 and bfloat16 are stored as uint16_t). dl() rebuilds the DLTensor
// so a test can break one field on purpose.
template <typename T>
struct Buf {
  std::vector<int64_t> shape;
  std::vector<T> v;
  DLDataType dtype;
  DLTensor t{};
  Buf(std::vector<int64_t> s, DLDataType d, T init = T(0))
      : shape(std::move(s)), v(static_cast<size_t>(numel_of(shape)), init), dtype(d) {}
  DLTensor *dl() {
    t.data = v.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = static_cast<int>(shape.size());
    t.dtype = dtype;
    t.shape = shape.data();
    t.strides = nullptr;
    t.byte_offset = 0;
    return &t;
  }
};

struct F32 : Buf<float> {
  explicit F32(std::vector<int64_t> s, float init = 0.0f) : Buf(std::move(s), kF32, init) {}
};
struct I32 : Buf<int32_t> {
  explicit I32(std::vector<int64_t> s, int32_t init = 0) : Buf(std::move(s), kI32, init) {}
};
using U16 = Buf<uint16_t>;  // bfloat16 or float16 bits

inline void randomize(std::vector<float> &x, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (float &e : x) e = u(rng);
}

// A host to read error messages from (the ops drop them when ctx is NULL).
struct Msgs {
  tessera::Host host{tessera::Host::RunFacts{}};
  tsr_host_ctx *ctx() { return host.ctx(); }
  std::string last() { return host.last_error(); }
};

}  // namespace tessera::test::cpu_ops_nn11_support
