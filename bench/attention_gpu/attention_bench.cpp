// Times causal attention forward and backward, the engine's flash kernels
// against cuDNN's fused flash attention, on one GPU: q, k, v as views into a
// fused [B, T, 3, H, D] buffer (GPT-2's layout), out and dout compact, the
// gradients into a fused buffer. Also reports how far cuDNN's results are
// from the native ones. With --deviceless, needs no GPU: it checks that
// cuDNN's engines support the forward and backward graphs for an H200.
//
// With --seconds S, each pass (forward, backward) of each implementation is
// timed over --reps windows of back-to-back calls, each window as many calls
// as fill S seconds (from a probe of about half a second), timed by CUDA
// events on the stream; the repetitions go round the implementations in
// turn. One line a window, for bench/lib/harness.py (bench/attention_gpu's
// report.py reads them):
//   sample {"impl": "native", "pass": "forward", "calls": N, "seconds": S}
// Without it, one window of --iters calls (a quick look, not a figure).
//
//   attention_bench [--shape B,T,H,D] [--dtype bf16|fp16] [--iters N] [--warmup N]
//                   [--seconds S] [--reps N]
//   attention_bench --deviceless [--shape B,T,H,D] [--dtype bf16|fp16] [--kv-heads N]
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/attention_cudnn.hpp"
#include "backend/cuda/cuda_ops_internal.hpp"
#include "backend/cuda/device.hpp"

namespace {

using tessera::cuda::AttnImpl;

struct Opts {
  int64_t B = 16, T = 1024, H = 12, D = 64, kv_heads = 0;
  bool fp16 = false, deviceless = false;
  int iters = 50, warmup = 5, reps = 1;
  double seconds = 0;  // > 0: windows of this long, not --iters calls
};

void usage() {
  std::printf(
      "attention_bench: causal attention fwd+bwd, the engine's kernels vs cuDNN, on one GPU\n"
      "  --shape B,T,H,D   default 16,1024,12,64 (GPT-2 124M at batch 16)\n"
      "  --dtype bf16|fp16 default bf16\n"
      "  --iters N         timed calls of each (default 50), after --warmup N (default 5)\n"
      "  --seconds S       instead: windows of S seconds of calls each (sized by a probe)\n"
      "  --reps N          windows of each pass and implementation (default 1), one\n"
      "                    'sample {json}' line each\n"
      "  --deviceless      no GPU: check cuDNN's support of the graphs for an H200 (cuDNN 9.8+;\n"
      "                    --kv-heads N: grouped-query attention with N key/value heads;\n"
      "                    without a driver, put the toolkit's stub on the library path as\n"
      "                    libcuda.so.1: ln -s $CUDA/lib64/stubs/libcuda.so DIR/libcuda.so.1)\n"
      "TESSERA_ATTENTION does not apply: both implementations are called by name.\n");
}

bool parse(int argc, char **argv, Opts *o) {
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto next = [&]() -> const char * { return i + 1 < argc ? argv[++i] : nullptr; };
    if (a == "--help" || a == "-h") {
      usage();
      std::exit(0);
    } else if (a == "--shape") {
      const char *v = next();
      long long b, t, h, d;
      if (!v || std::sscanf(v, "%lld,%lld,%lld,%lld", &b, &t, &h, &d) != 4) return false;
      o->B = b, o->T = t, o->H = h, o->D = d;
    } else if (a == "--dtype") {
      const char *v = next();
      if (!v || (std::strcmp(v, "bf16") && std::strcmp(v, "fp16"))) return false;
      o->fp16 = std::strcmp(v, "fp16") == 0;
    } else if (a == "--iters" || a == "--warmup" || a == "--reps") {
      const char *v = next();
      if (!v) return false;
      (a == "--iters" ? o->iters : a == "--warmup" ? o->warmup : o->reps) = std::atoi(v);
    } else if (a == "--seconds") {
      const char *v = next();
      if (!v) return false;
      o->seconds = std::atof(v);
    } else if (a == "--deviceless") {
      o->deviceless = true;
    } else if (a == "--kv-heads") {
      const char *v = next();
      if (!v) return false;
      o->kv_heads = std::atoll(v);
    } else {
      return false;
    }
  }
  return o->kv_heads >= 0 && (o->kv_heads == 0 || o->H % o->kv_heads == 0) && o->B > 0 &&
         o->T > 0 && o->H > 0 && o->D > 0 && o->iters > 0 && o->reps > 0 && o->seconds >= 0 &&
         std::isfinite(o->seconds);
}

#define CK(call)                                                       \
  do {                                                                 \
    cudaError_t e_ = (call);                                           \
    if (e_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                    \
    }                                                                  \
  } while (0)

