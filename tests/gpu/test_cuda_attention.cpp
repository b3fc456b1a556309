// CUDA causal attention against the CPU attention on the same inputs: q, k, v
// as strided views into one fused [B, T, 3, H, D] buffer (as GPT-2 lays them
// out), dq/dk/dv likewise into a fused gradient buffer. bf16/fp16 inputs are
// rounded once on the host and the CPU reference runs on the rounded values,
// so the comparison measures the kernels' error alone. Plus a timing printout
// for the GPT-2 124M shape (not an assertion).
#include <cuda_runtime.h>
#include <tessera/ops.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops_internal.hpp"
#include "backend/cuda/cuda_ops_internal.hpp"
#include "backend/cuda/device.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace gpu_test_cuda_attention {

namespace {

enum class Ty { F32, BF16, F16 };

const char *ty_name(Ty t) {
  return t == Ty::F32 ? "f32" : t == Ty::BF16 ? "bf16" : "f16";
}
size_t ty_size(Ty t) {
  return t == Ty::F32 ? 4 : 2;
}
DLDataType ty_dl(Ty t) {
  return t == Ty::F32    ? DLDataType{kDLFloat, 32, 1}
         : t == Ty::BF16 ? DLDataType{kDLBfloat, 16, 1}
                         : DLDataType{kDLFloat, 16, 1};
}

// Host conversions, round to nearest even (finite values only here).
uint16_t f2bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float bf2f(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f2h(float f) {
  // Through the normal range only (|x| in [6e-5, 65504]); smaller to zero-ish
  // via the subnormal path below.
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const float a = std::fabs(f);
  if (a < 6.103515625e-05f) {  // subnormal half: multiples of 2^-24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 16777216.0f)));
  }
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  // half: 1.f * 2^(e-1), 10 mantissa bits
  uint32_t mant = static_cast<uint32_t>(std::nearbyint((m * 2.0f - 1.0f) * 1024.0f));
  int ex = e - 1 + 15;
  if (mant == 1024) mant = 0, ex++;
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(ex) << 10) | mant);
}
float h2f(uint16_t h) {
  const int ex = (h >> 10) & 0x1f, mant = h & 0x3ff;
  const float s = (h & 0x8000) ? -1.0f : 1.0f;
  if (ex == 0) return s * std::ldexp(static_cast<float>(mant), -24);
  return s * std::ldexp(1.0f + mant / 1024.0f, ex - 15);
}
float round_to(Ty t, float x) {
  return t == Ty::F32 ? x : t == Ty::BF16 ? bf2f(f2bf(x)) : h2f(f2h(x));
}

std::vector<uint8_t> encode(Ty t, const std::vector<float> &x) {
  std::vector<uint8_t> out(x.size() * ty_size(t));
  for (size_t i = 0; i < x.size(); i++) {
    if (t == Ty::F32) {
      std::memcpy(&out[i * 4], &x[i], 4);
    } else {
      const uint16_t h = t == Ty::BF16 ? f2bf(x[i]) : f2h(x[i]);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}
std::vector<float> decode(Ty t, const std::vector<uint8_t> &b) {
  std::vector<float> out(b.size() / ty_size(t));
  for (size_t i = 0; i < out.size(); i++) {
    if (t == Ty::F32) {
      std::memcpy(&out[i], &b[i * 4], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &b[i * 2], 2);
      out[i] = t == Ty::BF16 ? bf2f(h) : h2f(h);
    }
  }
  return out;
}

// A device buffer freed at scope exit.
struct Dev {
  void *p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t n) : bytes(n) { TSR_CUDA_CHECK(cudaMalloc(&p, n ? n : 1)); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev &) = delete;
  Dev &operator=(const Dev &) = delete;
  void upload(const std::vector<uint8_t> &h) {
    REQUIRE(h.size() == bytes);
    TSR_CUDA_CHECK(cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice));
    // Pageable copies may return before the DMA lands; the ops' stream
    // does not wait for the legacy stream.
    TSR_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> h(bytes);
    TSR_CUDA_CHECK(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost));
    return h;
  }
};

