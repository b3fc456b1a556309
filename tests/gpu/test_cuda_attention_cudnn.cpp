// cuDNN's fused flash attention (engine/backend/cuda/attention_cudnn.cpp) against the
// engine's own flash kernels on the same inputs, and against the CPU's float
// attention on the values the GPU saw (bf16/fp16 rounded once on the host):
// q, k, v and dq, dk, dv are views into fused [B, T, 3, H, D] buffers, as
// GPT-2 has them. For the large shapes the float reference covers batch 0
// (attention is independent per batch), the native comparison all of it.
//
// Where the process finds no cuDNN these tests warn and pass, unless
// TESSERA_TEST_REQUIRE_CUDNN=1 (the GPU staging script sets it), which turns
// a missing or declining cuDNN into a failure.
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_ops_internal.hpp"
#include "cuda_ops_support.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace gpu_test_cuda_attention_cudnn {

namespace {

using namespace cuda_ops_test;
using tessera::cuda::AttnImpl;

bool require_cudnn() {
  const char *e = std::getenv("TESSERA_TEST_REQUIRE_CUDNN");
  return e && std::strcmp(e, "1") == 0;
}

// True when cuDNN can serve; otherwise warns (or fails, when required).
bool have_cudnn() {
  std::string what;
  const bool ok = tessera::cuda::attention_cudnn_available(&what);
  std::printf("attention cudnn: %s\n", what.c_str());
  if (!ok) {
    if (require_cudnn()) FAIL("TESSERA_TEST_REQUIRE_CUDNN=1 but " << what);
    WARN("cuDNN attention not tested: " << what);
  }
  return ok;
}

struct Shape {
  int64_t B, T, H, D;
  int64_t n() const { return B * T * H * D; }
  std::string str() const {
    return "[B=" + std::to_string(B) + ",T=" + std::to_string(T) + ",H=" + std::to_string(H) +
           ",D=" + std::to_string(D) + "]";
  }
};

// A DLTensor header over someone else's memory, owning its shape/strides.
struct View {
  int64_t shape[4] = {}, strides[4] = {};
  DLTensor t{};
  View(void *data, DLDevice dev, DLDataType dt, int ndim, const int64_t *shp, const int64_t *str,
       uint64_t byte_offset) {
    for (int i = 0; i < ndim; i++) shape[i] = shp[i], strides[i] = str ? str[i] : 0;
    t.data = data, t.device = dev, t.ndim = ndim, t.dtype = dt, t.shape = shape;
    t.strides = str ? strides : nullptr;
    t.byte_offset = byte_offset;
  }
  DLTensor *dl() { return &t; }
};

DLDevice gpu_dev() {
  return DLDevice{kDLCUDA, tessera::cuda::current_device()};
}

// q, k or v (which = 0, 1, 2) of a fused [B, T, 3, H, D] buffer.
View fused(void *base, DLDevice dev, Dt dt, const Shape &s, int which) {
  const int64_t shp[4] = {s.B, s.T, s.H, s.D};
  const int64_t str[4] = {s.T * 3 * s.H * s.D, 3 * s.H * s.D, s.D, 1};
  return View(base, dev, dl_type(dt), 4, shp, str,
              static_cast<uint64_t>(which * s.H * s.D) * size_of(dt));
}
View compact(void *base, DLDevice dev, Dt dt, const Shape &s) {
  const int64_t shp[4] = {s.B, s.T, s.H, s.D};
  return View(base, dev, dl_type(dt), 4, shp, nullptr, 0);
}
View lse_view(void *base, DLDevice dev, const Shape &s) {
  const int64_t shp[3] = {s.B, s.H, s.T};
  return View(base, dev, dl_type(Dt::F32), 3, shp, nullptr, 0);
}

// Inputs rounded to the dtype: qkv fused [B, T, 3, H, D] and dout [B, T, H, D].
struct Inputs {
  std::vector<float> qkv, dout;
};
Inputs make_inputs(const Shape &s, Dt dt, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Inputs in{std::vector<float>(static_cast<size_t>(3 * s.n())),
            std::vector<float>(static_cast<size_t>(s.n()))};
  for (float &x : in.qkv) x = round_to(dt, nd(rng));
  for (float &x : in.dout) x = round_to(dt, nd(rng));
  return in;
}

struct Result {
  std::vector<float> out, lse, dqkv;  // dqkv fused like qkv
};

// The first `nb` batches of a result (batch is the outermost dim of all).
Result head(const Result &r, const Shape &s, int64_t nb) {
  const size_t o = static_cast<size_t>(nb * s.T * s.H * s.D),
               l = static_cast<size_t>(nb * s.H * s.T);
  return Result{{r.out.begin(), r.out.begin() + o},
                {r.lse.begin(), r.lse.begin() + l},
                {r.dqkv.begin(), r.dqkv.begin() + 3 * o}};
}

// Forward with `fi`, backward with `bi`, on the GPU. Returns false (and the
// message) when an implementation declined (only Cudnn does).
bool run_gpu(const Shape &s, Dt dt, const Inputs &in, AttnImpl fi, AttnImpl bi, Result *r,
             std::string *declined) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  Tensor qkv({s.B, s.T, 3, s.H, s.D}, dt), out({s.B, s.T, s.H, s.D}, dt),
      lse({s.B, s.H, s.T}, Dt::F32), dout({s.B, s.T, s.H, s.D}, dt),
      dqkv({s.B, s.T, 3, s.H, s.D}, dt);
  qkv.set(in.qkv);
  dout.set(in.dout);
  // Poison the outputs so that an element nobody wrote shows up as NaN.
  for (Tensor *t : {&out, &lse, &dqkv}) REQUIRE(cudaMemset(t->data, 0xff, t->bytes) == cudaSuccess);
  // cudaMemset is asynchronous and on the legacy stream, which the ops'
  // non-blocking stream does not wait for: a late poison overwrote outputs
  // (NaN under a busy GPU). Let it land first.
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const DLDevice g = gpu_dev();
  View q = fused(qkv.data, g, dt, s, 0), k = fused(qkv.data, g, dt, s, 1),
       v = fused(qkv.data, g, dt, s, 2);
  View o = compact(out.data, g, dt, s), l = lse_view(lse.data, g, s),
       go = compact(dout.data, g, dt, s);
  View dq = fused(dqkv.data, g, dt, s, 0), dk = fused(dqkv.data, g, dt, s, 1),
       dv = fused(dqkv.data, g, dt, s, 2);
  host().clear_error();
  tsr_status st = tessera::cuda::attention_forward_with(fi, ctx(), q.dl(), k.dl(), v.dl(), scale,
                                                        o.dl(), l.dl());
  if (st == TSR_ERR_UNSUPPORTED && fi == AttnImpl::Cudnn) {
    *declined = "forward: " + last_error();
    return false;
  }
  INFO("forward: " << last_error());
  REQUIRE(st == TSR_OK);
  st = tessera::cuda::attention_backward_with(bi, ctx(), q.dl(), k.dl(), v.dl(), o.dl(), go.dl(),
                                              l.dl(), scale, dq.dl(), dk.dl(), dv.dl());
  if (st == TSR_ERR_UNSUPPORTED && bi == AttnImpl::Cudnn) {
    *declined = "backward: " + last_error();
    return false;
  }
  INFO("backward: " << last_error());
  REQUIRE(st == TSR_OK);
  tessera::cuda::synchronize();
  *r = Result{out.get(), lse.get(), dqkv.get()};
  return true;
}

