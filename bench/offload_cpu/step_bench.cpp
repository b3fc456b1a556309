// bench/offload_cpu/step_bench: the CPU half of offload `cpu`, measured alone.
//
//   step_bench PLUGIN_DIR PARAMS THREADS [STEPS]
//
// Loads the adam optimizer plugin and the `cpu` offload plugin from
// PLUGIN_DIR behind a minimal host (host memory, config, log), sets the
// offload up for PARAMS fp32 elements with THREADS threads, and times STEPS
// offload steps over the whole range (after one warm-up step): the same path
// a CPU run takes, the optimizer's CPU kernel in chunks on the plugin's
// pool. Then a STREAM-style triad (a = b + s * c, float32) on as many
// threads over arrays of the same size. Prints one JSON line: params/s,
// GB/s at 28 bytes per parameter (read p, g, m, v; write p, m, v: all real
// traffic, the stores hit lines just read), the triad's GB/s as STREAM
// counts it (12 bytes per element) and as the memory moves it (16: the
// store to `a` first reads the line, write-allocate), and Adam's share of
// the latter.
#include <dlfcn.h>
#include <tessera/tessera.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Cfg {
  std::map<std::string, double> num;
  std::map<std::string, std::vector<double>> arr;
};

tsr_status error(tsr_host_ctx *, tsr_status code, const char *message) {
  std::fprintf(stderr, "error: %s\n", message);
  return code;
}
void log(tsr_host_ctx *, int32_t, const char *message) {
  std::fprintf(stderr, "%s\n", message);
}
const Cfg *as(const tsr_config *c) {
  return reinterpret_cast<const Cfg *>(c);
}
tsr_status config_bool(const tsr_config *c, const char *k, int32_t *out) {
  *out = as(c)->num.count(k) ? int32_t(as(c)->num.at(k)) : 0;
  return TSR_OK;
}
tsr_status config_int(const tsr_config *c, const char *k, int64_t *out) {
  *out = as(c)->num.count(k) ? int64_t(as(c)->num.at(k)) : 0;
  return TSR_OK;
}
tsr_status config_float(const tsr_config *c, const char *k, double *out) {
  *out = as(c)->num.count(k) ? as(c)->num.at(k) : 0;
  return TSR_OK;
}
tsr_status config_string(const tsr_config *, const char *, const char **out) {
  *out = "";
  return TSR_OK;
}
tsr_status config_array_size(const tsr_config *c, const char *k, size_t *out) {
  *out = as(c)->arr.count(k) ? as(c)->arr.at(k).size() : 0;
  return TSR_OK;
}
tsr_status config_float_at(const tsr_config *c, const char *k, size_t i, double *out) {
  *out = as(c)->arr.at(k).at(i);
  return TSR_OK;
}
tsr_status alloc(tsr_host_ctx *, DLDevice, size_t bytes, tsr_mem_purpose, void **out) {
  if (bytes == 0) {
    *out = nullptr;
    return TSR_OK;
  }
  *out = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!*out) return TSR_ERR_NO_MEMORY;
  std::memset(*out, 0, bytes);  // first touch, like the engine's allocator
  return TSR_OK;
}
void release(tsr_host_ctx *, void *p) {
  std::free(p);
}

const tsr_plugin_descriptor *find(const std::string &dir, const char *lib, const char *name) {
  const std::string path = dir + "/" + lib;
  void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::fprintf(stderr, "%s\n", dlerror());
    std::exit(1);
  }
  auto entry =
      reinterpret_cast<const tsr_plugin_library *(*)()>(dlsym(h, "tessera_plugin_library"));
  const tsr_plugin_library *l = entry();
  for (size_t i = 0; i < l->num_plugins; ++i)
    if (std::strcmp(l->plugins[i]->name, name) == 0) return l->plugins[i];
  std::fprintf(stderr, "%s: no plugin %s\n", path.c_str(), name);
  std::exit(1);
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

#define OK(x)                                   \
  do {                                          \
    if ((x) != TSR_OK) {                        \
      std::fprintf(stderr, "failed: %s\n", #x); \
      std::exit(1);                             \
    }                                           \
  } while (0)

}  // namespace

