// The CUDA device runtime: streams, the caching allocator and its
// accounting, the out-of-memory message, pinned memory.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/device.hpp"
#include "util/error.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace gpu_test_device {

using namespace tessera;

TEST_CASE("device: a device is selected and named", "[gpu][device]") {
  REQUIRE(cuda::visible_devices() > 0);
  REQUIRE(cuda::current_device() >= 0);
  const std::string name = cuda::device_name();
  INFO(name);
  CHECK(name.find("sm_") != std::string::npos);
  CHECK(name.find("GiB") != std::string::npos);
  // Selecting the same device again does nothing.
  CHECK_NOTHROW(cuda::select_device(cuda::current_device()));
}

TEST_CASE("device: the three streams are distinct and non-blocking", "[gpu][device]") {
  cudaStream_t s[3] = {cuda::compute_stream(), cuda::comm_stream(), cuda::copy_stream()};
  for (auto x : s) REQUIRE(x != nullptr);
  CHECK(s[0] != s[1]);
  CHECK(s[0] != s[2]);
  CHECK(s[1] != s[2]);
  for (auto x : s) {
    unsigned flags = 0;
    REQUIRE(cudaStreamGetFlags(x, &flags) == cudaSuccess);
    CHECK((flags & cudaStreamNonBlocking) != 0);
  }
  int pc = 0, pm = 0;
  REQUIRE(cudaStreamGetPriority(cuda::compute_stream(), &pc) == cudaSuccess);
  REQUIRE(cudaStreamGetPriority(cuda::comm_stream(), &pm) == cudaSuccess);
  CHECK(pm <= pc);  // lower is higher: comm at least as urgent as compute
  CHECK_NOTHROW(cuda::synchronize());
}

TEST_CASE("device: a freed block comes back for the same size class", "[gpu][device]") {
  cuda::release_cache();
  const size_t r0 = cuda::reserved_bytes();
  REQUIRE(cuda::cached_bytes() == 0);

  void *a = cuda::device_alloc(1000);  // class 1024
  REQUIRE(a != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(a) % 256 == 0);
  CHECK(cuda::reserved_bytes() == r0 + 1024);
  cuda::device_free(a);
  CHECK(cuda::cached_bytes() == 1024);
  CHECK(cuda::reserved_bytes() == r0 + 1024);

  void *b = cuda::device_alloc(1024);  // same class: the same block
  CHECK(b == a);
  CHECK(cuda::cached_bytes() == 0);

  // Large requests round up to 2 MiB.
  void *c = cuda::device_alloc(3 * 1024 * 1024 + 1);
  CHECK(cuda::reserved_bytes() == r0 + 1024 + 4 * 1024 * 1024);
  cuda::device_free(c);
  void *d = cuda::device_alloc(4 * 1024 * 1024);
  CHECK(d == c);
  cuda::device_free(d);
  cuda::device_free(b);
  CHECK(cuda::cached_bytes() == 1024 + 4 * 1024 * 1024);

  // Zero bytes is NULL; freeing NULL does nothing.
  CHECK(cuda::device_alloc(0) == nullptr);
  cuda::device_free(nullptr);

  cuda::release_cache();
  CHECK(cuda::cached_bytes() == 0);
  CHECK(cuda::reserved_bytes() == r0);
}

TEST_CASE("device: memory is usable from the compute stream", "[gpu][device]") {
  std::vector<float> in(1 << 20), out(1 << 20, 0.0f);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
  float *p = static_cast<float *>(cuda::device_alloc(in.size() * sizeof(float)));
  REQUIRE(cudaMemcpyAsync(p, in.data(), in.size() * 4, cudaMemcpyHostToDevice,
                          cuda::compute_stream()) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(out.data(), p, out.size() * 4, cudaMemcpyDeviceToHost,
                          cuda::compute_stream()) == cudaSuccess);
  cuda::synchronize();
  CHECK(std::memcmp(in.data(), out.data(), in.size() * 4) == 0);
  cuda::device_free(p);
}

TEST_CASE("device: running out of memory says how much", "[gpu][device]") {
  void *keep = cuda::device_alloc(4096);
  cuda::device_free(cuda::device_alloc(8192));  // something cached, released on failure
  const size_t ten_tib = size_t(10) << 40;
  try {
    cuda::device_alloc(ten_tib);
    FAIL("a 10 TiB allocation succeeded");
  } catch (const Error &e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(e.code() == TSR_ERR_NO_MEMORY);
    CHECK(msg.find("CUDA: cannot allocate " + std::to_string(ten_tib) + " bytes") == 0);
    CHECK(msg.find("in use") != std::string::npos);
    CHECK(msg.find("cached") != std::string::npos);
    CHECK(msg.find("free on device") != std::string::npos);
  }
  // The failure left no error behind: the next calls work.
  void *after = cuda::device_alloc(4096);
  CHECK(after != nullptr);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK_NOTHROW(cuda::synchronize());
  cuda::device_free(after);
  cuda::device_free(keep);
}

TEST_CASE("device: check_cuda names the call and the place", "[gpu][device]") {
  try {
    TSR_CUDA_CHECK(cudaSetDevice(1 << 20));
    FAIL("no throw");
  } catch (const Error &e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(e.code() == TSR_ERR_INTERNAL);
    CHECK(msg.find("cudaSetDevice(1 << 20)") != std::string::npos);
    CHECK(msg.find("test_device.cpp:") != std::string::npos);
    CHECK(msg.find("cudaErrorInvalidDevice") != std::string::npos);
  }
  // The failed call did not change this thread's device.
  int dev = -1;
  REQUIRE(cudaGetDevice(&dev) == cudaSuccess);
  CHECK(dev == cuda::current_device());
}

TEST_CASE("device: pinned memory is cached and page-locked", "[gpu][device]") {
  void *p = cuda::pinned_alloc(100000);
  REQUIRE(p != nullptr);
  cudaPointerAttributes attr{};
  REQUIRE(cudaPointerGetAttributes(&attr, p) == cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeHost);
  std::memset(p, 7, 100000);  // usable from the host
  cuda::pinned_free(p);
  void *q = cuda::pinned_alloc(99999);  // same class
  CHECK(q == p);
  cuda::pinned_free(q);
  CHECK(cuda::pinned_alloc(0) == nullptr);
}

TEST_CASE("device: another thread allocates on the selected device", "[gpu][device]") {
  void *p = nullptr;
  int seen = -2;
  std::thread t([&] {
    p = cuda::device_alloc(512);
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) == cudaSuccess) seen = attr.device;
  });
  t.join();
  CHECK(seen == cuda::current_device());
  cuda::device_free(p);
}

}  // namespace gpu_test_device