// The CPU's float attention on the first nb batches.
Result run_cpu(const Shape &full, int64_t nb, const Inputs &in) {
  const Shape s{nb, full.T, full.H, full.D};
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  std::vector<float> qkv(in.qkv.begin(), in.qkv.begin() + 3 * s.n());
  std::vector<float> dout(in.dout.begin(), in.dout.begin() + s.n());
  Result r{std::vector<float>(static_cast<size_t>(s.n())),
           std::vector<float>(static_cast<size_t>(s.B * s.H * s.T)),
           std::vector<float>(static_cast<size_t>(3 * s.n()))};
  const DLDevice c{kDLCPU, 0};
  View q = fused(qkv.data(), c, Dt::F32, s, 0), k = fused(qkv.data(), c, Dt::F32, s, 1),
       v = fused(qkv.data(), c, Dt::F32, s, 2);
  View o = compact(r.out.data(), c, Dt::F32, s), l = lse_view(r.lse.data(), c, s),
       go = compact(dout.data(), c, Dt::F32, s);
  View dq = fused(r.dqkv.data(), c, Dt::F32, s, 0), dk = fused(r.dqkv.data(), c, Dt::F32, s, 1),
       dv = fused(r.dqkv.data(), c, Dt::F32, s, 2);
  REQUIRE_OK(cpu().attention_forward(ctx(), q.dl(), k.dl(), v.dl(), scale, o.dl(), l.dl()));
  REQUIRE_OK(cpu().attention_backward(ctx(), q.dl(), k.dl(), v.dl(), o.dl(), go.dl(), l.dl(), scale,
                                      dq.dl(), dk.dl(), dv.dl()));
  return r;
}