int main(int argc, char **argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: step_bench PLUGIN_DIR PARAMS THREADS [STEPS]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const size_t n = static_cast<size_t>(std::atof(argv[2]));
  const int threads = std::atoi(argv[3]);
  const int steps = argc > 4 ? std::atoi(argv[4]) : 5;

  tsr_run_info run{};
  run.struct_size = sizeof run;
  run.world_size = run.local_world_size = 1;
  run.device = DLDevice{kDLCPU, 0};
  tsr_host host{};
  host.struct_size = sizeof host;
  host.abi_major = TSR_ABI_MAJOR;
  host.abi_minor = TSR_ABI_MINOR;
  host.error = error;
  host.log = log;
  host.config_bool = config_bool;
  host.config_int = config_int;
  host.config_float = config_float;
  host.config_string = config_string;
  host.config_array_size = config_array_size;
  host.config_float_at = config_float_at;
  host.alloc = alloc;
  host.free = release;
  host.run = &run;

  const auto *adam = static_cast<const tsr_optimizer_vtable *>(
      find(dir, "libtsr_optimizer_adam.so", "adam")->vtable);
  const auto *cpu =
      static_cast<const tsr_offload_vtable *>(find(dir, "libtsr_offload_cpu.so", "cpu")->vtable);
  Cfg acfg;
  acfg.num = {{"lr", 1e-3}, {"eps", 1e-8}, {"weight_decay", 0.01}, {"adamw", 1}};
  acfg.arr = {{"betas", {0.9, 0.999}}};
  Cfg ocfg;
  ocfg.num = {{"threads", threads}, {"sub_group_size", 1 << 24}, {"pin_memory", 0}};
  void *opt = nullptr, *off = nullptr;
  OK(adam->create(&host, reinterpret_cast<const tsr_config *>(&acfg), &opt));
  OK(cpu->create(&host, reinterpret_cast<const tsr_config *>(&ocfg), &off));
  tsr_offload_setup os{};
  os.struct_size = sizeof os;
  os.n = n;
  os.optimizer = adam;
  os.optimizer_self = opt;
  os.state_count = 2;
  os.device = DLDevice{kDLCPU, 0};
  os.compute_dtype = DLDataType{kDLFloat, 32, 1};
  OK(cpu->setup(off, &os));

  std::vector<float> grads(n), params(n);
  for (size_t i = 0; i < n; ++i) grads[i] = 1e-3f * float(int(i % 2001) - 1000);
  const tsr_segment seg{0, n, 1};
  double best = 1e30;
  for (int s = 0; s <= steps; ++s) {
    tsr_offload_step st{};
    st.struct_size = sizeof st;
    st.count = n;
    st.grads = grads.data();
    st.params = params.data();
    st.segments = &seg;
    st.num_segments = 1;
    st.lr = 1e-3;
    st.grad_scale = 1;
    st.step = s + 1;
    const double t0 = now();
    OK(cpu->step(off, &st));
    OK(cpu->flush(off));
    if (s > 0) best = std::min(best, now() - t0);  // step 0 warms up
  }
  cpu->destroy(off);
  adam->destroy(opt);
  std::vector<float>().swap(grads);
  std::vector<float>().swap(params);

  // Triad over the same number of elements, the same number of threads,
  // each thread on its own contiguous slice (first touched by it).
  std::vector<float *> a(1), b(1), c(1);
  a[0] = static_cast<float *>(std::aligned_alloc(64, (n * 4 + 63) / 64 * 64));
  b[0] = static_cast<float *>(std::aligned_alloc(64, (n * 4 + 63) / 64 * 64));
  c[0] = static_cast<float *>(std::aligned_alloc(64, (n * 4 + 63) / 64 * 64));
  auto parallel = [&](auto fn) {
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        const size_t lo = n * t / threads, hi = n * (t + 1) / threads;
        fn(lo, hi);
      });
    for (auto &t : ts) t.join();
  };
  parallel([&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) a[0][i] = 0, b[0][i] = 1, c[0][i] = 2;
  });
  double triad = 1e30;
  for (int s = 0; s < 5; ++s) {
    const double t0 = now();
    parallel([&](size_t lo, size_t hi) {
      float *__restrict x = a[0];
      const float *__restrict y = b[0];
      const float *__restrict z = c[0];
      for (size_t i = lo; i < hi; ++i) x[i] = y[i] + 3.0f * z[i];
    });
    triad = std::min(triad, now() - t0);
  }
  std::free(a[0]);
  std::free(b[0]);
  std::free(c[0]);
  const double pps = n / best, adam_gbs = pps * 28 / 1e9;
  const double triad_gbs = n * 12.0 / triad / 1e9, triad_real = n * 16.0 / triad / 1e9;
  std::printf(
      "{\"params\": %zu, \"threads\": %d, \"step_s\": %.4f, \"params_per_s\": %.4g, "
      "\"adam_GBps\": %.2f, \"triad_GBps\": %.2f, \"triad_GBps_moved\": %.2f, "
      "\"pct_of_triad\": %.1f}\n",
      n, threads, best, pps, adam_gbs, triad_gbs, triad_real, 100 * adam_gbs / triad_real);
  return 0;
}
