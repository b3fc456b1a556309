// OpenBLAS's kernel for this CPU. Debian 12's OpenBLAS (0.3.21, built with
// DYNAMIC_ARCH) picks its kernels at load time from the CPU's family and
// model, and a model newer than the library (Intel's Sapphire and Emerald
// Rapids, family 6 models 143 and 207) falls back to its most generic x86-64
// kernels, "Prescott" (SSE3): sgemm runs at a quarter of what the CPU does
// with the AVX-512 kernels it has. When OpenBLAS reports that fallback and
// the CPU (and the OS) support AVX-512 or AVX2, the engine switches it to
// its SkylakeX or Haswell kernels, through the library's own re-selection
// (gotoblas_dynamic_quit/init, reading OPENBLAS_CORETYPE), once, before the
// first matmul. OPENBLAS_CORETYPE set by the user is left alone, and so is a
// library without these entry points (another BLAS, a static OpenBLAS).
#include <dlfcn.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "backend/cpu/cpu_ops.hpp"

namespace tessera {

namespace {

using CoreName = char *(*)();
using Reinit = void (*)();

template <typename Fn>
Fn blas_entry(const char *name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

// The OpenBLAS core type the CPU can run best, or "" when none applies.
const char *best_core() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512cd"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return "";
}

void select_core() {
  if (const char *set = std::getenv("OPENBLAS_CORETYPE"); set && *set) return;
  const auto corename = blas_entry<CoreName>("openblas_get_corename");
  const auto quit = blas_entry<Reinit>("gotoblas_dynamic_quit");
  const auto init = blas_entry<Reinit>("gotoblas_dynamic_init");
  if (!corename || !quit || !init) return;
  const std::string was = corename() ? corename() : "";
  if (was != "Prescott") return;  // OpenBLAS knew the CPU
  const char *want = best_core();
  if (!*want) return;
  // The variable also reaches the job's workers, whose OpenBLAS then
  // starts with these kernels.
  setenv("OPENBLAS_CORETYPE", want, 1);
  quit();
  init();
  const std::string now = corename() ? corename() : "";
  spdlog::info(
      "CPU BLAS: OpenBLAS does not know this CPU and chose its generic {} kernels; using its {} "
      "kernels instead (OPENBLAS_CORETYPE={}; set OPENBLAS_CORETYPE yourself to choose)",
      was, now, want);
}

}  // namespace

void cpu_blas_select_core() {
  static std::once_flag once;
  std::call_once(once, select_core);
}

}  // namespace tessera