// ||a - b|| / ||b|| within tol, finite; prints the figures either way.
void expect_rel(const std::string &what, const std::vector<float> &a, const std::vector<float> &b,
                double tol) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0, worst = 0;
  for (size_t i = 0; i < a.size(); i++) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
    if (!(std::fabs(d) <= worst)) worst = std::fabs(d);  // NaN lands here too
  }
  const double rel = std::sqrt(num) / (std::sqrt(den) + 1e-30);
  std::printf("  %-28s rel %.3e  max|diff| %.3e\n", what.c_str(), rel, worst);
  INFO(what << ": rel " << rel << " (tol " << tol << "), max |diff| " << worst);
  CHECK(std::isfinite(worst));
  CHECK(rel <= tol);
}

// Out, lse and the fused gradients of two results.
void compare(const std::string &what, const Result &a, const Result &b, double tol) {
  expect_rel(what + " out", a.out, b.out, tol);
  expect_rel(what + " lse", a.lse, b.lse, 5e-3);
  expect_rel(what + " dq/dk/dv", a.dqkv, b.dqkv, tol);
}

// A backward that cuDNN may decline by design on older versions (the
// refusal in attention_cudnn.cpp); anything else it declines is a failure.
bool expected_decline(const std::string &msg) {
  return msg.find("needs cuDNN 9.15.1") != std::string::npos;
}

void cudnn_case(const Shape &s, Dt dt, int64_t ref_batches, uint32_t seed) {
  std::printf("attention cudnn %s %s\n", name(dt), s.str().c_str());
  const Inputs in = make_inputs(s, dt, seed);
  Result native, cudnn;
  std::string declined;
  REQUIRE(run_gpu(s, dt, in, AttnImpl::Native, AttnImpl::Native, &native, &declined));
  const Result ref = run_cpu(s, ref_batches, in);
  const double tol = 2e-2;  // as the native kernels' own bf16/fp16 test
  if (!run_gpu(s, dt, in, AttnImpl::Cudnn, AttnImpl::Cudnn, &cudnn, &declined)) {
    std::printf("  cuDNN declined: %s\n", declined.c_str());
    if (!expected_decline(declined) || require_cudnn()) {
      INFO(declined);
      CHECK((expected_decline(declined) && !require_cudnn()));
    }
    // The forward alone then, with the engine's backward.
    REQUIRE(run_gpu(s, dt, in, AttnImpl::Cudnn, AttnImpl::Native, &cudnn, &declined));
  }
  compare("cudnn vs float", head(cudnn, s, ref_batches), ref, tol);
  compare("native vs float", head(native, s, ref_batches), ref, tol);
  compare("cudnn vs native", cudnn, native, tol);
}

}  // namespace

TEST_CASE("cuda attention cudnn: the library this process uses", "[gpu][attention][cudnn]") {
  have_cudnn();
}

