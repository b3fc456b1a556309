// The GPU test runner: Catch2's main, except that where no GPU is visible
// (no driver, no device, CUDA_VISIBLE_DEVICES empty) every test exits 77,
// which ctest reports as skipped rather than passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/device.hpp"

int main(int argc, char **argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--list", 6) == 0) listing = true;
  if (!listing && tessera::cuda::visible_devices() == 0) {
    std::printf("no GPU visible: skipping the GPU tests\n");
    return 77;
  }
  // One GPU a process: a multi-process run ([multirank] in test_nccl.cpp)
  // gives each rank its own through LOCAL_RANK.
  const char *local_rank = std::getenv("LOCAL_RANK");
  if (!listing) tessera::cuda::select_device(local_rank ? std::atoi(local_rank) : 0);
  return Catch::Session().run(argc, argv);
}
