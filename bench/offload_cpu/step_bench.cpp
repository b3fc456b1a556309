// bench/offload_cpu/step_bench: tessera's CPU AdamW step against the
// memory's ceiling for the same traffic, on the same threads.
//
//   step_bench PLUGIN_DIR PARAMS THREADS [REPS] [STEPS]
//   (KERNEL=auto|avx512|avx2|scalar picks the plugin's cpu_kernel)
//
// THREADS threads, thread t pinned to the t-th CPU this process may run on,
// each owning one contiguous slice of every array and touching it first
// (so its pages sit on that thread's NUMA node), as a NUMA-aware offload
// would lay them out. Arrays: bf16 gradients, fp32 master, m and v, and the
// bf16 compute copy: 28 bytes per parameter per step (read g 2, read and
// write master, m, v 24, write the copy 2).
//   tessera: each thread calls the adamw plugin's CPU step (the optimizer's
//     vtable, as offload backends do per chunk) on its slice: bf16
//     gradients in, bf16 copy out, decoupled weight decay.
//   ceiling: a read-modify-write kernel over the same arrays on the same
//     threads with trivial math (p += g, m += g, v += g * g, copy = top half
//     of p), vectorised like the step, once with non-temporal stores of the
//     copy and once with plain ones; the faster is the ceiling.
// Each figure is the median over REPS windows (default 5, at least 3) of
// STEPS steps each, after one warm-up window; tessera and the ceiling
// alternate window by window. STEPS 0 (the default): as many steps as fill
// WINDOW_S seconds (default 5.5; bench/lib/harness.py refuses windows under
// 5 s), timed from the warm-up window. Prints one JSON line: the medians,
// and each window's rate and length (ours_rates, ours_windows_s, ...).
#include <dlfcn.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <tessera/tessera.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

// ---------------------------------------------------------------------------
// A minimal host: config values from maps, messages to stderr.

struct Cfg {
  std::map<std::string, double> num;
  std::map<std::string, std::vector<double>> arr;
  std::map<std::string, std::string> str;
};
const Cfg *as(const tsr_config *c) {
  return reinterpret_cast<const Cfg *>(c);
}
tsr_status error(tsr_host_ctx *, tsr_status code, const char *message) {
  std::fprintf(stderr, "error: %s\n", message);
  return code;
}
void log(tsr_host_ctx *, int32_t, const char *message) {
  std::fprintf(stderr, "%s\n", message);
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
tsr_status config_string(const tsr_config *c, const char *k, const char **out) {
  *out = as(c)->str.count(k) ? as(c)->str.at(k).c_str() : "";
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

// Pages reserved, not touched: the thread that owns a slice touches it
// first. Huge pages where the kernel gives them (fewer TLB misses over
// gigabytes, for both kernels alike).
template <typename T>
T *reserve(size_t n) {
  const size_t bytes = (n * sizeof(T) + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE);
#endif
  return static_cast<T *>(p);
}

// ---------------------------------------------------------------------------
// The ceiling: the same arrays and traffic as the step, trivial math.

template <bool Stream>
void rmw(float *p, const uint16_t *g, float *m, float *v, uint16_t *out, size_t n) {
  size_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m256i gh = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(g + i));
    const __m512 gf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(gh), 16));
    const __m512 pi = _mm512_add_ps(_mm512_loadu_ps(p + i), gf);
    _mm512_storeu_ps(p + i, pi);
    _mm512_storeu_ps(m + i, _mm512_add_ps(_mm512_loadu_ps(m + i), gf));
    _mm512_storeu_ps(v + i, _mm512_add_ps(_mm512_loadu_ps(v + i), _mm512_mul_ps(gf, gf)));
    const __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(pi), 16));
    if constexpr (Stream)
      _mm256_stream_si256(reinterpret_cast<__m256i *>(out + i), h);
    else
      _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + i), h);
  }
#elif defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    const __m128i gh = _mm_loadu_si128(reinterpret_cast<const __m128i *>(g + i));
    const __m256 gf = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(gh), 16));
    const __m256 pi = _mm256_add_ps(_mm256_loadu_ps(p + i), gf);
    _mm256_storeu_ps(p + i, pi);
    _mm256_storeu_ps(m + i, _mm256_add_ps(_mm256_loadu_ps(m + i), gf));
    _mm256_storeu_ps(v + i, _mm256_add_ps(_mm256_loadu_ps(v + i), _mm256_mul_ps(gf, gf)));
    const __m256i top = _mm256_srli_epi32(_mm256_castps_si256(pi), 16);
    const __m128i h =
        _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(top, top), 0x08));
    if constexpr (Stream)
      _mm_stream_si128(reinterpret_cast<__m128i *>(out + i), h);
    else
      _mm_storeu_si128(reinterpret_cast<__m128i *>(out + i), h);
  }
