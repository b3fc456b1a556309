// Frozen parameters on GPUs (issue 55, item 3): the partly frozen llama of
// tests/integration/frozen_llama.hpp in bf16. On one GPU its gradients and
// optimizer state are the trainable tensors' bytes (2 per gradient
// element, 4 per master and Adam moment); on two GPUs every ZeRO stage,
// and stage 3 with the parameters offloaded, trains what one GPU trains,
// and every frozen tensor leaves the run as its initial value rounded once
// to bf16 (the frozen base is held in the compute dtype alone).
//
// Tolerances as test_jobs_gpu.cpp's Adam runs in bf16: loss within 3% at
// every step, each tensor within 10% in the L2 norm.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "equivalence.hpp"
#include "frozen_llama.hpp"
#include "harness.hpp"

namespace test_frozen_gpu {

using namespace tessera::itest;
using namespace tessera::itest::frozen_llama;

namespace {

// x rounded to the nearest bfloat16 (ties to even), written out here
// rather than taken from the engine.
float bf16_round(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  float y = 0;
  std::memcpy(&y, &u, 4);
  return y;
}

Job gpu_job(const fs::path &base, int world, int stage) {
  Job j{world, stage, 8, 8 / world};
  j.steps = 20;
  j.device = "cuda";
  j.precision = "bf16";
  j.model_data = sections("freeze_gpu", base);
  j.tag = "freeze_gpu";
  return j;
}

void check_frozen_bf16(const std::map<std::string, F32Tensor> &params,
                       const std::map<std::string, std::vector<float>> &initial) {
  for (const Tensor &t : llama_tensors()) {
    if (trains(t.name)) continue;
    INFO(t.name);
    REQUIRE(params.count(t.name) == 1);
    const std::vector<float> &got = params.at(t.name).data, &was = initial.at(t.name);
    REQUIRE(got.size() == was.size());
    size_t off = 0;
    for (size_t i = 0; i < got.size(); ++i) off += got[i] != bf16_round(was[i]);
    CHECK(off == 0);
  }
}

}  // namespace

TEST_CASE("two GPUs, bf16: a partly frozen llama keeps no gradients or state for its frozen base",
          "[gpu][jobs][freeze]") {
  const fs::path base = scratch() / "freeze_gpu_base";
  const auto initial = write_base(base);
  size_t trainable = 0;
  for (const Tensor &t : llama_tensors())
    if (trains(t.name)) trainable += numel(t);
  const Trained one = train_job(gpu_job(base, 1, 0));
  const nlohmann::json &peak = one.summary.at("peak_memory_by_purpose");
  INFO(peak.dump());
  CHECK(peak.at("gradients").get<double>() == 2.0 * static_cast<double>(trainable));
  CHECK(peak.at("optimizer state").get<double>() == 12.0 * static_cast<double>(trainable));
  check_frozen_bf16(one.params, initial);

  const Tolerance tol{3e-2, 0, 0, 1e-1};
  std::vector<Job> jobs;
  for (int stage = 0; stage <= 3; ++stage) jobs.push_back(gpu_job(base, 2, stage));
  Job offloaded = gpu_job(base, 2, 3);
  offloaded.offload = "cpu";
  offloaded.params = "cpu";
  jobs.push_back(offloaded);
  for (const Job &j : jobs) {
    const Trained t = train_job(j);
    check_equivalent(one, t, tol);
    INFO(j.name());
    check_frozen_bf16(t.params, initial);
  }
}

}  // namespace test_frozen_gpu