TEST_CASE("cuda attention cudnn: bf16 matches the native kernels and the float reference",
          "[gpu][attention][cudnn]") {
  if (!have_cudnn()) return;
  cudnn_case({16, 1024, 12, 64}, Dt::BF16, 1, 21);  // GPT-2 124M, B16 T1024
  cudnn_case({4, 1024, 25, 64}, Dt::BF16, 1, 22);   // GPT-2 1.5B's heads
  cudnn_case({2, 77, 3, 64}, Dt::BF16, 2, 23);      // odd T, not a tile multiple
  cudnn_case({1, 200, 2, 32}, Dt::BF16, 1, 24);     // D = 32
  cudnn_case({1, 130, 2, 128}, Dt::BF16, 1, 25);    // D = 128
}

TEST_CASE("cuda attention cudnn: fp16 matches too", "[gpu][attention][cudnn]") {
  if (!have_cudnn()) return;
  cudnn_case({2, 1024, 12, 64}, Dt::F16, 1, 31);
  cudnn_case({1, 333, 4, 64}, Dt::F16, 1, 32);
}

TEST_CASE("cuda attention cudnn: one lse serves both backwards", "[gpu][attention][cudnn]") {
  // cuDNN's stats and the native kernels' lse are the same quantity, so a
  // forward of either feeds a backward of either.
  if (!have_cudnn()) return;
  const Shape s{2, 1024, 12, 64};
  const Inputs in = make_inputs(s, Dt::BF16, 41);
  Result nn, cn, nc;
  std::string declined;
  REQUIRE(run_gpu(s, Dt::BF16, in, AttnImpl::Native, AttnImpl::Native, &nn, &declined));
  REQUIRE(run_gpu(s, Dt::BF16, in, AttnImpl::Cudnn, AttnImpl::Native, &cn, &declined));
  INFO(declined);
  REQUIRE(run_gpu(s, Dt::BF16, in, AttnImpl::Native, AttnImpl::Cudnn, &nc, &declined));
  compare("cudnn fwd + native bwd", cn, nn, 2e-2);
  compare("native fwd + cudnn bwd", nc, nn, 2e-2);
}

TEST_CASE("cuda attention cudnn: calls cuDNN cannot take fall back", "[gpu][attention][cudnn]") {
  if (!have_cudnn()) return;
  // D = 36 is not a multiple of 8: cuDNN declines, auto runs the native
  // kernels, and demanding cuDNN is an error that says why (T = 128, so no
  // cuDNN version's backward refuses it for T first).
  const Shape s{1, 128, 2, 36};
  const Inputs in = make_inputs(s, Dt::BF16, 51);
  Result autor, native;
  std::string declined;
  REQUIRE(run_gpu(s, Dt::BF16, in, AttnImpl::Auto, AttnImpl::Auto, &autor, &declined));
  REQUIRE(run_gpu(s, Dt::BF16, in, AttnImpl::Native, AttnImpl::Native, &native, &declined));
  CHECK(autor.out == native.out);  // the same kernels; the backward's dq uses atomics
  expect_rel("auto vs native dq/dk/dv", autor.dqkv, native.dqkv, 1e-3);
  Result r;
  CHECK_FALSE(run_gpu(s, Dt::BF16, in, AttnImpl::Cudnn, AttnImpl::Cudnn, &r, &declined));
  INFO(declined);
  CHECK(declined.find("not a multiple of 8") != std::string::npos);
  // float32 is never cuDNN's: Cudnn runs the native kernels for it.
  const Inputs f = make_inputs(s, Dt::F32, 52);
  CHECK(run_gpu(s, Dt::F32, f, AttnImpl::Cudnn, AttnImpl::Cudnn, &r, &declined));
}

TEST_CASE("cuda attention cudnn: a cached plan gives the same result again",
          "[gpu][attention][cudnn]") {
  if (!have_cudnn()) return;
  const Shape s{2, 256, 4, 64};
  const Inputs in = make_inputs(s, Dt::BF16, 61);
  Result a, b;
  std::string declined;
  REQUIRE(run_gpu(s, Dt::BF16, in, AttnImpl::Cudnn, AttnImpl::Native, &a, &declined));
  REQUIRE(run_gpu(s, Dt::BF16, in, AttnImpl::Cudnn, AttnImpl::Native, &b, &declined));
  CHECK(a.out == b.out);  // cuDNN's forward is deterministic
  CHECK(a.lse == b.lse);
}

}  // namespace gpu_test_cuda_attention_cudnn
