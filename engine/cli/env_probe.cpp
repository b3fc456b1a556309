// `tessera env`'s GPU half: the CUDA driver, runtime, GPUs, NCCL, cuDNN and
// cuBLASLt, each through dlopen and the library's own version call. A CUDA
// build links libcudart and libcublasLt (so dlopen finds the copies already
// loaded) and dlopens cuDNN itself (backend/cuda/cudnn_lib.cpp); a CPU-only
// build has none of them, and the probe reports what the machine would
// give a CUDA build. The host half (build, CPU, memory, plugins) is in
// env_host.cpp.
#include "cli/env_probe.hpp"

#include <dlfcn.h>

#include <cstddef>
#include <string>

#include "cli/env_probe_internal.hpp"

namespace tessera::cli {

namespace {

// The first of `names` that dlopen finds (its handle is kept: probing is
// done once per process); null with every dlerror joined in `why`.
void *open_first(std::initializer_list<const char *> names, std::string *found, std::string *why) {
  for (const char *n : names) {
    if (void *so = dlopen(n, RTLD_NOW | RTLD_LOCAL)) {
      *found = n;
      return so;
    }
    const char *e = dlerror();
    *why += std::string(why->empty() ? "" : "; ") + (e ? e : n);
  }
  return nullptr;
}

template <typename F>
F symbol(void *so, const char *name) {
  return so ? reinterpret_cast<F>(dlsym(so, name)) : nullptr;
}

// "12.4" from the runtime/driver encoding 1000 * major + 10 * minor.
std::string cuda_version(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

// "2.21.5" from major * 10000 + minor * 100 + patch (NCCL >= 2.9, cuDNN 9,
// cuBLAS), or major * 1000 + minor * 100 + patch (older NCCL, cuDNN 8).
std::string dotted_version(size_t v) {
  const size_t major_unit = v >= 10000 ? 10000 : 1000;
  return std::to_string(v / major_unit) + "." + std::to_string((v % major_unit) / 100) + "." +
         std::to_string(v % 100);
}

EnvItem cuda_item(const char *name, bool ok, std::string value, std::string fix = "") {
  EnvItem i;
  i.section = "cuda";
  i.name = name;
  i.ok = ok;
  i.value = std::move(value);
  i.fix = ok ? "" : std::move(fix);
  return i;
}

// CUDA driver API entry points (cuda.h's types as plain ints).
using CuInit = int (*)(unsigned);
using CuIntOut = int (*)(int *);
using CuDeviceGet = int (*)(int *, int);
using CuDeviceGetName = int (*)(char *, int, int);
using CuDeviceTotalMem = int (*)(size_t *, int);
using CuDeviceGetAttribute = int (*)(int *, int, int);
using CuGetErrorString = int (*)(int, const char **);
constexpr int kCcMajor = 75, kCcMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_*

const char *kDriverFix =
    "NVIDIA's driver (libcuda.so.1: Debian's nvidia-driver from non-free, or NVIDIA's "
    "cuda-drivers package); check with nvidia-smi";

// The driver, then each GPU it shows (CUDA_VISIBLE_DEVICES applies).
void probe_driver(std::vector<EnvItem> &out, EnvFacts &facts) {
  std::string found, why;
  void *so = open_first({"libcuda.so.1", "libcuda.so"}, &found, &why);
  if (!so) {
    out.push_back(cuda_item("CUDA driver", false, "not found (" + why + ")", kDriverFix));
    return;
  }
  const auto init = symbol<CuInit>(so, "cuInit");
  const auto version = symbol<CuIntOut>(so, "cuDriverGetVersion");
  const auto count = symbol<CuIntOut>(so, "cuDeviceGetCount");
  const auto get = symbol<CuDeviceGet>(so, "cuDeviceGet");
  const auto name = symbol<CuDeviceGetName>(so, "cuDeviceGetName");
  const auto mem = symbol<CuDeviceTotalMem>(so, "cuDeviceTotalMem_v2");
  const auto attr = symbol<CuDeviceGetAttribute>(so, "cuDeviceGetAttribute");
  const auto err = symbol<CuGetErrorString>(so, "cuGetErrorString");
  if (!init || !version || !count || !get || !name || !mem || !attr) {
    out.push_back(
        cuda_item("CUDA driver", false, found + " lacks the driver API entry points", kDriverFix));
    return;
  }
  int v = 0;
  version(&v);
  EnvItem d = cuda_item("CUDA driver", true, cuda_version(v) + " (" + found + ")");
  d.data = {{"version", cuda_version(v)}, {"library", found}};
  if (const int rc = init(0); rc != 0) {
    const char *msg = nullptr;
    if (err) err(rc, &msg);
    d.ok = false;
    d.value += ", but cuInit failed: " + std::string(msg ? msg : "error " + std::to_string(rc));
    d.fix =
        "no usable GPU: check nvidia-smi, the device files (/dev/nvidia*) and "
        "CUDA_VISIBLE_DEVICES";
    out.push_back(std::move(d));
    return;
  }
  out.push_back(std::move(d));
  int n = 0;
  count(&n);
  facts.gpus = n;
  if (n == 0)
    out.push_back(
        cuda_item("GPUs", false, "none visible", "check CUDA_VISIBLE_DEVICES and nvidia-smi"));
  for (int i = 0; i < n; ++i) {
    int dev = 0, major = 0, minor = 0;
    char buf[256] = {};
    size_t bytes = 0;
    get(&dev, i);
    name(buf, sizeof buf - 1, dev);
    mem(&bytes, dev);
    attr(&major, kCcMajor, dev);
    attr(&minor, kCcMinor, dev);
    const std::string cc = std::to_string(major) + "." + std::to_string(minor);
    EnvItem g =
        cuda_item(("GPU " + std::to_string(i)).c_str(), true,
                  std::string(buf) + ", " + format_gib(bytes) + ", compute capability " + cc);
    g.data = {{"index", i}, {"name", buf}, {"memory_bytes", bytes}, {"compute_capability", cc}};
    out.push_back(std::move(g));
  }
}

// A library found by dlopen whose version comes from one call; `fix` says
// what to install when none of `names` loads.
template <typename Fn, typename Show>
void probe_library(std::vector<EnvItem> &out, const char *what,
                   std::initializer_list<const char *> names, const char *fn_name, Show show,
                   const std::string &fix, bool *present = nullptr) {
  std::string found, why;
  void *so = open_first(names, &found, &why);
  const auto fn = symbol<Fn>(so, fn_name);
  if (present) *present = fn != nullptr;
  if (!so) {
    out.push_back(cuda_item(what, false, "not found (" + why + ")", fix));
    return;
  }
  if (!fn) {
    out.push_back(cuda_item(what, false, found + " has no " + fn_name, fix));
    return;
  }
  const std::string v = show(fn);
  EnvItem i = cuda_item(what, true, v + " (" + found + ")");
  i.data = {{"version", v}, {"library", found}};
  out.push_back(std::move(i));
}

}  // namespace

void probe_cuda(std::vector<EnvItem> &out, EnvFacts &facts) {
  probe_driver(out, facts);
  probe_library<int (*)(int *)>(
      out, "CUDA runtime",
      {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"},
      "cudaRuntimeGetVersion",
      [](int (*f)(int *)) {
        int v = 0;
        f(&v);
        return cuda_version(v);
      },
      "the CUDA runtime (libcudart: NVIDIA's CUDA toolkit, or pip nvidia-cuda-runtime-cu12) "
      "on the library path",
      &facts.runtime);
  probe_library<size_t (*)()>(
      out, "cuBLASLt", {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11"},
      "cublasLtGetVersion", [](size_t (*f)()) { return dotted_version(f()); },
      "cuBLASLt (NVIDIA's CUDA toolkit, or pip nvidia-cublas-cu12): every matmul of a CUDA run");
  probe_library<int (*)(int *)>(
      out, "NCCL", {"libnccl.so.2", "libnccl.so"}, "ncclGetVersion",
      [](int (*f)(int *)) {
        int v = 0;
        f(&v);
        return dotted_version(static_cast<size_t>(v));
      },
      "NCCL 2 (libnccl2 from NVIDIA's repository, or pip nvidia-nccl-cu12): the collectives of "
      "multi-GPU runs");
  probe_library<size_t (*)()>(
      out, "cuDNN", {"libcudnn.so.9", "libcudnn_graph.so.9"}, "cudnnGetVersion",
      [](size_t (*f)()) { return dotted_version(f()); },
      "optional: cuDNN 9 (libcudnn9-cuda-12, or pip nvidia-cudnn-cu12, on the library path) "
      "for fused bf16/fp16 attention; without it tessera's own attention kernels run");
}

}  // namespace tessera::cli
