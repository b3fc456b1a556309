// OpenBLAS's kernels for a CPU it does not know (backend/cpu/cpu_blas_core.cpp):
// after the CPU ops table is first taken, OpenBLAS runs the CPU's own
// AVX-512 or AVX2 kernels, not its generic Prescott fallback, unless the
// user chose with OPENBLAS_CORETYPE. A Debian 12 OpenBLAS (0.3.21) on an
// Intel Sapphire or Emerald Rapids falls back to Prescott without it.
#include <dlfcn.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "backend/cpu/cpu_ops.hpp"

namespace unit_test_cpu_blas_core {

TEST_CASE("OpenBLAS runs the CPU's own kernels, not its generic fallback", "[cpu][blas]") {
  const char *user = std::getenv("OPENBLAS_CORETYPE");
  (void)tessera::cpu_ops();  // first use: the kernels are chosen
  using CoreName = char *(*)();
  const auto corename = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (!corename) {
    WARN("skipped: the linked BLAS is not OpenBLAS");
    return;
  }
  const std::string core = corename() ? corename() : "";
  INFO("OpenBLAS core: " << core << "; OPENBLAS_CORETYPE " << (user ? user : "unset"));
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (user && *user && std::string(user) != "SkylakeX" && std::string(user) != "Haswell") {
    WARN("skipped: OPENBLAS_CORETYPE=" << user << " was set by the user");
    return;
  }
  if (!avx2) {
    WARN("skipped: the CPU has no AVX2, so Prescott may be its right kernel");
    return;
  }
  CHECK(core != "Prescott");
  // The choice reaches the job's workers through the environment.
  if (core == "SkylakeX" || core == "Haswell") {
    const char *now = std::getenv("OPENBLAS_CORETYPE");
    if (now) CHECK(std::string(now) == core);
  }
}

}  // namespace unit_test_cpu_blas_core