// A DLTensor header with its own shape/stride storage.
struct Tensor {
  int64_t shape[4];
  int64_t strides[4];
  DLTensor t{};
  Tensor(void *data, DLDevice dev, DLDataType dt, int ndim, const int64_t *shp, const int64_t *str,
         uint64_t byte_offset) {
    for (int i = 0; i < ndim; i++) shape[i] = shp[i], strides[i] = str ? str[i] : 0;
    t.data = data;
    t.device = dev;
    t.ndim = ndim;
    t.dtype = dt;
    t.shape = shape;
    t.strides = str ? strides : nullptr;
    t.byte_offset = byte_offset;
  }
  DLTensor *dl() { return &t; }
};

struct Shape {
  int64_t B, T, H, D;
  int64_t n() const { return B * T * H * D; }
};

// Views q, k, v (which = 0, 1, 2) into a fused [B, T, 3, H, D] buffer.
Tensor fused_view(void *base, DLDevice dev, Ty ty, const Shape &s, int which) {
  const int64_t shp[4] = {s.B, s.T, s.H, s.D};
  const int64_t str[4] = {s.T * 3 * s.H * s.D, 3 * s.H * s.D, s.D, 1};
  return Tensor(base, dev, ty_dl(ty), 4, shp, str,
                static_cast<uint64_t>(which * s.H * s.D) * ty_size(ty));
}
Tensor compact(void *base, DLDevice dev, DLDataType dt, const Shape &s) {
  const int64_t shp[4] = {s.B, s.T, s.H, s.D};
  return Tensor(base, dev, dt, 4, shp, nullptr, 0);
}
Tensor lse_tensor(void *base, DLDevice dev, const Shape &s) {
  const int64_t shp[3] = {s.B, s.H, s.T};
  return Tensor(base, dev, DLDataType{kDLFloat, 32, 1}, 3, shp, nullptr, 0);
}

// ||a - b|| / ||b||, and where the largest element difference is.
struct Cmp {
  double rel;
  double max_abs;
  size_t at;
  double ref_rms;  // root-mean-square of the reference
};
Cmp compare(const std::vector<float> &a, const std::vector<float> &b) {
  double num = 0, den = 0, mx = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); i++) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
    if (!(std::fabs(d) <= mx)) mx = std::fabs(d), at = i;  // NaN lands here too
  }
  return Cmp{std::sqrt(num) / (std::sqrt(den) + 1e-30), mx, at,
             std::sqrt(den / static_cast<double>(a.size() ? a.size() : 1))};
}

// Fused [B, T, 3, H, D] element index `i` -> "b,t,which,h,d", for messages.
std::string where_fused(size_t i, const Shape &s) {
  const int64_t d = i % s.D, h = (i / s.D) % s.H, w = (i / (s.D * s.H)) % 3,
                t = (i / (s.D * s.H * 3)) % s.T, b = i / (s.D * s.H * 3 * s.T);
  return "[b=" + std::to_string(b) + ",t=" + std::to_string(t) + "," + "qkv"[w] +
         ",h=" + std::to_string(h) + ",d=" + std::to_string(d) + "]";
}

void check_close(const char *what, const Cmp &c, double tol, const std::string &info) {
  INFO(what << ": ||gpu-cpu||/||cpu|| = " << c.rel << ", max |diff| = " << c.max_abs << " at "
            << info);
  std::printf("  %-4s rel %.3e  max|diff| %.3e\n", what, c.rel, c.max_abs);
  // A reference that is zero up to rounding (T = 1: dq and dk vanish
  // analytically) makes the relative error meaningless: then absolute.
  if (c.ref_rms < 1e-6) {
    CHECK(c.max_abs <= 1e-4);
  } else {
    CHECK(c.rel <= tol);
  }
}