#endif
  for (; i < n; ++i) {
    uint32_t u = uint32_t(g[i]) << 16;
    float gf;
    std::memcpy(&gf, &u, 4);
    p[i] += gf;
    m[i] += gf;
    v[i] += gf * gf;
    std::memcpy(&u, &p[i], 4);
    out[i] = uint16_t(u >> 16);
  }
  if constexpr (Stream) _mm_sfence();
}

// ---------------------------------------------------------------------------
// THREADS pinned workers that run one job at a time, each on its slice.

class Team {
 public:
  explicit Team(const std::vector<int> &cpus) : start_(cpus.size() + 1), done_(cpus.size() + 1) {
    for (size_t t = 0; t < cpus.size(); ++t)
      threads_.emplace_back([this, t, cpu = cpus[t]] {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        pthread_setaffinity_np(pthread_self(), sizeof set, &set);
        for (;;) {
          start_.arrive_and_wait();
          if (stop_) return;
          (*job_)(t);
          done_.arrive_and_wait();
        }
      });
  }
  ~Team() {
    stop_ = true;
    start_.arrive_and_wait();
    for (auto &t : threads_) t.join();
  }
  // Runs job(t) on every worker; returns the seconds from start to the last.
  double run(const std::function<void(size_t)> &job) {
    job_ = &job;
    const double t0 = now();
    start_.arrive_and_wait();
    done_.arrive_and_wait();
    return now() - t0;
  }

