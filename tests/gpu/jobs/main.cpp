// The GPU jobs' runner: Catch2's main, except that with fewer GPUs visible
// than the tests need every test exits with 77, which ctest reports as
// skipped. The tests start `tessera run`; this process itself uses no GPU.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>

#include "backend/cuda/device.hpp"

int main(int argc, char **argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--list", 6) == 0) listing = true;
  // TESSERA_JOBS_GPUS: the GPUs this runner's tests need (2 for the
  // two-GPU jobs, 1 for the one-GPU offload jobs).
  const int gpus = listing ? 0 : tessera::cuda::visible_devices();
  if (!listing && gpus < TESSERA_JOBS_GPUS) {
    std::printf("%d GPU(s) visible, these tests need %d: skipping them\n", gpus, TESSERA_JOBS_GPUS);
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