// Runs forward and backward on both sides and compares out, lse, dq, dk, dv.
void run_case(Ty ty, Shape s, uint32_t seed) {
  std::printf("attention %s B=%lld T=%lld H=%lld D=%lld\n", ty_name(ty),
              static_cast<long long>(s.B), static_cast<long long>(s.T), static_cast<long long>(s.H),
              static_cast<long long>(s.D));
  const double tol = ty == Ty::F32 ? 1e-5 : 2e-2;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> qkv(static_cast<size_t>(3 * s.n())), dout(static_cast<size_t>(s.n()));
  for (float &x : qkv) x = round_to(ty, nd(rng));
  for (float &x : dout) x = round_to(ty, nd(rng));

  // CPU reference (float32).
  const DLDevice cpu{kDLCPU, 0};
  std::vector<float> c_out(s.n()), c_lse(s.B * s.H * s.T), c_dqkv(3 * s.n());
  {
    Tensor q = fused_view(qkv.data(), cpu, Ty::F32, s, 0),
           k = fused_view(qkv.data(), cpu, Ty::F32, s, 1),
           v = fused_view(qkv.data(), cpu, Ty::F32, s, 2);
    Tensor o = compact(c_out.data(), cpu, ty_dl(Ty::F32), s), l = lse_tensor(c_lse.data(), cpu, s);
    REQUIRE(tessera::cpu::attention_forward(nullptr, q.dl(), k.dl(), v.dl(), scale, o.dl(),
                                            l.dl()) == TSR_OK);
    Tensor dq = fused_view(c_dqkv.data(), cpu, Ty::F32, s, 0),
           dk = fused_view(c_dqkv.data(), cpu, Ty::F32, s, 1),
           dv = fused_view(c_dqkv.data(), cpu, Ty::F32, s, 2);
    Tensor go = compact(dout.data(), cpu, ty_dl(Ty::F32), s);
    REQUIRE(tessera::cpu::attention_backward(nullptr, q.dl(), k.dl(), v.dl(), o.dl(), go.dl(),
                                             l.dl(), scale, dq.dl(), dk.dl(), dv.dl()) == TSR_OK);
  }

  // GPU.
  const DLDevice gpu{kDLCUDA, tessera::cuda::current_device()};
  const size_t esz = ty_size(ty);
  Dev d_qkv(3 * s.n() * esz), d_out(s.n() * esz), d_lse(s.B * s.H * s.T * 4), d_dout(s.n() * esz),
      d_dqkv(3 * s.n() * esz);
  d_qkv.upload(encode(ty, qkv));
  d_dout.upload(encode(ty, dout));
  // Poison the outputs so an unwritten element shows up.
  TSR_CUDA_CHECK(cudaMemset(d_out.p, 0xff, d_out.bytes));
  TSR_CUDA_CHECK(cudaMemset(d_dqkv.p, 0xff, d_dqkv.bytes));
  TSR_CUDA_CHECK(cudaMemset(d_lse.p, 0xff, d_lse.bytes));
  TSR_CUDA_CHECK(cudaDeviceSynchronize());  // the poison lands before the ops run
  Tensor q = fused_view(d_qkv.p, gpu, ty, s, 0), k = fused_view(d_qkv.p, gpu, ty, s, 1),
         v = fused_view(d_qkv.p, gpu, ty, s, 2);
  Tensor o = compact(d_out.p, gpu, ty_dl(ty), s), l = lse_tensor(d_lse.p, gpu, s);
  Tensor go = compact(d_dout.p, gpu, ty_dl(ty), s);
  Tensor dq = fused_view(d_dqkv.p, gpu, ty, s, 0), dk = fused_view(d_dqkv.p, gpu, ty, s, 1),
         dv = fused_view(d_dqkv.p, gpu, ty, s, 2);
  REQUIRE(tessera::cuda::attention_forward(nullptr, q.dl(), k.dl(), v.dl(), scale, o.dl(),
                                           l.dl()) == TSR_OK);
  REQUIRE(tessera::cuda::attention_backward(nullptr, q.dl(), k.dl(), v.dl(), o.dl(), go.dl(),
                                            l.dl(), scale, dq.dl(), dk.dl(), dv.dl()) == TSR_OK);
  tessera::cuda::synchronize();
  const std::vector<float> g_out = decode(ty, d_out.download());
  const std::vector<float> g_dqkv = decode(ty, d_dqkv.download());
  std::vector<float> g_lse(c_lse.size());
  TSR_CUDA_CHECK(cudaMemcpy(g_lse.data(), d_lse.p, d_lse.bytes, cudaMemcpyDeviceToHost));

  const Cmp co = compare(g_out, c_out);
  check_close("out", co, tol, "flat " + std::to_string(co.at));
  // lse is fp32 on both sides; in bf16/fp16 the scores come from rounded
  // products, so only the dtype's tolerance applies.
  const Cmp cl = compare(g_lse, c_lse);
  check_close("lse", cl, ty == Ty::F32 ? 1e-5 : 5e-3, "flat [b,h,t] " + std::to_string(cl.at));
  // dq, dk, dv separately: split the fused buffers.
  for (int w = 0; w < 3; w++) {
    std::vector<float> a, b;
    a.reserve(s.n()), b.reserve(s.n());
    for (size_t i = 0; i < g_dqkv.size(); i++) {
      if (static_cast<int>((i / (s.D * s.H)) % 3) != w) continue;
      a.push_back(g_dqkv[i]);
      b.push_back(c_dqkv[i]);
    }
    const Cmp c = compare(a, b);
    // Map the split index back to the fused buffer for the message.
    const size_t row = c.at / (s.H * s.D), inrow = c.at % (s.H * s.D);
    const size_t fused = row * 3 * s.H * s.D + w * s.H * s.D + inrow;
    const char *names[3] = {"dq", "dk", "dv"};
    check_close(names[w], c, tol, where_fused(fused, s));
  }
}

}  // namespace

