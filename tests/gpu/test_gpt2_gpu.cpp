// The gpt2 model plugin on the GPU against Hugging Face's float64 forward and
// backward (tests/data/gpt2_L2_C64, the same model and batch as the CPU test
// tests/unit/test_gpt2.cpp): parameters, gradients and the batch in device
// memory, the host's CUDA ops doing the work; in fp32 and in bf16 (bf16
// parameters, gradients and activations; float32 statistics); with the
// ABI 1.3 fused ops and without them (fused = false).
#include <cuda_runtime.h>
#include <tessera/tessera.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <map>
#include <string>
#include <tessera/cpp/half.hpp>
#include <vector>

#include "device_tensor.hpp"
#include "host/host.hpp"
#include "support/fixture.hpp"
#include "support/safetensors_read.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace gpu_test_gpt2_gpu {

namespace {

using tessera::test::Fixture;
using tessera::test::RefTensor;
using tessera::test::gpu::DeviceTensor;
using tessera::test::gpu::rel_err;

constexpr int64_t kBatch = 3, kT = 32, kVocab = 96;

const std::map<std::string, RefTensor> &golden(const std::string &file) {
  static std::map<std::string, std::map<std::string, RefTensor>> cache;
  auto it = cache.find(file);
  if (it == cache.end())
    it = cache
             .emplace(file, tessera::test::read_safetensors(
                                tessera::test::data_path("gpt2_L2_C64/" + file)))
             .first;
  return it->second;
}

// One training step of the golden model on the GPU, held to Hugging Face;
// returns the mean loss and the gradients (wte's padding rows cut).
struct StepResult {
  double loss = 0;
  std::vector<std::vector<double>> grads;
};
StepResult run_reference(tsr_precision precision, double loss_tol, double grad_tol,
                         const std::string &extra = "") {
  StepResult out;
  tessera::Host::RunFacts facts;
  facts.device = DLDevice{kDLCUDA, 0};
  facts.precision = precision;
  Fixture f(facts);
  const bool bf16 = precision == TSR_PRECISION_BF16;
  const auto *vt = f.vtable<tsr_model_vtable>("model", "gpt2");
  tsr_data_info data;
  std::memset(&data, 0, sizeof data);
  data.struct_size = sizeof data;
  data.length = 100;
  data.input_dtype = DLDataType{kDLInt, 32, 1};
  data.input_ndim = 1;
  data.input_shape[0] = kT;
  data.target_dtype = DLDataType{kDLInt, 32, 1};
  data.target_ndim = 1;
  data.target_shape[0] = kT;
  data.num_classes = kVocab;
  tsr_model_init init;
  std::memset(&init, 0, sizeof init);
  init.struct_size = sizeof init;
  init.data = &data;
  init.max_micro_batch = 4;
  void *self = nullptr;
  const tsr_status cs =
      vt->create(f.host.table(),
                 f.config("model", "gpt2",
                          "layers = 2\nheads = 4\nwidth = 64\ncontext = 32\nvocab = 96\n" + extra),
                 &init, &self);
  INFO("create: " << f.host.last_error());
  REQUIRE(cs == TSR_OK);

  const size_t np = vt->num_params(self);
  std::vector<tsr_param_info> info(np);
  std::vector<std::vector<int64_t>> shape(np);
  std::vector<DeviceTensor> value, grad;
  for (size_t i = 0; i < np; ++i) {
    std::memset(&info[i], 0, sizeof info[i]);
    info[i].struct_size = sizeof info[i];
    REQUIRE(vt->param_info(self, i, &info[i]) == TSR_OK);
    shape[i].assign(info[i].shape, info[i].shape + info[i].ndim);
    size_t n = 1;
    for (int64_t d : shape[i]) n *= static_cast<size_t>(d);
    value.emplace_back(n, bf16);
    grad.emplace_back(n, bf16);
    // wte's padding rows get garbage: it must change nothing.
    value.back().put(golden("model.safetensors").at(info[i].name).data, 3.0f);
  }
  const DLDataType dt = bf16 ? DLDataType{kDLBfloat, 16, 1} : DLDataType{kDLFloat, 32, 1};
  auto view = [&](std::vector<DeviceTensor> &store, uint32_t i, DLTensor *out) {
    std::memset(out, 0, sizeof *out);
    out->data = store[i].p;
    out->device = DLDevice{kDLCUDA, 0};
    out->ndim = static_cast<int32_t>(shape[i].size());
    out->dtype = dt;
    out->shape = shape[i].data();
    return TSR_OK;
  };
  tessera::StepHooks hooks;
  hooks.param = [&](uint32_t i, DLTensor *out) { return view(value, i, out); };
  hooks.grad = [&](uint32_t i, DLTensor *out) { return view(grad, i, out); };
  hooks.grads_done = [](uint32_t) { return TSR_OK; };
  hooks.params_done = [](uint32_t) { return TSR_OK; };

  // The batch on the device, as the loader hands it over in CUDA runs.
  std::vector<int32_t> xs, ys;
  for (double v : golden("reference.safetensors").at("input_ids").data)
    xs.push_back(static_cast<int32_t>(v));
  for (double v : golden("reference.safetensors").at("targets").data)
    ys.push_back(static_cast<int32_t>(v));
  void *dx = nullptr, *dy = nullptr;
  REQUIRE(cudaMalloc(&dx, xs.size() * 4) == cudaSuccess);
  REQUIRE(cudaMalloc(&dy, ys.size() * 4) == cudaSuccess);
  REQUIRE(cudaMemcpy(dx, xs.data(), xs.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  // Lands before any op: the ops' non-blocking stream does not wait for it.
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaMemcpy(dy, ys.data(), ys.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  // Lands before any op: the ops' non-blocking stream does not wait for it.
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  int64_t bshape[2] = {kBatch, kT};
  tsr_batch b;
  std::memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  b.size = kBatch;
  b.inputs = DLTensor{dx, DLDevice{kDLCUDA, 0}, 2, DLDataType{kDLInt, 32, 1}, bshape, nullptr, 0};
  b.targets = DLTensor{dy, DLDevice{kDLCUDA, 0}, 2, DLDataType{kDLInt, 32, 1}, bshape, nullptr, 0};

  tsr_step *step = f.host.step_handle(&hooks);
  tsr_forward_result r;
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  const tsr_status fs = vt->forward(self, step, &b, 1, &r);
  INFO("forward: " << f.host.last_error());
  REQUIRE(fs == TSR_OK);
  REQUIRE(r.count == kBatch * kT);
  const tsr_status bs = vt->backward(self, step, &b, 1.0f / static_cast<float>(r.count));
  INFO("backward: " << f.host.last_error());
  REQUIRE(bs == TSR_OK);
  const double loss = r.loss_sum / static_cast<double>(r.count);
  const double want_loss = golden("reference.safetensors").at("loss").data.at(0);
  INFO("loss " << loss << " vs Hugging Face " << want_loss);
  CHECK(std::fabs(loss - want_loss) <= loss_tol * std::fabs(want_loss));
  for (size_t i = 0; i < np; ++i) {
    const RefTensor &g = golden("reference.safetensors").at(std::string("grad.") + info[i].name);
    const std::vector<double> got = grad[i].get();
    const double e = rel_err(got, g.data);
    INFO(info[i].name << ": relative error " << e << " (tolerance " << grad_tol << ")");
    CHECK(e <= grad_tol);
    for (size_t j = g.data.size(); j < got.size(); ++j) REQUIRE(got[j] == 0.0);  // padding
    out.grads.emplace_back(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(g.data.size()));
  }
  out.loss = loss;
  vt->destroy(self);
  cudaFree(dx);
  cudaFree(dy);
  return out;
}

}  // namespace

TEST_CASE("gpt2 on the GPU matches Hugging Face in fp32", "[gpu][gpt2]") {
  run_reference(TSR_PRECISION_FP32, 1e-5, 1e-4);
}

TEST_CASE("gpt2 on the GPU matches Hugging Face in fp32 with recompute", "[gpu][gpt2]") {
  run_reference(TSR_PRECISION_FP32, 1e-5, 1e-4, "recompute = true");
}

TEST_CASE("gpt2 on the GPU matches Hugging Face in bf16", "[gpu][gpt2]") {
  run_reference(TSR_PRECISION_BF16, 1e-2, 5e-2);
}

// ABI 1.3's fused ops (residual + layernorm, bias gradients and GELU's
// backward in cuBLASLt's epilogues) against the 1.1 op sequences the model
// runs with fused = false: both held to Hugging Face, and to each other.
TEST_CASE("gpt2 on the GPU matches Hugging Face without the fused ops", "[gpu][gpt2][fused]") {
  run_reference(TSR_PRECISION_FP32, 1e-5, 1e-4, "fused = false");
  run_reference(TSR_PRECISION_BF16, 1e-2, 5e-2, "fused = false");
  run_reference(TSR_PRECISION_BF16, 1e-2, 5e-2, "recompute = true");
}

TEST_CASE("gpt2 on the GPU: the fused and the unfused step agree", "[gpu][gpt2][fused]") {
  for (tsr_precision p : {TSR_PRECISION_FP32, TSR_PRECISION_BF16}) {
    const bool bf16 = p == TSR_PRECISION_BF16;
    const StepResult fused = run_reference(p, bf16 ? 1e-2 : 1e-5, bf16 ? 5e-2 : 1e-4);
    const StepResult plain =
        run_reference(p, bf16 ? 1e-2 : 1e-5, bf16 ? 5e-2 : 1e-4, "fused = false");
    // bf16: the two differ by where they round (the fused epilogues round
    // once); fp32 only by the order of sums.
    const double tol = bf16 ? 2e-2 : 1e-5;
    CHECK(std::fabs(fused.loss - plain.loss) <= tol * std::fabs(plain.loss));
    REQUIRE(fused.grads.size() == plain.grads.size());
    for (size_t i = 0; i < fused.grads.size(); ++i) {
      const double e = rel_err(fused.grads[i], plain.grads[i]);
      INFO("parameter " << i << ": fused vs unfused relative difference " << e);
      CHECK(e <= (bf16 ? 3e-2 : 1e-5));
    }
  }
}

}  // namespace gpu_test_gpt2_gpu
