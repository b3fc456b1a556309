// Packing on the GPU (the CPU test is tests/unit/test_llama_packed.cpp):
// the golden Llama of tests/data/llama3_L2_C64 on CUDA, three examples
// packed into one window (positions restarting per example, the tail
// padding, ABI 1.8 tsr_batch.positions, attention_packed) against the same
// examples each alone in its own row without positions: the same mean loss
// over the same unmasked targets and the same gradients, within 1e-4 in
// fp32 and within the bf16 bars of the GPU model tests (loss 1e-2,
// gradients 5e-2, norm-relative) in bf16.
#include <cuda_runtime.h>
#include <tessera/tessera.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "device_tensor.hpp"
#include "host/host.hpp"
#include "support/fixture.hpp"
#include "support/safetensors_read.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace gpu_test_llama_packed_gpu {

namespace {

using tessera::test::Fixture;
using tessera::test::gpu::DeviceTensor;
using tessera::test::gpu::rel_err;

constexpr int64_t kT = 32;
constexpr int32_t kIgnored = -100;

// int32 ids on the device.
struct DeviceInts {
  void *p = nullptr;
  explicit DeviceInts(const std::vector<int32_t> &h) {
    REQUIRE(cudaMalloc(&p, h.size() * 4) == cudaSuccess);
    REQUIRE(cudaMemcpy(p, h.data(), h.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    // Lands before any op: the ops' non-blocking stream does not wait for it.
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
  ~DeviceInts() { cudaFree(p); }
  DeviceInts(const DeviceInts &) = delete;
  DeviceInts &operator=(const DeviceInts &) = delete;
};

// Three examples (ids < 256, a prompt head untrained) of 9, 14 and 6
// tokens: 26 (input, target) pairs, one window of 32 when packed.
struct Batches {
  std::vector<int32_t> px, py, ppos;  // packed [1, T]
  std::vector<int32_t> sx, sy;        // separate [3, T]
};

Batches batches() {
  Batches out;
  out.px.assign(kT, 0);
  out.py.assign(kT, kIgnored);
  out.ppos.assign(kT, 0);
  out.sx.assign(3 * kT, 0);
  out.sy.assign(3 * kT, kIgnored);
  const int64_t lens[3] = {9, 14, 6}, prompt[3] = {3, 5, 2};
  uint32_t seed = 7;
  size_t at = 0;
  for (int e = 0; e < 3; ++e) {
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < lens[e]; ++i) {
      seed = seed * 1103515245u + 12345u;
      ids.push_back(static_cast<int32_t>((seed >> 8) % 256));
    }
    for (int64_t j = 0; j + 1 < lens[e]; ++j) {
      const int32_t y = j + 1 >= prompt[e] ? ids[static_cast<size_t>(j + 1)] : kIgnored;
      out.px[at] = out.sx[static_cast<size_t>(e * kT + j)] = ids[static_cast<size_t>(j)];
      out.py[at] = out.sy[static_cast<size_t>(e * kT + j)] = y;
      out.ppos[at++] = static_cast<int32_t>(j);
    }
  }
  return out;
}

struct Result {
  double loss = 0;
  int64_t count = 0;
  std::vector<std::vector<double>> grads;
  std::vector<std::string> names;
};

// One training step of the golden model on the GPU over an [n, T] batch,
// with positions when `pos` is not empty.
Result run(bool bf16, int64_t n, const std::vector<int32_t> &x, const std::vector<int32_t> &y,
           const std::vector<int32_t> &pos) {
  const std::string dir = tessera::test::data_path("llama3_L2_C64");
  const auto weights = tessera::test::read_safetensors(dir + "/model.safetensors");
  tessera::Host::RunFacts facts;
  facts.device = DLDevice{kDLCUDA, 0};
  facts.precision = bf16 ? TSR_PRECISION_BF16 : TSR_PRECISION_FP32;
  Fixture f(facts);
  const auto *vt = f.vtable<tsr_model_vtable>("model", "llama");
  tsr_data_info data;
  std::memset(&data, 0, sizeof data);
  data.struct_size = sizeof data;
  data.length = 100;
  data.input_dtype = data.target_dtype = DLDataType{kDLInt, 32, 1};
  data.input_ndim = data.target_ndim = 1;
  data.input_shape[0] = data.target_shape[0] = kT;
  data.num_classes = 256;
  data.positions = pos.empty() ? 0 : 1;
  tsr_model_init init;
  std::memset(&init, 0, sizeof init);
  init.struct_size = sizeof init;
  init.data = &data;
  init.max_micro_batch = 3;
  void *self = nullptr;
  const std::string cfg = "hf_config = \"" + dir + "/config.json\"\n";
  const tsr_status cs = vt->create(f.host.table(), f.config("model", "llama", cfg), &init, &self);
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
    size_t count = 1;
    for (int64_t d : shape[i]) count *= static_cast<size_t>(d);
    value.emplace_back(count, bf16);
    grad.emplace_back(count, bf16);
    value.back().put(weights.at(info[i].name).data, 0.0f);
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

  DeviceInts dx(x), dy(y), dp(pos.empty() ? std::vector<int32_t>{0} : pos);
  int64_t bshape[2] = {n, kT};
  tsr_batch b;
  std::memset(&b, 0, sizeof b);
  b.struct_size = tsr_batch_STRUCT_SIZE;
  b.size = n;
  const DLDataType i32{kDLInt, 32, 1};
  b.inputs = DLTensor{dx.p, DLDevice{kDLCUDA, 0}, 2, i32, bshape, nullptr, 0};
  b.targets = DLTensor{dy.p, DLDevice{kDLCUDA, 0}, 2, i32, bshape, nullptr, 0};
  if (!pos.empty()) b.positions = DLTensor{dp.p, DLDevice{kDLCUDA, 0}, 2, i32, bshape, nullptr, 0};

  tsr_step *step = f.host.step_handle(&hooks);
  tsr_forward_result r;
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  const tsr_status fs = vt->forward(self, step, &b, 1, &r);
  INFO("forward: " << f.host.last_error());
  REQUIRE(fs == TSR_OK);
  REQUIRE(r.count > 0);
  const tsr_status bs = vt->backward(self, step, &b, 1.0f / static_cast<float>(r.count));
  INFO("backward: " << f.host.last_error());
  REQUIRE(bs == TSR_OK);
  Result out;
  out.loss = r.loss_sum / static_cast<double>(r.count);
  out.count = r.count;
  for (size_t i = 0; i < np; ++i) {
    out.grads.push_back(grad[i].get());
    out.names.emplace_back(info[i].name);
  }
  vt->destroy(self);
  return out;
}

void compare(bool bf16, double loss_tol, double grad_tol) {
  const Batches bt = batches();
  const Result packed = run(bf16, 1, bt.px, bt.py, bt.ppos);
  const Result separate = run(bf16, 3, bt.sx, bt.sy, {});
  REQUIRE(packed.count == separate.count);
  INFO((bf16 ? "bf16" : "fp32") << ": loss packed " << packed.loss << ", separate "
                                << separate.loss);
  CHECK(std::fabs(packed.loss - separate.loss) <= loss_tol * std::fabs(separate.loss));
  for (size_t i = 0; i < packed.grads.size(); ++i) {
    const double e = rel_err(packed.grads[i], separate.grads[i]);
    INFO(packed.names[i] << ": relative error " << e << " (tolerance " << grad_tol << ")");
    CHECK(e <= grad_tol);
  }
}

}  // namespace

TEST_CASE("llama on the GPU: a packed window equals its examples run separately",
          "[gpu][llama][packing]") {
  compare(false, 1e-4, 1e-4);
  compare(true, 1e-2, 5e-2);
}

}  // namespace gpu_test_llama_packed_gpu