TEST_CASE("cuda attention: fp32 matches the CPU attention", "[gpu][attention]") {
  run_case(Ty::F32, {2, 77, 3, 64}, 1);   // T not a multiple of any tile
  run_case(Ty::F32, {1, 130, 2, 32}, 2);  // D = 32
  run_case(Ty::F32, {1, 96, 2, 128}, 3);  // D = 128
  run_case(Ty::F32, {2, 33, 2, 40}, 4);   // odd D
}

TEST_CASE("cuda attention: bf16 and fp16 match the CPU attention", "[gpu][attention]") {
  for (Ty ty : {Ty::BF16, Ty::F16}) {
    run_case(ty, {2, 1024, 12, 64}, 10);  // GPT-2's heads, fused qkv views
    run_case(ty, {2, 77, 3, 64}, 11);
    run_case(ty, {1, 200, 2, 32}, 12);
    run_case(ty, {1, 130, 2, 128}, 13);
    run_case(ty, {2, 65, 2, 40}, 14);  // D not a multiple of 8: element loads
    run_case(ty, {1, 1, 1, 64}, 15);   // one row
  }
}

TEST_CASE("cuda attention: argument errors name the argument", "[gpu][attention]") {
  const Shape s{1, 8, 1, 64};
  Dev buf(3 * s.n() * 2), out(s.n() * 2), lse(s.T * 4);
  const DLDevice gpu{kDLCUDA, tessera::cuda::current_device()};
  Tensor q = fused_view(buf.p, gpu, Ty::BF16, s, 0), k = fused_view(buf.p, gpu, Ty::BF16, s, 1),
         v = fused_view(buf.p, gpu, Ty::BF16, s, 2);
  Tensor o = compact(out.p, gpu, ty_dl(Ty::BF16), s), l = lse_tensor(lse.p, gpu, s);
  // Wrong dtype for v.
  Tensor vf = fused_view(buf.p, gpu, Ty::F16, s, 2);
  CHECK(tessera::cuda::attention_forward(nullptr, q.dl(), k.dl(), vf.dl(), 0.125f, o.dl(),
                                         l.dl()) == TSR_ERR_INVALID);
  // Host memory.
  Tensor oh = compact(out.p, DLDevice{kDLCPU, 0}, ty_dl(Ty::BF16), s);
  CHECK(tessera::cuda::attention_forward(nullptr, q.dl(), k.dl(), v.dl(), 0.125f, oh.dl(),
                                         l.dl()) == TSR_ERR_UNSUPPORTED);
  // D > 128.
  const Shape big{1, 8, 1, 136};
  Dev bbuf(3 * big.n() * 2), bout(big.n() * 2);
  Tensor bq = fused_view(bbuf.p, gpu, Ty::BF16, big, 0),
         bk = fused_view(bbuf.p, gpu, Ty::BF16, big, 1),
         bv = fused_view(bbuf.p, gpu, Ty::BF16, big, 2);
  Tensor bo = compact(bout.p, gpu, ty_dl(Ty::BF16), big);
  CHECK(tessera::cuda::attention_forward(nullptr, bq.dl(), bk.dl(), bv.dl(), 0.125f, bo.dl(),
                                         l.dl()) == TSR_ERR_UNSUPPORTED);
  // lse of the wrong shape.
  const int64_t bad[3] = {1, 1, 7};
  Tensor lb(lse.p, gpu, DLDataType{kDLFloat, 32, 1}, 3, bad, nullptr, 0);
  CHECK(tessera::cuda::attention_forward(nullptr, q.dl(), k.dl(), v.dl(), 0.125f, o.dl(),
                                         lb.dl()) == TSR_ERR_INVALID);
}