 private:
  std::barrier<> start_, done_;
  const std::function<void(size_t)> *job_ = nullptr;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x.size() % 2 ? x[x.size() / 2] : (x[x.size() / 2 - 1] + x[x.size() / 2]) / 2;
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
    std::fprintf(stderr, "usage: step_bench PLUGIN_DIR PARAMS THREADS [REPS] [STEPS] [WINDOW_S]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const size_t n = static_cast<size_t>(std::atof(argv[2]));
  const size_t threads = static_cast<size_t>(std::atoi(argv[3]));
  const int reps = argc > 4 ? std::max(3, std::atoi(argv[4])) : 5;
  int steps = argc > 5 ? std::max(0, std::atoi(argv[5])) : 0;
  const double window_s = argc > 6 ? std::atof(argv[6]) : 5.5;
  const std::string kernel = std::getenv("KERNEL") ? std::getenv("KERNEL") : "auto";
  // What "auto" picks: the plugin's rule (the widest this CPU runs).
  __builtin_cpu_init();
  const std::string picked = kernel != "auto"                    ? kernel
                             : __builtin_cpu_supports("avx512f") ? "avx512"
                             : __builtin_cpu_supports("avx2")    ? "avx2"
                                                                 : "scalar";

  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  sched_getaffinity(0, sizeof allowed, &allowed);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < threads; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  if (cpus.size() < threads) {
    std::fprintf(stderr, "step_bench: %zu threads asked, %zu CPUs allowed\n", threads, cpus.size());
    return 2;
  }

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
  host.run = &run;
  const auto *adam = static_cast<const tsr_optimizer_vtable *>(
      find(dir, "libtsr_optimizer_adam.so", "adamw")->vtable);
  Cfg acfg;
  acfg.num = {{"lr", 1e-3}, {"eps", 1e-8}, {"weight_decay", 0.01}, {"adamw", 1}};
  acfg.arr = {{"betas", {0.9, 0.999}}};
  acfg.str = {{"cpu_kernel", kernel}};
  void *opt = nullptr;
  OK(adam->create(&host, reinterpret_cast<const tsr_config *>(&acfg), &opt));

  float *p = reserve<float>(n), *m = reserve<float>(n), *v = reserve<float>(n);
  uint16_t *g = reserve<uint16_t>(n), *out = reserve<uint16_t>(n);
  // Slice t is [lo(t), lo(t + 1)), boundaries on 16 elements (64 bytes of
  // fp32, so no cache line is shared by two threads' fp32 arrays).
  auto lo = [&](size_t t) { return t >= threads ? n : n * t / threads / 16 * 16; };

  Team team(cpus);
  team.run([&](size_t t) {  // first touch, by the owner
    for (size_t i = lo(t); i < lo(t + 1); ++i) {
      p[i] = 1e-2f * float(int(i % 997) - 498);
      m[i] = v[i] = 0.0f;
      const float x = 1e-3f * float(int(i % 2001) - 1000);
      uint32_t u;
      std::memcpy(&u, &x, 4);
      g[i] = uint16_t(u >> 16);
      out[i] = 0;
    }
  });

  int64_t t_step = 0;
  auto adam_job = [&](size_t t) {
    const size_t b = lo(t), e = lo(t + 1);
    float *state[2] = {m + b, v + b};
    const tsr_segment seg{0, e - b, 1};
    tsr_optimizer_step_args a{};
    a.struct_size = sizeof a;
    a.device = DLDevice{kDLCPU, 0};
    a.params = p + b;
    a.grads = reinterpret_cast<const float *>(g + b);  // bf16 bits, as grads_dtype says
    a.grads_dtype = DLDataType{kDLBfloat, 16, 1};
    a.state = state;
    a.n = e - b;
    a.segments = &seg;
    a.num_segments = 1;
    a.lr = 1e-3;
    a.grad_scale = 1.0;
    a.step = t_step;
    a.compute_params = out + b;
    a.compute_dtype = DLDataType{kDLBfloat, 16, 1};
    if (adam->step(opt, &a) != TSR_OK) std::abort();
  };
  auto window = [&](auto &&job, int k_steps) {
    double s = 0;
    for (int k = 0; k < k_steps; ++k) {
      ++t_step;
      s += team.run(job);
    }
    return s / k_steps;
  };
  const std::function<void(size_t)> ours = adam_job;
  const std::function<void(size_t)> nt = [&](size_t t) {
    rmw<true>(p + lo(t), g + lo(t), m + lo(t), v + lo(t), out + lo(t), lo(t + 1) - lo(t));
  };
  const std::function<void(size_t)> plain = [&](size_t t) {
    rmw<false>(p + lo(t), g + lo(t), m + lo(t), v + lo(t), out + lo(t), lo(t + 1) - lo(t));
  };
  std::vector<double> t_ours, t_nt, t_plain;
  // Warm-up, which also times a step for STEPS 0: the fastest of the three
  // sets the count, so every window is at least WINDOW_S long.
  const double w_ours = window(ours, 1), w_nt = window(nt, 1), w_plain = window(plain, 1);
  const double fastest = std::min({w_ours, w_nt, w_plain});
  if (steps == 0) steps = std::max(1, static_cast<int>(std::ceil(window_s / fastest)));
  for (int r = 0; r < reps; ++r) {
    t_ours.push_back(window(ours, steps));
    t_nt.push_back(window(nt, steps));
    t_plain.push_back(window(plain, steps));
  }
  adam->destroy(opt);

  const double s_ours = median(t_ours), s_nt = median(t_nt), s_plain = median(t_plain);
  const double s_ceil = std::min(s_nt, s_plain);
  const char *isa =
#if defined(__AVX512F__)
      "avx512";
#elif defined(__AVX2__)
      "avx2";
#else
      "scalar";
#endif
  std::string cpu_list;
  for (int c : cpus) cpu_list += (cpu_list.empty() ? "" : ",") + std::to_string(c);
  // Each window's rate (params/s) and length (s), as JSON arrays.
  auto rates = [&](const std::vector<double> &t, bool seconds) {
    std::string a = "[";
    char buf[32];
    for (size_t i = 0; i < t.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%s%.6g", i ? ", " : "", seconds ? t[i] * steps : n / t[i]);
      a += buf;
    }
    return a + "]";
  };
  std::printf(
      "{\"params\": %zu, \"threads\": %zu, \"cpus\": \"%s\", \"kernel\": \"%s\", "
      "\"ceiling_isa\": \"%s\", \"reps\": %d, \"steps\": %d, \"step_s\": %.5f, "
      "\"params_per_s\": %.5g, \"GBps\": %.2f, \"ceiling_step_s\": %.5f, "
      "\"ceiling_params_per_s\": %.5g, \"ceiling_GBps\": %.2f, \"ceiling_nt_GBps\": %.2f, "
      "\"ceiling_plain_GBps\": %.2f, \"pct_of_ceiling\": %.1f, \"ours_rates\": %s, "
      "\"ours_windows_s\": %s, \"ceiling_nt_rates\": %s, \"ceiling_nt_windows_s\": %s, "
      "\"ceiling_plain_rates\": %s, \"ceiling_plain_windows_s\": %s}\n",
      n, threads, cpu_list.c_str(), picked.c_str(), isa, reps, steps, s_ours, n / s_ours,
      n * 28.0 / s_ours / 1e9, s_ceil, n / s_ceil, n * 28.0 / s_ceil / 1e9, n * 28.0 / s_nt / 1e9,
      n * 28.0 / s_plain / 1e9, 100.0 * s_ceil / s_ours, rates(t_ours, false).c_str(),
      rates(t_ours, true).c_str(), rates(t_nt, false).c_str(), rates(t_nt, true).c_str(),
      rates(t_plain, false).c_str(), rates(t_plain, true).c_str());
  return 0;
}
