// The llama model plugin on the GPU against Hugging Face's float64 forward
// and backward (tests/data/llama3_L2_C64 and qwen2_L2_C64, the models and
// batches of the CPU test tests/unit/test_llama.cpp): parameters, gradients
// and the batch in device memory, the host's CUDA ops (ABI 1.6's decoder
// ops) doing the work; in fp32 (loss and gradients within 1e-4) and in bf16
// (gpt2's bars: loss 1e-2, gradients 5e-2), with and without recompute.
// LoRA (lora.rank > 0) with A drawn here and B zero: the loss is still Hugging
// Face's, and the adapters' gradients follow from its gradient G of each
// adapted weight by the chain rule: dB = s G A^T, dA = s B^T G = 0.
#include <cuda_runtime.h>
#include <tessera/tessera.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "device_tensor.hpp"
#include "host/host.hpp"
#include "support/fixture.hpp"
#include "support/safetensors_read.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace gpu_test_llama_gpu {

namespace {

using tessera::test::Fixture;
using tessera::test::RefTensor;
using tessera::test::gpu::DeviceTensor;
using tessera::test::gpu::rel_err;

// An int32 copy of ids on the device.
struct DeviceIds {
  void *p = nullptr;
  explicit DeviceIds(const std::vector<double> &v) {
    std::vector<int32_t> h;
    for (double x : v) h.push_back(static_cast<int32_t>(x));
    REQUIRE(cudaMalloc(&p, h.size() * 4) == cudaSuccess);
    REQUIRE(cudaMemcpy(p, h.data(), h.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    // Lands before any op: the ops' non-blocking stream does not wait for it.
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
  ~DeviceIds() { cudaFree(p); }
  DeviceIds(const DeviceIds &) = delete;
  DeviceIds &operator=(const DeviceIds &) = delete;
};

bool is_adapter(const std::string &name) {
  return name.find(".lora_") != std::string::npos;
}

// A LoRA A's values: a fixed draw (B stays zero).
std::vector<double> adapter_draw(size_t n) {
  std::vector<double> v(n);
  for (size_t j = 0; j < n; ++j) v[j] = 0.3 * std::sin(0.7 * static_cast<double>(j) + 1.0);
  return v;
}

// The expected gradient of a LoRA adapter (B zero): dB = s G A^T [out, r]
// from Hugging Face's gradient G [out, in] of the adapted weight; dA zero.
std::vector<double> adapter_grad(const std::string &name, const std::vector<int64_t> &shape,
                                 const std::map<std::string, RefTensor> &ref,
                                 const std::vector<double> &a, double scale) {
  std::vector<double> want(static_cast<size_t>(shape[0] * shape[1]), 0.0);
  if (name.find("lora_B") == std::string::npos) return want;
  const std::string w = name.substr(0, name.find(".lora_")) + ".weight";
  const std::vector<double> &G = ref.at("grad." + w).data;
  const int64_t out = shape[0], r = shape[1], in = static_cast<int64_t>(a.size()) / r;
  for (int64_t o = 0; o < out; ++o)
    for (int64_t j = 0; j < r; ++j)
      for (int64_t c = 0; c < in; ++c) want[o * r + j] += scale * G[o * in + c] * a[j * in + c];
  return want;
}

// One training step of golden model `name` (configured from `config_file`
// in its directory) on the GPU, held to Hugging Face. With LoRA in `extra`,
// `lora_scale` is its alpha / rank.
void run_reference(const std::string &name, const std::string &config_file, tsr_precision precision,
                   double loss_tol, double grad_tol, const std::string &extra = "",
                   double lora_scale = 0) {
  const std::string dir = tessera::test::data_path(name);
  const auto weights = tessera::test::read_safetensors(dir + "/model.safetensors");
  const auto ref = tessera::test::read_safetensors(dir + "/reference.safetensors");
  const int64_t B = ref.at("input_ids").shape.at(0), T = ref.at("input_ids").shape.at(1);
  tessera::Host::RunFacts facts;
  facts.device = DLDevice{kDLCUDA, 0};
  facts.precision = precision;
  Fixture f(facts);
  const bool bf16 = precision == TSR_PRECISION_BF16;
  const auto *vt = f.vtable<tsr_model_vtable>("model", "llama");
  tsr_data_info data;
  std::memset(&data, 0, sizeof data);
  data.struct_size = sizeof data;
  data.length = 100;
  data.input_dtype = data.target_dtype = DLDataType{kDLInt, 32, 1};
  data.input_ndim = data.target_ndim = 1;
  data.input_shape[0] = data.target_shape[0] = T;
  data.num_classes = ref.at("logits").shape.at(2);
  tsr_model_init init;
  std::memset(&init, 0, sizeof init);
  init.struct_size = sizeof init;
  init.data = &data;
  init.max_micro_batch = B;
  void *self = nullptr;
  const std::string cfg = "hf_config = \"" + dir + "/" + config_file + "\"\n" + extra;
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
    size_t n = 1;
    for (int64_t d : shape[i]) n *= static_cast<size_t>(d);
    value.emplace_back(n, bf16);
    grad.emplace_back(n, bf16);
    const bool lora_a = std::string(info[i].name).find("lora_A") != std::string::npos;
    if (is_adapter(info[i].name))
      value.back().put(lora_a ? adapter_draw(n) : std::vector<double>(n, 0.0), 0.0f);
    else
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

  DeviceIds x(ref.at("input_ids").data), y(ref.at("targets").data);
  int64_t bshape[2] = {B, T};
  tsr_batch b;
  std::memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  b.size = B;
  b.inputs = DLTensor{x.p, DLDevice{kDLCUDA, 0}, 2, DLDataType{kDLInt, 32, 1}, bshape, nullptr, 0};
  b.targets = DLTensor{y.p, DLDevice{kDLCUDA, 0}, 2, DLDataType{kDLInt, 32, 1}, bshape, nullptr, 0};

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
  const double loss = r.loss_sum / static_cast<double>(r.count);
  const double want_loss = ref.at("loss").data.at(0);
  INFO(name << " " << config_file << ": loss " << loss << " vs Hugging Face " << want_loss);
  CHECK(std::fabs(loss - want_loss) <= loss_tol * std::fabs(want_loss));
  for (size_t i = 0; i < np; ++i) {
    if (!info[i].trainable) continue;  // frozen (LoRA's base): no gradient computed
    const std::string nm = info[i].name;
    if (is_adapter(nm)) {
      const std::vector<double> got = grad[i].get();
      if (nm.find("lora_A") != std::string::npos) {  // s B^T G with B zero
        double worst = 0;
        for (double v : got) worst = std::max(worst, std::fabs(v));
        INFO(nm << ": largest |gradient| " << worst);
        CHECK(worst == 0.0);
        continue;
      }
      std::string a = nm;
      a.replace(a.find("lora_B"), 6, "lora_A");
      size_t ia = 0;
      while (ia < np && a != info[ia].name) ++ia;
      REQUIRE(ia < np);
      // A as the device holds it (rounded to bf16 there).
      const std::vector<double> want = adapter_grad(nm, shape[i], ref, value[ia].get(), lora_scale);
      const double e = rel_err(got, want);
      INFO(nm << ": relative error " << e << " (tolerance " << grad_tol << ")");
      CHECK(e <= grad_tol);
      continue;
    }
    const RefTensor &g = ref.at(std::string("grad.") + info[i].name);
    const double e = rel_err(grad[i].get(), g.data);
    INFO(info[i].name << ": relative error " << e << " (tolerance " << grad_tol << ")");
    CHECK(e <= grad_tol);
  }
  vt->destroy(self);
}

}  // namespace

TEST_CASE("llama on the GPU matches Hugging Face in fp32", "[gpu][llama]") {
  run_reference("llama3_L2_C64", "config.json", TSR_PRECISION_FP32, 1e-4, 1e-4);
  run_reference("llama3_L2_C64", "config.transformers4.json", TSR_PRECISION_FP32, 1e-4, 1e-4);
  run_reference("qwen2_L2_C64", "config.json", TSR_PRECISION_FP32, 1e-4, 1e-4);
  run_reference("llama3_L2_C64", "config.json", TSR_PRECISION_FP32, 1e-4, 1e-4, "recompute = true");
}

TEST_CASE("llama on the GPU matches Hugging Face in bf16", "[gpu][llama]") {
  run_reference("llama3_L2_C64", "config.json", TSR_PRECISION_BF16, 1e-2, 5e-2);
  run_reference("qwen2_L2_C64", "config.json", TSR_PRECISION_BF16, 1e-2, 5e-2);
  run_reference("qwen2_L2_C64", "config.json", TSR_PRECISION_BF16, 1e-2, 5e-2, "recompute = true");
}

TEST_CASE("llama LoRA on the GPU: Hugging Face's loss, adapter gradients by the chain rule",
          "[gpu][llama][lora]") {
  const std::string lora =
      "lora.rank = 4\nlora.alpha = 8.0\n"
      "lora.targets = [\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\"]\n";
  run_reference("llama3_L2_C64", "config.json", TSR_PRECISION_FP32, 1e-4, 1e-4, lora, 2.0);
  run_reference("llama3_L2_C64", "config.json", TSR_PRECISION_FP32, 1e-4, 1e-4,
                lora + "recompute = true\n", 2.0);
  run_reference("qwen2_L2_C64", "config.json", TSR_PRECISION_BF16, 1e-2, 5e-2, lora, 2.0);
  run_reference("llama3_L2_C64", "config.json", TSR_PRECISION_BF16, 1e-2, 5e-2,
                lora + "recompute = true\n", 2.0);
}

}  // namespace gpu_test_llama_gpu
