// The mlp model plugin on the GPU against PyTorch's reference gradients
// (tests/data/mlp_relu.safetensors, float64): the same network and batch as
// the CPU test (tests/unit/test_mlp.cpp), with parameters, gradients and
// the batch in device memory and the host's CUDA ops doing the work; in
// fp32 (cuBLASLt with fp32 compute) and in bf16.
#include <cuda_runtime.h>
#include <tessera/tessera.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <tessera/cpp/half.hpp>
#include <vector>

#include "host/host.hpp"
#include "support/fixture.hpp"
#include "support/safetensors_read.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace gpu_test_mlp_gpu {

namespace {

using tessera::test::Fixture;
using tessera::test::RefTensor;

const std::map<std::string, RefTensor> &reference() {
  static const std::map<std::string, RefTensor> ref =
      tessera::test::read_safetensors(tessera::test::data_path("mlp_relu.safetensors"));
  return ref;
}

float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Device memory in the run's dtype, filled from / read back as floats.
struct DeviceTensor {
  void *p = nullptr;
  size_t n = 0;
  bool bf16 = false;
  DeviceTensor(size_t count, bool b) : n(count), bf16(b) {
    REQUIRE(cudaMalloc(&p, n * (bf16 ? 2 : 4)) == cudaSuccess);
    REQUIRE(cudaMemset(p, 0, n * (bf16 ? 2 : 4)) == cudaSuccess);
    // Lands before any op: the ops' non-blocking stream does not wait for it.
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
  ~DeviceTensor() { cudaFree(p); }
  DeviceTensor(const DeviceTensor &) = delete;
  DeviceTensor(DeviceTensor &&o) noexcept : p(o.p), n(o.n), bf16(o.bf16) { o.p = nullptr; }
  void put(const std::vector<double> &v) {
    REQUIRE(v.size() == n);
    if (bf16) {
      std::vector<uint16_t> h(n);
      for (size_t i = 0; i < n; ++i) h[i] = tessera::sdk::float_to_bf16(static_cast<float>(v[i]));
      REQUIRE(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice) == cudaSuccess);
      // Lands before any op: the ops' non-blocking stream does not wait for it.
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    } else {
      std::vector<float> h(v.begin(), v.end());
      REQUIRE(cudaMemcpy(p, h.data(), n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
      // Lands before any op: the ops' non-blocking stream does not wait for it.
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    }
  }
  std::vector<double> get() const {
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<double> out(n);
    if (bf16) {
      std::vector<uint16_t> h(n);
      REQUIRE(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
      for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(h[i]);
    } else {
      std::vector<float> h(n);
      REQUIRE(cudaMemcpy(h.data(), p, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
      for (size_t i = 0; i < n; ++i) out[i] = h[i];
    }
    return out;
  }
};

double rel_err(const std::vector<double> &got, const std::vector<double> &want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

void run_reference(tsr_precision precision, double tol) {
  tessera::Host::RunFacts facts;
  facts.device = DLDevice{kDLCUDA, 0};
  facts.precision = precision;
  Fixture f(facts);
  const bool bf16 = precision == TSR_PRECISION_BF16;
  const auto *vt = f.vtable<tsr_model_vtable>("model", "mlp");
  tsr_data_info data;
  std::memset(&data, 0, sizeof data);
  data.struct_size = sizeof data;
  data.length = 100;
  data.input_dtype = DLDataType{kDLFloat, 32, 1};
  data.input_ndim = 1;
  data.input_shape[0] = 20;
  data.target_dtype = DLDataType{kDLInt, 32, 1};
  data.num_classes = 5;
  tsr_model_init init;
  std::memset(&init, 0, sizeof init);
  init.struct_size = sizeof init;
  init.data = &data;
  init.max_micro_batch = 12;
  void *self = nullptr;
  REQUIRE(vt->create(f.host.table(), f.config("model", "mlp", "hidden = [16, 12]"), &init, &self) ==
          TSR_OK);

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
    value.back().put(reference().at(std::string("param.") + info[i].name).data);
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

  // The batch on the device, as the loader hands it over in CUDA runs.
  const RefTensor &x = reference().at("x"), &y = reference().at("y");
  std::vector<float> xs(x.data.begin(), x.data.end());
  std::vector<int32_t> ys;
  for (double v : y.data) ys.push_back(static_cast<int32_t>(v));
  void *dx = nullptr, *dy = nullptr;
  REQUIRE(cudaMalloc(&dx, xs.size() * 4) == cudaSuccess);
  REQUIRE(cudaMalloc(&dy, ys.size() * 4) == cudaSuccess);
  REQUIRE(cudaMemcpy(dx, xs.data(), xs.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  // Lands before any op: the ops' non-blocking stream does not wait for it.
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaMemcpy(dy, ys.data(), ys.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  // Lands before any op: the ops' non-blocking stream does not wait for it.
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  int64_t xshape[2] = {8, 20}, yshape[1] = {8};
  tsr_batch b;
  std::memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  b.size = 8;
  b.inputs = DLTensor{dx, DLDevice{kDLCUDA, 0}, 2, DLDataType{kDLFloat, 32, 1}, xshape, nullptr, 0};
  b.targets = DLTensor{dy, DLDevice{kDLCUDA, 0}, 1, DLDataType{kDLInt, 32, 1}, yshape, nullptr, 0};

  tsr_step *step = f.host.step_handle(&hooks);
  tsr_forward_result r;
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  const tsr_status fs = vt->forward(self, step, &b, 1, &r);
  INFO("forward: " << f.host.last_error());
  REQUIRE(fs == TSR_OK);
  const tsr_status bs = vt->backward(self, step, &b, 1.0f / 8.0f);
  INFO("backward: " << f.host.last_error());
  REQUIRE(bs == TSR_OK);
  const double want_loss = reference().at("loss").data.at(0);
  INFO("loss " << r.loss_sum / 8 << " vs PyTorch " << want_loss);
  CHECK(std::fabs(r.loss_sum / 8 - want_loss) <= tol * std::fabs(want_loss));
  for (size_t i = 0; i < np; ++i) {
    const RefTensor &g = reference().at(std::string("grad.") + info[i].name);
    const double e = rel_err(grad[i].get(), g.data);
    INFO(info[i].name << ": relative error " << e << " (tolerance " << tol << ")");
    CHECK(e <= tol);
  }
  vt->destroy(self);
  cudaFree(dx);
  cudaFree(dy);
}

}  // namespace

TEST_CASE("mlp on the GPU matches PyTorch's gradients in fp32", "[gpu][mlp]") {
  run_reference(TSR_PRECISION_FP32, 1e-5);
}

TEST_CASE("mlp on the GPU matches PyTorch's gradients in bf16", "[gpu][mlp]") {
  run_reference(TSR_PRECISION_BF16, 2e-2);
}

}  // namespace gpu_test_mlp_gpu