struct DlView {
  int64_t shape[4], strides[4];
  DLTensor t{};
  DlView(void *data, DLDataType dt, const int64_t (&shp)[4], const int64_t *str, uint64_t off) {
    for (int i = 0; i < 4; i++) shape[i] = shp[i], strides[i] = str ? str[i] : 0;
    t.data = data, t.device = DLDevice{kDLCUDA, tessera::cuda::current_device()}, t.ndim = 4;
    t.dtype = dt, t.shape = shape, t.strides = str ? strides : nullptr, t.byte_offset = off;
  }
  DlView(void *data, const int64_t (&shp)[3]) {
    for (int i = 0; i < 3; i++) shape[i] = shp[i];
    t.data = data, t.device = DLDevice{kDLCUDA, tessera::cuda::current_device()}, t.ndim = 3;
    t.dtype = DLDataType{kDLFloat, 32, 1}, t.shape = shape;
  }
};

// Device copy of n elements as float (bf16/fp16 widened), for comparisons.
std::vector<float> fetch(const void *p, size_t n, bool fp16) {
  std::vector<uint16_t> raw(n);
  CK(cudaMemcpy(raw.data(), p, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) {
    if (fp16) {
      __half_raw h;
      h.x = raw[i];
      v[i] = __half2float(__half(h));
    } else {
      __nv_bfloat16_raw h;
      h.x = raw[i];
      v[i] = __bfloat162float(__nv_bfloat16(h));
    }
  }
  return v;
}

double rel(const std::vector<float> &a, const std::vector<float> &b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num) / (std::sqrt(den) + 1e-30);
}

}  // namespace

