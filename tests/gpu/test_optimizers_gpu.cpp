// Optimizers "sgd", "adam" and "adamw" on CUDA: the torch trajectories of
// tests/data/optimizers.* replayed on the GPU (fp32, 1e-6 like the CPU
// test), bf16 / fp16 gradients and compute copies against the CPU step,
// segments with mixed decay flags (few, unsorted, with a gap, and more runs
// than one launch carries), refusals that must not poison the context, and
// a throughput printout for adam over 100M elements.
//
// The memory is cudaMalloc'ed here and the plugins loaded from the build
// tree like the unit tests do, so nothing depends on the engine's CUDA host.
#include <cuda_runtime.h>
#include <tessera/optimizer.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tessera/cpp/half.hpp>
#include <tessera/cpp/optimizer.hpp>
#include <tessera/cpp/plugin.hpp>
#include <vector>

#include "support/fixture.hpp"
#include "support/safetensors_read.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace gpu_test_optimizers_gpu {

namespace {

using tessera::test::Fixture;
namespace sdk = tessera::sdk;
namespace optim = tessera::sdk::optim;

#define CUDA_REQUIRE(call)                           \
  do {                                               \
    cudaError_t err_ = (call);                       \
    INFO(#call << ": " << cudaGetErrorString(err_)); \
    REQUIRE(err_ == cudaSuccess);                    \
  } while (0)

const DLDataType kF32{kDLFloat, 32, 1}, kBF16{kDLBfloat, 16, 1}, kF16{kDLFloat, 16, 1};

// Device memory of `count` T, freed at scope exit.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t count) : count_(count) {
    CUDA_REQUIRE(
        cudaMalloc(reinterpret_cast<void **>(&p_), std::max<size_t>(count, 1) * sizeof(T)));
    CUDA_REQUIRE(cudaMemset(p_, 0, std::max<size_t>(count, 1) * sizeof(T)));
    // Lands before any op: the ops' non-blocking stream does not wait for it.
    CUDA_REQUIRE(cudaDeviceSynchronize());
  }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray &) = delete;
  DeviceArray &operator=(const DeviceArray &) = delete;
  T *get() const { return p_; }
  void upload(const std::vector<T> &v, size_t at = 0) {
    REQUIRE(at + v.size() <= count_);
    CUDA_REQUIRE(cudaMemcpy(p_ + at, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    // Lands before any op: the ops' non-blocking stream does not wait for it.
    CUDA_REQUIRE(cudaDeviceSynchronize());
  }
  std::vector<T> download(size_t at, size_t n) const {
    std::vector<T> v(n);
    CUDA_REQUIRE(cudaMemcpy(v.data(), p_ + at, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }

 private:
  T *p_ = nullptr;
  size_t count_ = 0;
};

// One optimizer instance, destroyed at scope exit.
class Optimizer {
 public:
  Optimizer(Fixture &f, const std::string &name, const std::string &toml) : f_(f) {
    vt_ = f.vtable<tsr_optimizer_vtable>("optimizer", name);
    REQUIRE(vt_ != nullptr);
    INFO("plugin " << name << ": built with CUDA kernels?");
    REQUIRE((f.desc("optimizer", name).devices & TSR_DEVICE_CUDA) != 0);
    tsr_config *cfg = f.config("optimizer", name, toml);
    tsr_status s = vt_->create(f.host.table(), cfg, &self_);
    INFO(f.host.last_error());
    REQUIRE(s == TSR_OK);
  }
  ~Optimizer() {
    if (self_) vt_->destroy(self_);
  }
  Optimizer(const Optimizer &) = delete;
  Optimizer &operator=(const Optimizer &) = delete;
  uint32_t state_count() const { return vt_->state_count(self_); }

  struct Step {
    DLDevice device{kDLCPU, 0};
    float *params = nullptr;
    const void *grads = nullptr;
    DLDataType grads_dtype = kF32;
    float *const *state = nullptr;
    size_t n = 0;
    const std::vector<tsr_segment> *segments = nullptr;
    double lr = 0, grad_scale = 1;
    int64_t t = 1;
    void *stream = nullptr;
    void *compute = nullptr;
    DLDataType compute_dtype = kF32;
  };
  tsr_status step(const Step &s) {
    auto a = sdk::make<tsr_optimizer_step_args>();
    a.device = s.device;
    a.params = s.params;
    a.grads = static_cast<const float *>(s.grads);
    a.grads_dtype = s.grads_dtype;
    a.state = s.state;
    a.n = s.n;
    a.segments = s.segments->data();
    a.num_segments = s.segments->size();
    a.lr = s.lr;
    a.grad_scale = s.grad_scale;
    a.step = s.t;
    a.stream = s.stream;
    a.compute_params = s.compute;
    a.compute_dtype = s.compute_dtype;
    f_.host.clear_error();
    return vt_->step(self_, &a);
  }
  std::string error() const { return f_.host.last_error(); }

 private:
  Fixture &f_;
  const tsr_optimizer_vtable *vt_ = nullptr;
  void *self_ = nullptr;
};

nlohmann::json load_cases() {
  std::ifstream in(tessera::test::data_path("optimizers.json"));
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

std::string toml_from_case(const nlohmann::json &c) {
  std::string body;
  for (const auto &[k, v] : c.items())
    if (k != "optimizer") body += k + " = " + v.dump() + "\n";
  return body;
}

std::vector<float> to_float(const std::vector<double> &v, size_t begin, size_t n) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(v[begin + i]);
  return out;
}

uint32_t bits32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// The bound of tests/unit/test_optimizers.cpp (see there why): 1e-6
// relative for |want| >= 1, absolute below.
bool close(double got, double want) {
  return std::fabs(got - want) <= 1e-6 * std::max(std::fabs(want), 1.0);
}

// The same elements on CPU (host vectors) and on the GPU (device arrays at
// an element offset, to move the alignment), stepped side by side.
struct Twin {
  Optimizer cpu, gpu;
  size_t n, p_off, g_off;
  uint32_t nstate;
  std::vector<float> p;                // CPU master
  std::vector<std::vector<float>> st;  // CPU state
  std::vector<float *> st_ptr;
  DeviceArray<float> dp;  // GPU master, from p_off
  std::vector<std::unique_ptr<DeviceArray<float>>> dst;
  std::vector<float *> dst_ptr;
  DeviceArray<uint32_t> dg;  // GPU grads (any dtype), from g_off elements
  DeviceArray<float> dcopy;  // GPU compute copy (fp32 room), from p_off
  cudaStream_t stream = nullptr;

  Twin(Fixture &f, const std::string &name, const std::string &toml, const std::vector<float> &p0,
       size_t p_off_, size_t g_off_)
      : cpu(f, name, toml),
        gpu(f, name, toml),
        n(p0.size()),
        p_off(p_off_),
        g_off(g_off_),
        nstate(cpu.state_count()),
        p(p0),
        dp(p0.size() + p_off_),
        dg(p0.size() + g_off_),
        dcopy(p0.size() + p_off_) {
    REQUIRE(gpu.state_count() == nstate);
    st.assign(nstate, std::vector<float>(n, 0.0f));
    for (auto &s : st) st_ptr.push_back(s.data());
    for (uint32_t i = 0; i < nstate; ++i) {
      dst.push_back(std::make_unique<DeviceArray<float>>(n + p_off));
      dst_ptr.push_back(dst.back()->get() + p_off);
    }
    dp.upload(p0, p_off);
    CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~Twin() { cudaStreamDestroy(stream); }

  // One step of both: `g` are fp32 values exactly representable in
  // `gdt`; the GPU reads them in gdt and writes a compute copy in cdt (or
  // none), the CPU reads the same values in fp32.
  void step(const std::vector<float> &g, DLDataType gdt, const std::vector<tsr_segment> &segs,
            double lr, int64_t t, double scale, bool copy, DLDataType cdt) {
    Optimizer::Step c;
    c.params = p.data();
    c.grads = g.data();
    c.state = st_ptr.empty() ? nullptr : st_ptr.data();
    c.n = n;
    c.segments = &segs;
    c.lr = lr;
    c.grad_scale = scale;
    c.t = t;
    {
      INFO(cpu.error());
      REQUIRE(cpu.step(c) == TSR_OK);
    }
    // Grads in gdt, uploaded at g_off elements of that dtype.
    const bool wide = gdt.bits == 32;
    std::vector<uint16_t> h(n);
    if (!wide)
      for (size_t i = 0; i < n; ++i)
        h[i] = gdt.code == kDLBfloat ? tessera::sdk::float_to_bf16(g[i])
                                     : tessera::sdk::float_to_f16(g[i]);
    char *gbase = reinterpret_cast<char *>(dg.get()) + g_off * (wide ? 4 : 2);
    CUDA_REQUIRE(cudaMemcpy(gbase, wide ? static_cast<const void *>(g.data()) : h.data(),
                            n * (wide ? 4 : 2), cudaMemcpyHostToDevice));
    // Lands before any op: the ops' non-blocking stream does not wait for it.
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    Optimizer::Step d = c;
    d.device = DLDevice{kDLCUDA, 0};
    CUDA_REQUIRE(cudaGetDevice(&d.device.device_id));
    d.params = dp.get() + p_off;
    d.grads = gbase;
    d.grads_dtype = gdt;
    d.state = dst_ptr.empty() ? nullptr : dst_ptr.data();
    d.stream = stream;
    if (copy) {
      d.compute = reinterpret_cast<char *>(dcopy.get()) + p_off * (cdt.bits / 8);
      d.compute_dtype = cdt;
    }
    {
      INFO(gpu.error());
      REQUIRE(gpu.step(d) == TSR_OK);
    }
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
  }
  std::vector<float> gpu_params() const { return dp.download(p_off, n); }
  std::vector<float> gpu_state(uint32_t i) const { return dst[i]->download(p_off, n); }
  std::vector<uint16_t> gpu_copy16() const {
    std::vector<uint16_t> v(n);
    CUDA_REQUIRE(cudaMemcpy(v.data(), reinterpret_cast<const char *>(dcopy.get()) + p_off * 2,
                            n * 2, cudaMemcpyDeviceToHost));
    return v;
  }
};

// GPU against CPU after a step: every element within 1e-6 (the
// requirement), and a count of bit-identical ones for the log (the kernel
// is built to be bit-identical; a difference there is worth a look even
// when inside the bound).
struct Agreement {
  size_t same_bits = 0, total = 0;
  double worst = 0;
};
void require_agree(const std::string &what, const std::vector<float> &gpu,
                   const std::vector<float> &cpu, Agreement &a) {
  REQUIRE(gpu.size() == cpu.size());
  for (size_t i = 0; i < gpu.size(); ++i) {
    ++a.total;
    if (bits32(gpu[i]) == bits32(cpu[i]) || (std::isnan(gpu[i]) && std::isnan(cpu[i]))) {
      ++a.same_bits;
      continue;
    }
    const double d = std::fabs(double(gpu[i]) - cpu[i]) / std::max(std::fabs(double(cpu[i])), 1.0);
    a.worst = std::max(a.worst, d);
    INFO(what << " element " << i << ": GPU " << gpu[i] << " (bits 0x" << std::hex << bits32(gpu[i])
              << "), CPU " << std::dec << cpu[i] << " (bits 0x" << std::hex << bits32(cpu[i])
              << ")");
    REQUIRE(close(gpu[i], cpu[i]));
  }
}
void report(const std::string &what, const Agreement &a) {
  std::printf("  %-48s GPU == CPU bit for bit: %zu / %zu (worst relative difference %.3g)\n",
              what.c_str(), a.same_bits, a.total, a.worst);
}

// Deterministic pseudo-random values in [-1, 1).
struct Lcg {
  uint64_t s;
  float next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<double>(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
};

}  // namespace

TEST_CASE("optimizers on CUDA match torch.optim for 8 steps in fp32", "[gpu][optimizer]") {
  Fixture f;
  auto ref = tessera::test::read_safetensors(tessera::test::data_path("optimizers.safetensors"));
  nlohmann::json cases = load_cases();
  REQUIRE(cases.size() == 5);
  // Element offsets of (params and state, grads): all aligned (vector
  // path, a 1-element tail), all shifted (vector path with a 3-element
  // head), and shifted apart (the scalar fallback).
  const size_t layouts[3][2] = {{0, 0}, {1, 1}, {1, 0}};
  for (const auto &[name, c] : cases.items()) {
    for (const auto &lay : layouts) {
      const auto &p0 = ref.at(name + ".p0");
      const auto &grads = ref.at(name + ".grads");
      const auto &want = ref.at(name + ".params");
      const size_t n = p0.data.size();
      const double lr = c.at("lr").get<double>();
      const std::string what =
          name + " (offsets " + std::to_string(lay[0]) + ", " + std::to_string(lay[1]) + ")";
      Twin tw(f, c.at("optimizer").get<std::string>(), toml_from_case(c), to_float(p0.data, 0, n),
              lay[0], lay[1]);
      std::vector<tsr_segment> all = {{0, n, 1}};
      Agreement agree;
      for (int64_t t = 1; t <= 8; ++t) {
        std::vector<float> g = to_float(grads.data, (t - 1) * n, n);
        tw.step(g, kF32, all, lr, t, 1.0, false, kF32);
        std::vector<float> got = tw.gpu_params();
        for (size_t i = 0; i < n; ++i) {
          const double w = want.data[(t - 1) * n + i];
          INFO(what << " step " << t << " element " << i << ": GPU " << got[i] << ", torch " << w
                    << ", CPU " << tw.p[i]);
          REQUIRE(close(got[i], w));
        }
        require_agree(what + " step " + std::to_string(t), got, tw.p, agree);
        for (uint32_t s = 0; s < tw.nstate; ++s)
          require_agree(what + " step " + std::to_string(t) + " state " + std::to_string(s),
                        tw.gpu_state(s), tw.st[s], agree);
      }
      report(what, agree);
    }
  }
}

TEST_CASE("optimizers on CUDA: 16-bit gradients and compute copies", "[gpu][optimizer]") {
  // Gradients rounded to bf16 (fp16) and read as such on the GPU must give
  // the CPU trajectory on the same rounded values; the compute copy is the
  // fp32 master rounded to nearest even, exactly.
  Fixture f;
  auto ref = tessera::test::read_safetensors(tessera::test::data_path("optimizers.safetensors"));
  nlohmann::json cases = load_cases();
  for (const DLDataType dt : {kBF16, kF16}) {
    const bool bf = dt.code == kDLBfloat;
    for (const auto &[name, c] : cases.items()) {
      const auto &p0 = ref.at(name + ".p0");
      const auto &grads = ref.at(name + ".grads");
      const size_t n = p0.data.size();
      const double lr = c.at("lr").get<double>();
      const std::string what = name + (bf ? " bf16" : " fp16");
      for (const size_t off : {size_t(0), size_t(3)}) {
        Twin tw(f, c.at("optimizer").get<std::string>(), toml_from_case(c), to_float(p0.data, 0, n),
                off, off);
        std::vector<tsr_segment> segs = {{0, 10, 1}, {10, n - 10, 0}};
        Agreement agree;
        for (int64_t t = 1; t <= 8; ++t) {
          std::vector<float> g = to_float(grads.data, (t - 1) * n, n);
          for (float &x : g)
            x = bf ? tessera::sdk::bf16_to_float(tessera::sdk::float_to_bf16(x))
                   : tessera::sdk::f16_to_float(tessera::sdk::float_to_f16(x));
          tw.step(g, dt, segs, lr, t, 0.75, true, dt);
          std::vector<float> got = tw.gpu_params();
          require_agree(what + " step " + std::to_string(t), got, tw.p, agree);
          std::vector<uint16_t> copy = tw.gpu_copy16();
          for (size_t i = 0; i < n; ++i) {
            const uint16_t want =
                bf ? tessera::sdk::float_to_bf16(got[i]) : tessera::sdk::float_to_f16(got[i]);
            INFO(what << " step " << t << " element " << i << ": master " << got[i] << ", copy 0x"
                      << std::hex << copy[i] << ", rounded 0x" << want);
            REQUIRE(copy[i] == want);
          }
        }
        report(what + " (offset " + std::to_string(off) + ")", agree);
      }
    }
  }
}

TEST_CASE("optimizers on CUDA: segments with mixed decay flags", "[gpu][optimizer]") {
  Fixture f;
  struct Config {
    const char *plugin, *toml;
    double lr;
  };
  const Config configs[] = {
      {"sgd", "momentum = 0.9\nnesterov = true\nweight_decay = 0.1", 0.05},
      {"sgd", "momentum = 0.8\ndampening = 0.3\nweight_decay = 0.2", 0.05},
      {"sgd", "weight_decay = 0.3", 0.1},
      {"adam", "weight_decay = 0.1", 1e-2},
      {"adamw", "weight_decay = 0.1", 1e-2},
  };
  struct Layout {
    const char *name;
    size_t n;
    std::vector<tsr_segment> segs;
  };
  std::vector<Layout> layouts;
  // Three segments, decay / none / decay, with odd boundaries.
  layouts.push_back({"3 segments", 1003, {{0, 301, 1}, {301, 5, 0}, {306, 697, 1}}});
  // The same, unsorted, with a gap [301, 306) the step must leave alone
  // (as the CPU step does: no segment, no update).
  layouts.push_back({"unsorted with a gap", 1003, {{306, 697, 1}, {0, 301, 0}}});
  // Many one-to-seven element segments alternating the flag: more runs than
  // one launch carries (3072), so the step takes several.
  {
    Layout many{"7000 short segments", 0, {}};
    size_t at = 0;
    for (int k = 0; k < 7000; ++k) {
      const size_t len = 1 + static_cast<size_t>((k * 5 + k / 3) % 7);
      many.segs.push_back({at, len, k % 2});
      at += len;
    }
    many.n = at;
    layouts.push_back(std::move(many));
  }
  for (const Config &cfg : configs) {
    for (const Layout &lay : layouts) {
      const std::string what = std::string(cfg.plugin) + " {" + cfg.toml + "} " + lay.name;
      Lcg rng{12345};
      std::vector<float> p0(lay.n);
      for (float &x : p0) x = rng.next() * 2.0f;
      for (const size_t off : {size_t(0), size_t(1)}) {
        Twin tw(f, cfg.plugin, cfg.toml, p0, off, off);
        Agreement agree;
        for (int64_t t = 1; t <= 4; ++t) {
          std::vector<float> g(lay.n);
          for (float &x : g) x = rng.next();
          tw.step(g, kF32, lay.segs, cfg.lr, t, 1.0, true, kF32);
          std::vector<float> got = tw.gpu_params();
          require_agree(what + " step " + std::to_string(t), got, tw.p, agree);
          // The fp32 compute copy is the master, except in the gap, where
          // nothing is written (the copy buffer starts zeroed).
          std::vector<float> copy = tw.dcopy.download(off, lay.n);
          for (size_t i = 0; i < lay.n; ++i) {
            const bool gap = lay.segs.size() == 2 && i >= 301 && i < 306;
            INFO(what << " step " << t << " element " << i << (gap ? " (gap)" : ""));
            REQUIRE(bits32(copy[i]) == (gap ? 0u : bits32(got[i])));
            if (gap) REQUIRE(bits32(got[i]) == bits32(p0[i]));
          }
        }
        report(what + " (offset " + std::to_string(off) + ")", agree);
      }
    }
  }
}

TEST_CASE("optimizers on CUDA refuse memory a kernel cannot reach", "[gpu][optimizer]") {
  // A host pointer would fault inside the kernel and poison the context
  // for every later call; the step must refuse it up front, naming it, and
  // the next valid step must still work.
  Fixture f;
  Optimizer opt(f, "adam", "");
  const size_t n = 64;
  DeviceArray<float> p(n), g(n), m(n), v(n);
  std::vector<float> host(n, 1.0f);
  float *state[2] = {m.get(), v.get()};
  std::vector<tsr_segment> all = {{0, n, 1}};
  Optimizer::Step s;
  s.device = DLDevice{kDLCUDA, 0};
  CUDA_REQUIRE(cudaGetDevice(&s.device.device_id));
  s.params = p.get();
  s.grads = host.data();  // host memory
  s.state = state;
  s.n = n;
  s.segments = &all;
  s.lr = 1e-3;
  CHECK(opt.step(s) == TSR_ERR_INVALID);
  CHECK_THAT(opt.error(), Catch::Contains("grads") && Catch::Contains("CUDA kernel can reach"));
  s.grads = g.get();
  s.device.device_id = 1000;
  CHECK(opt.step(s) == TSR_ERR_INVALID);
  CHECK_THAT(opt.error(), Catch::Contains("CUDA device 1000"));
  CUDA_REQUIRE(cudaGetDevice(&s.device.device_id));
  double f64[1];
  s.compute = f64;
  s.compute_dtype = DLDataType{kDLFloat, 64, 1};
  CHECK(opt.step(s) == TSR_ERR_UNSUPPORTED);
  CHECK_THAT(opt.error(), Catch::Contains("compute copy dtype"));
  s.compute = nullptr;
  // NULL stream: the host's compute stream (or the default stream).
  INFO(opt.error());
  REQUIRE(opt.step(s) == TSR_OK);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  CUDA_REQUIRE(cudaGetLastError());
}

TEST_CASE("adam on CUDA: throughput over 100M elements", "[gpu][optimizer][bench]") {
  // Not an assertion: the figure to set against the H200's ~4.8 TB/s.
  Fixture f;
  const size_t n = 100'000'000;
  DeviceArray<float> p(n), m(n), v(n), g32(n);
  DeviceArray<uint16_t> g16(n), copy(n);
  float *state[2] = {m.get(), v.get()};
  std::vector<tsr_segment> segs;
  // ~2000 tensors' worth of runs: a realistic decay table.
  for (size_t at = 0, k = 0; at < n; ++k) {
    const size_t len = std::min(n - at, k % 2 ? size_t(4096) : size_t(95'000));
    segs.push_back({at, len, static_cast<int32_t>(k % 2 == 0)});
    at += len;
  }
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t t0, t1;
  CUDA_REQUIRE(cudaEventCreate(&t0));
  CUDA_REQUIRE(cudaEventCreate(&t1));

  // Reference: a device-to-device copy of 400 MB (read + write).
  const int iters = 10;
  CUDA_REQUIRE(cudaMemcpyAsync(v.get(), m.get(), n * 4, cudaMemcpyDeviceToDevice, stream));
  CUDA_REQUIRE(cudaEventRecord(t0, stream));
  for (int i = 0; i < iters; ++i)
    CUDA_REQUIRE(cudaMemcpyAsync(v.get(), m.get(), n * 4, cudaMemcpyDeviceToDevice, stream));
  CUDA_REQUIRE(cudaEventRecord(t1, stream));
  CUDA_REQUIRE(cudaEventSynchronize(t1));
  float ms = 0;
  CUDA_REQUIRE(cudaEventElapsedTime(&ms, t0, t1));
  std::printf("  cudaMemcpy D2D reference: %.0f GB/s\n", 2.0 * n * 4 * iters / (ms * 1e-3) / 1e9);

  struct Variant {
    const char *name;
    DLDataType gdt;
    bool copy;
    double bytes_per_elem;  // p, m, v read + written, grads read, copy written
  };
  const Variant variants[] = {{"fp32 grads, no copy", kF32, false, 24 + 4},
                              {"bf16 grads, bf16 copy", kBF16, true, 24 + 2 + 2}};
  for (const Variant &va : variants) {
    Optimizer opt(f, "adamw", "");
    Optimizer::Step s;
    s.device = DLDevice{kDLCUDA, 0};
    CUDA_REQUIRE(cudaGetDevice(&s.device.device_id));
    s.params = p.get();
    s.grads = va.gdt.bits == 32 ? static_cast<const void *>(g32.get()) : g16.get();
    s.grads_dtype = va.gdt;
    s.state = state;
    s.n = n;
    s.segments = &segs;
    s.lr = 1e-3;
    s.stream = stream;
    s.compute = va.copy ? copy.get() : nullptr;
    s.compute_dtype = va.gdt;
    for (int64_t t = 1; t <= 2; ++t) {  // warm-up
      s.t = t;
      INFO(opt.error());
      REQUIRE(opt.step(s) == TSR_OK);
    }
    CUDA_REQUIRE(cudaEventRecord(t0, stream));
    for (int i = 0; i < iters; ++i) {
      s.t = 3 + i;
      REQUIRE(opt.step(s) == TSR_OK);
    }
    CUDA_REQUIRE(cudaEventRecord(t1, stream));
    CUDA_REQUIRE(cudaEventSynchronize(t1));
    CUDA_REQUIRE(cudaEventElapsedTime(&ms, t0, t1));
    const double sec = ms * 1e-3 / iters;
    std::printf(
        "  adamw, %zu elements, %zu segments, %s: %.3f ms/step, %.0f GB/s "
        "(%.0f%% of 4.8 TB/s)\n",
        n, segs.size(), va.name, sec * 1e3, va.bytes_per_elem * n / sec / 1e9,
        100.0 * va.bytes_per_elem * n / sec / 4.8e12);
  }
  CUDA_REQUIRE(cudaGetLastError());
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaStreamDestroy(stream);
}

}  // namespace gpu_test_optimizers_gpu
