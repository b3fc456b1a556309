// `tessera env`'s host half: the build, the CPU's vector units, OpenBLAS,
// io_uring, host memory and the plugins; then the whole report and its JSON.
#include <dlfcn.h>
#include <linux/io_uring.h>
#include <sys/syscall.h>
#include <tessera/abi.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <tessera/cpp/meminfo.hpp>
#include <thread>

#include "backend/cpu/cpu_ops.hpp"
#include "cli/env_probe.hpp"
#include "cli/env_probe_internal.hpp"
#include "plugin/registry.hpp"

namespace tessera::cli {

namespace {

EnvItem item(const char *section, std::string name, bool ok, std::string value,
             std::string fix = "") {
  EnvItem i;
  i.section = section;
  i.name = std::move(name);
  i.ok = ok;
  i.value = std::move(value);
  i.fix = ok ? "" : std::move(fix);
  return i;
}

void probe_build(std::vector<EnvItem> &out) {
  EnvItem v = item("build", "tessera", true,
                   std::string(TESSERA_VERSION) + ", plugin ABI " + std::to_string(TSR_ABI_MAJOR) +
                       "." + std::to_string(TSR_ABI_MINOR) + ", compiler " + __VERSION__);
  v.data = {{"version", TESSERA_VERSION},
            {"abi", std::to_string(TSR_ABI_MAJOR) + "." + std::to_string(TSR_ABI_MINOR)},
            {"compiler", __VERSION__}};
  out.push_back(std::move(v));
#if TESSERA_HAVE_CUDA
  out.push_back(item("build", "CUDA support", true, "built in (CUDA ops, NCCL collectives)"));
#else
  out.push_back(item("build", "CUDA support", false, "not built in: this binary runs on the CPU",
                     "the CUDA toolkit (nvcc) and NCCL when configuring; on a GPU machine "
                     "without Debian's packages, tools/gpu-build"));
#endif
#if TESSERA_HAVE_CUDNN
  out.push_back(item("build", "cuDNN support", true, "built in (loaded at run time)"));
#else
  out.push_back(item("build", "cuDNN support", false, "not built in",
                     "optional: cuDNN 9's headers (cudnn_graph.h) when configuring a CUDA build"));
#endif
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  return "unknown CPU";
}

void probe_cpu(std::vector<EnvItem> &out) {
  __builtin_cpu_init();
  EnvItem c = item(
      "cpu", "CPU", true,
      cpu_model() + ", " + std::to_string(std::thread::hardware_concurrency()) + " logical cores");
  c.data = {{"model", cpu_model()}, {"logical_cores", std::thread::hardware_concurrency()}};
  out.push_back(std::move(c));
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  out.push_back(item("cpu", "AVX2 + FMA", avx2, avx2 ? "yes" : "no",
                     "a CPU with AVX2 (x86-64 since 2013): without it the CPU ops run their "
                     "narrower SSE clones and OpenBLAS its older kernels"));
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  out.push_back(item("cpu", "AVX-512 (F, BW, VL, DQ)", avx512, avx512 ? "yes" : "no",
                     "optional: a CPU with AVX-512 runs the widest CPU kernels; AVX2 ones "
                     "run otherwise"));
  // The core the engine's runs use: it may switch OpenBLAS's kernels for a
  // CPU the library does not know (backend/cpu/cpu_blas_core.cpp).
  cpu_blas_select_core();
  using Str = char *(*)();
  using Int = int (*)();
  const auto corename = reinterpret_cast<Str>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  const auto config = reinterpret_cast<Str>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  const auto threads = reinterpret_cast<Int>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (!corename) {
    out.push_back(item("cpu", "OpenBLAS", false, "the BLAS linked is not OpenBLAS",
                       "Debian's libopenblas0-pthread (tools/deps installs it)"));
    return;
  }
  const std::string core = corename() ? corename() : "?";
  const std::string cfg = config && config() ? config() : "";
  EnvItem b = item("cpu", "OpenBLAS", true,
                   "core " + core + (cfg.empty() ? "" : " (" + cfg + ")") +
                       (threads ? ", " + std::to_string(threads()) + " threads" : ""));
  b.data = {{"core", core}, {"config", cfg}, {"threads", threads ? threads() : 0}};
  out.push_back(std::move(b));
}

// The kernel's io_uring, as offload "nvme" opens it: a ring of 2 entries.
void probe_io_uring(std::vector<EnvItem> &out) {
  io_uring_params params;
  std::memset(&params, 0, sizeof params);
  const long fd = syscall(__NR_io_uring_setup, 2, &params);
  const int err = errno;
  if (fd >= 0) {
    close(static_cast<int>(fd));
    out.push_back(item("host", "io_uring", true, "the kernel gives rings"));
    return;
  }
  const std::string why = err == ENOSYS  ? "the kernel has no io_uring (ENOSYS)"
                          : err == EPERM ? "refused (EPERM): sysctl kernel.io_uring_disabled, or a "
                                           "container's seccomp profile"
                                         : std::string("refused: ") + std::strerror(err);
  out.push_back(item("host", "io_uring", false, why,
                     "optional: Linux 5.6+ with io_uring allowed (kernel.io_uring_disabled=0; "
                     "in Docker a seccomp profile that permits it); offload 'nvme' uses "
                     "pread/pwrite without it"));
}

void probe_memory(std::vector<EnvItem> &out) {
  uint64_t total = 0;
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "MemTotal: %llu kB", &kib) == 1) total = kib * 1024ULL;
  }
  const sdk::HostMemory avail = sdk::host_memory_available();
  EnvItem m = item("host", "host memory", total > 0,
                   format_gib(total) + " total, " + format_gib(avail.bytes) + " available (" +
                       avail.source + ")",
                   "/proc/meminfo unreadable");
  m.data = {{"total_bytes", total}, {"available_bytes", avail.bytes}, {"source", avail.source}};
  out.push_back(std::move(m));
}