int main(int argc, char **argv) {
  Opts o;
  if (!parse(argc, argv, &o)) {
    usage();
    return 2;
  }
  using namespace tessera::cuda;
  const attn::Dt dt = o.fp16 ? attn::Dt::F16 : attn::Dt::BF16;
  std::string what;
  const bool have = attention_cudnn_available(&what);
  std::printf("cudnn: %s\n", what.c_str());
  std::printf("shape [B=%lld,T=%lld,H=%lld,D=%lld] %s, q/k/v views into fused qkv\n",
              static_cast<long long>(o.B), static_cast<long long>(o.T), static_cast<long long>(o.H),
              static_cast<long long>(o.D), o.fp16 ? "fp16" : "bf16");
  if (o.deviceless) {
    try {
      std::printf(
          "%s",
          attn::cudnn_deviceless_check(attn::Dims{o.B, o.T, o.H, o.D}, dt, o.kv_heads).c_str());
    } catch (const std::exception &e) {
      std::printf("deviceless check failed: %s\n", e.what());
      return 1;
    }
    return 0;
  }
  if (visible_devices() == 0) {
    std::printf("no GPU visible (try --deviceless)\n");
    return 77;
  }
  select_device(0);
  std::printf("device: %s\n", device_name().c_str());

  const int64_t n = o.B * o.T * o.H * o.D;
  const DLDataType dl = o.fp16 ? DLDataType{kDLFloat, 16, 1} : DLDataType{kDLBfloat, 16, 1};
  void *qkv = device_alloc(3 * n * 2), *out = device_alloc(n * 2), *dout = device_alloc(n * 2);
  void *dqkv = device_alloc(3 * n * 2), *lse = device_alloc(o.B * o.H * o.T * 4);
  {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<uint16_t> h(3 * n);
    for (auto &x : h) {
      const float f = nd(rng);
      x = o.fp16 ? __half_raw(__float2half_rn(f)).x : __nv_bfloat16_raw(__float2bfloat16_rn(f)).x;
    }
    CK(cudaMemcpy(qkv, h.data(), 3 * n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dout, h.data(), n * 2, cudaMemcpyHostToDevice));
  }
  const int64_t shp[4] = {o.B, o.T, o.H, o.D}, lshp[3] = {o.B, o.H, o.T};
  const int64_t fstr[4] = {o.T * 3 * o.H * o.D, 3 * o.H * o.D, o.D, 1};
  const uint64_t hd = static_cast<uint64_t>(o.H * o.D * 2);
  DlView q(qkv, dl, shp, fstr, 0), k(qkv, dl, shp, fstr, hd), v(qkv, dl, shp, fstr, 2 * hd);
  DlView dq(dqkv, dl, shp, fstr, 0), dk(dqkv, dl, shp, fstr, hd), dv(dqkv, dl, shp, fstr, 2 * hd);
  DlView vo(out, dl, shp, nullptr, 0), vdo(dout, dl, shp, nullptr, 0), vl(lse, lshp);
  const float scale = 1.0f / std::sqrt(static_cast<float>(o.D));

  cudaStream_t st = compute_stream();
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto fwd = [&](AttnImpl impl) {
    return attention_forward_with(impl, nullptr, &q.t, &k.t, &v.t, scale, &vo.t, &vl.t);
  };
  auto bwd = [&](AttnImpl impl) {
    return attention_backward_with(impl, nullptr, &q.t, &k.t, &v.t, &vo.t, &vdo.t, &vl.t, scale,
                                   &dq.t, &dk.t, &dv.t);
  };
  // The milliseconds of `calls` back-to-back calls, timed by CUDA events on
  // the stream (-1: a call declined or failed).
  auto window_ms = [&](auto &&call, long long calls) {
    CK(cudaEventRecord(e0, st));
    for (long long i = 0; i < calls; i++)
      if (call() != TSR_OK) return -1.0;
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return static_cast<double>(ms);
  };
  // Warm-up calls (they also build cuDNN's plans, once per shape: seconds),
  // then the calls of a window: --iters, or with --seconds as many as fill
  // it, from a probe doubled from --iters calls until it takes half a second
  // (15% to spare, as bench/lib/harness.py's plan: a window a little faster
  // than its probe still lasts --seconds). -1: a call declined or failed.
  auto prepare = [&](auto &&call) -> long long {
    for (int i = 0; i < o.warmup; i++)
      if (call() != TSR_OK) return -1;
    if (o.seconds <= 0) return o.iters;
    for (long long probe = o.iters;; probe *= 2) {
      const double ms = window_ms(call, probe);
      if (ms < 0) return -1;
      if (ms >= 500.0)
        return std::max(1LL, static_cast<long long>(std::ceil(o.seconds * 1e3 * 1.15 *
                                                              static_cast<double>(probe) / ms)));
    }
  };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
  };
  struct Timed {
    AttnImpl impl = AttnImpl::Native;
    const char *name = "";
    long long fwd_calls = 0, bwd_calls = 0;
    std::vector<double> fwd_ms, bwd_ms;  // per call, one a window
    bool ok = true;
  };
  std::vector<Timed> timed;
  int rc = 0;
  auto failed = [&](Timed &t, const char *pass) {
    std::printf("%-8s failed (%s %s)\n", t.name, pass,
                "declined or errored; run with TESSERA_ATTENTION unset and see the log");
    t.ok = false;
    rc = 1;
  };
  for (AttnImpl impl : {AttnImpl::Native, AttnImpl::Cudnn}) {
    const char *name = impl == AttnImpl::Native ? "native" : "cudnn";
    if (impl == AttnImpl::Cudnn && !have) {
      std::printf("%-8s (unavailable: %s)\n", name, what.c_str());
      continue;
    }
    Timed t;
    t.impl = impl, t.name = name;
    // Forward first: the backward reads its out and lse.
    t.fwd_calls = prepare([&] { return fwd(impl); });
    if (t.fwd_calls < 0) {
      failed(t, "forward");
    } else {
      t.bwd_calls = prepare([&] { return bwd(impl); });
      if (t.bwd_calls < 0) failed(t, "backward");
    }
    timed.push_back(t);
  }
  // The windows: each repetition goes round the implementations in turn,
  // a forward window then a backward one (which reads that forward's out).
  for (int r = 0; r < o.reps; r++) {
    for (Timed &t : timed) {
      if (!t.ok) continue;
      for (int pass = 0; pass < 2 && t.ok; pass++) {
        const long long calls = pass == 0 ? t.fwd_calls : t.bwd_calls;
        const double ms = pass == 0 ? window_ms([&] { return fwd(t.impl); }, calls)
                                    : window_ms([&] { return bwd(t.impl); }, calls);
        if (ms < 0) {
          failed(t, pass == 0 ? "forward" : "backward");
          break;
        }
        (pass == 0 ? t.fwd_ms : t.bwd_ms).push_back(ms / static_cast<double>(calls));
        std::printf(
            "sample {\"impl\": \"%s\", \"pass\": \"%s\", \"calls\": %lld, "
            "\"seconds\": %.6f}\n",
            t.name, pass == 0 ? "forward" : "backward", calls, ms * 1e-3);
      }
    }
  }
  // Causal: half the 4 B H T^2 D of full attention forward; backward 2.5x.
  const double f_flop = 2.0 * o.B * o.H * static_cast<double>(o.T) * o.T * o.D;
  std::printf("%-8s %10s %10s %12s %12s %12s   (%s)\n", "impl", "fwd ms", "bwd ms", "fwd+bwd ms",
              "fwd TFLOP/s", "bwd TFLOP/s", o.reps > 1 ? "median of the windows" : "one window");
  std::vector<float> ref_out, ref_dqkv;
  for (Timed &t : timed) {
    if (!t.ok) continue;
    const double f = median(t.fwd_ms), b = median(t.bwd_ms);
    std::printf("%-8s %10.3f %10.3f %12.3f %12.0f %12.0f\n", t.name, f, b, f + b, f_flop / f * 1e-9,
                2.5 * f_flop / b * 1e-9);
    // One more forward and backward for the results.
    fwd(t.impl);
    bwd(t.impl);
    synchronize();
    std::vector<float> ro = fetch(out, n, o.fp16), rg = fetch(dqkv, 3 * n, o.fp16);
    if (t.impl == AttnImpl::Native) {
      ref_out = std::move(ro), ref_dqkv = std::move(rg);
    } else if (!ref_out.empty()) {
      std::printf("cudnn vs native: out rel %.3e, dq/dk/dv rel %.3e\n", rel(ro, ref_out),
                  rel(rg, ref_dqkv));
    }
  }
  return rc;
}