TEST_CASE("cuda attention: GPT-2 124M timing (printout only)", "[gpu][attention][timing]") {
  const Shape s{16, 1024, 12, 64};
  const Ty ty = Ty::BF16;
  const float scale = 0.125f;
  const size_t esz = 2;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> h(static_cast<size_t>(3 * s.n()));
  for (float &x : h) x = nd(rng);
  Dev d_qkv(3 * s.n() * esz), d_out(s.n() * esz), d_lse(s.B * s.H * s.T * 4), d_dout(s.n() * esz),
      d_dqkv(3 * s.n() * esz);
  d_qkv.upload(encode(ty, h));
  h.resize(static_cast<size_t>(s.n()));
  d_dout.upload(encode(ty, h));
  const DLDevice gpu{kDLCUDA, tessera::cuda::current_device()};
  Tensor q = fused_view(d_qkv.p, gpu, ty, s, 0), k = fused_view(d_qkv.p, gpu, ty, s, 1),
         v = fused_view(d_qkv.p, gpu, ty, s, 2);
  Tensor o = compact(d_out.p, gpu, ty_dl(ty), s), l = lse_tensor(d_lse.p, gpu, s);
  Tensor go = compact(d_dout.p, gpu, ty_dl(ty), s);
  Tensor dq = fused_view(d_dqkv.p, gpu, ty, s, 0), dk = fused_view(d_dqkv.p, gpu, ty, s, 1),
         dv = fused_view(d_dqkv.p, gpu, ty, s, 2);
  auto fwd = [&] {
    REQUIRE(tessera::cuda::attention_forward(nullptr, q.dl(), k.dl(), v.dl(), scale, o.dl(),
                                             l.dl()) == TSR_OK);
  };
  auto bwd = [&] {
    REQUIRE(tessera::cuda::attention_backward(nullptr, q.dl(), k.dl(), v.dl(), o.dl(), go.dl(),
                                              l.dl(), scale, dq.dl(), dk.dl(), dv.dl()) == TSR_OK);
  };
  cudaStream_t st = tessera::cuda::compute_stream();
  cudaEvent_t e0, e1;
  TSR_CUDA_CHECK(cudaEventCreate(&e0));
  TSR_CUDA_CHECK(cudaEventCreate(&e1));
  auto time_ms = [&](auto &&fn) {
    for (int i = 0; i < 3; i++) fn();  // warm-up (and the one-time attribute setup)
    TSR_CUDA_CHECK(cudaEventRecord(e0, st));
    for (int i = 0; i < 20; i++) fn();
    TSR_CUDA_CHECK(cudaEventRecord(e1, st));
    TSR_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    TSR_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return ms / 20;
  };
  const double f_ms = time_ms(fwd), b_ms = time_ms(bwd);
  // Causal FLOPs: half of the 4*B*H*T*T*D of full attention forward; the
  // backward does 2.5 times the forward's matrix work.
  const double f_flop = 2.0 * s.B * s.H * static_cast<double>(s.T) * s.T * s.D;
  std::printf(
      "attention timing bf16 B=16 T=1024 H=12 D=64: forward %.3f ms (%.0f TFLOP/s), backward "
      "%.3f ms (%.0f TFLOP/s), fwd+bwd %.3f ms\n",
      f_ms, f_flop / f_ms * 1e-9, b_ms, 2.5 * f_flop / b_ms * 1e-9, f_ms + b_ms);
  TSR_CUDA_CHECK(cudaEventDestroy(e0));
  TSR_CUDA_CHECK(cudaEventDestroy(e1));
}

}  // namespace gpu_test_cuda_attention