void probe_plugins(std::vector<EnvItem> &out, const std::vector<std::string> &paths) {
  const std::vector<std::string> dirs = Registry::search_dirs(paths);
  for (const auto &d : dirs) {
    std::error_code ec;
    const bool there = std::filesystem::is_directory(d, ec);
    EnvItem p = item("plugins", "plugin path", there, d + (there ? "" : " (no such directory)"),
                     "nothing, unless plugins belong there: install them there, or name "
                     "their directory with --plugin-path or TESSERA_PLUGIN_PATH");
    p.data = {{"dir", d}};
    out.push_back(std::move(p));
  }
  Registry reg;
  reg.scan(dirs);
  for (const auto &e : reg.plugins()) {
    const std::string abi = std::to_string(e.abi_major) + "." + std::to_string(e.abi_minor);
    EnvItem p =
        item("plugins", e.kind + " " + e.desc->name, true,
             std::string(e.desc->version ? e.desc->version : "?") + ", ABI " + abi + ", " + e.file);
    p.data = {{"kind", e.kind},
              {"plugin", e.desc->name},
              {"version", e.desc->version ? e.desc->version : ""},
              {"abi", abi},
              {"file", e.file}};
    out.push_back(std::move(p));
  }
  if (reg.plugins().empty())
    out.push_back(item("plugins", "plugins", false, "none found in the plugin path",
                       "build them (tools/build) or pass --plugin-path DIR"));
  for (const auto &r : reg.refusals())
    out.push_back(item("plugins", "refused", false, r, "rebuild or remove the library named"));
}

}  // namespace

std::string format_gib(uint64_t bytes) {
  return sdk::format_bytes(static_cast<double>(bytes));
}

EnvReport env_probe(const std::vector<std::string> &plugin_paths) {
  EnvReport r;
  probe_build(r.items);
  EnvFacts facts;
  probe_cuda(r.items, facts);
#if TESSERA_HAVE_CUDA
  const bool built = true;
#else
  const bool built = false;
#endif
  const bool usable = built && facts.gpus > 0;
  const std::string why = usable   ? std::to_string(facts.gpus) + " GPU(s)"
                          : !built ? "absent: this binary has no CUDA support"
                                   : "absent: no GPU visible to the driver";
  EnvItem u = item("cuda", "CUDA runs", usable, why + (usable ? "" : "; runs use the CPU"),
                   built ? "the items marked missing above" : "a CUDA build (see CUDA support)");
  u.data = {{"usable", usable}, {"gpus", facts.gpus}};
  r.items.push_back(std::move(u));
  probe_cpu(r.items);
  probe_io_uring(r.items);
  probe_memory(r.items);
  probe_plugins(r.items, plugin_paths);
  return r;
}

nlohmann::json env_json(const EnvReport &r) {
  nlohmann::json items = nlohmann::json::array();
  for (const auto &i : r.items) {
    nlohmann::json j = {{"section", i.section}, {"name", i.name}, {"ok", i.ok}, {"value", i.value}};
    if (!i.fix.empty()) j["fix"] = i.fix;
    if (!i.data.is_null()) j["data"] = i.data;
    items.push_back(std::move(j));
  }
  return {{"tessera", TESSERA_VERSION},
          {"abi", std::to_string(TSR_ABI_MAJOR) + "." + std::to_string(TSR_ABI_MINOR)},
          {"items", std::move(items)}};
}

}  // namespace tessera::cli
