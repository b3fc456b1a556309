// The two-GPU jobs' runner: Catch2's main, except that with fewer than two
// GPUs visible every test exits with 77, which ctest reports as skipped.
// The tests start `tessera run -n 2`; this process itself uses no GPU.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>

#include "cuda/device.hpp"

int main(int argc, char **argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--list", 6) == 0) listing = true;
  const int gpus = listing ? 0 : tessera::cuda::visible_devices();
  if (!listing && gpus < 2) {
    std::printf("%d GPU(s) visible, these tests need 2: skipping them\n", gpus);
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
