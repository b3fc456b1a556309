// Frozen parameters cost nothing but their weights (issue 55, item 3): a
// llama with most of its base frozen (`freeze`) trains through the real
// launcher, and
//   memory       its gradients and optimizer state are exactly the trainable
//                tensors' bytes (computed here from their shapes), and its peak
//                allocations stay within 5% of frozen weights + trainable
//                weights, gradients and state + activations
//   equivalence  at 2 CPU ranks every ZeRO stage (and offload, with and without
//                offloaded parameters) trains what world-1 stage 0 trains, the
//                frozen tensors bit for bit what init_from gave them
//   LoRA         the whole base frozen by lora.rank: gradients and state are
//                the adapters' bytes alone, the peak within the same 5%
//   checkpoints  a run saved at stage 3 resumes at stage 0 to the end of the
//                straight run, and its HF export holds the frozen tensors as
//                they came in
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "equivalence.hpp"
#include "frozen_llama.hpp"
#include "harness.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace itest_test_frozen {

using namespace tessera::itest;
using nlohmann::json;
using namespace tessera::itest::frozen_llama;

namespace {

Job llama_job(const std::string &tag, const fs::path &base, int world, int stage) {
  Job j{world, stage, 8, 8 / world};
  j.steps = 20;
  j.model_data = sections(tag, base);
  j.tag = tag;
  return j;
}

// Every frozen tensor of `params` holds the bits init_from gave it, and the
// trainable ones moved.
void check_frozen_kept(const std::map<std::string, F32Tensor> &params,
                       const std::map<std::string, std::vector<float>> &initial) {
  for (const Tensor &t : llama_tensors()) {
    INFO(t.name);
    REQUIRE(params.count(t.name) == 1);
    const std::vector<float> &got = params.at(t.name).data, &was = initial.at(t.name);
    REQUIRE(got.size() == was.size());
    const bool same = std::memcmp(got.data(), was.data(), got.size() * 4) == 0;
    CHECK(same == !trains(t.name));
  }
}

}  // namespace

TEST_CASE(
    "freeze: gradients and optimizer state are the trainable tensors' bytes and the peak within 5%",
    "[distributed][freeze][memory][llama]") {
  const fs::path base = scratch() / "freeze_base_mem";
  write_base(base);
  Job j = llama_job("freeze_mem", base, 1, 0);
  j.steps = 3;
  const Trained t = train_job(j, false);
  INFO(t.run.out);
  size_t trainable = 0, frozen = 0;
  for (const Tensor &x : llama_tensors()) (trains(x.name) ? trainable : frozen) += numel(x);
  REQUIRE(trainable == 320 + 64 * 176 + 256 * 64);
  const json &peak = t.summary.at("peak_memory_by_purpose");
  INFO(peak.dump());
  // fp32 on one rank, stage 0: 4 bytes of gradient and 4 of master weight
  // plus Adam's two moments per trainable element; no padding at world 1.
  CHECK(peak.at("gradients").get<double>() == 4.0 * static_cast<double>(trainable));
  CHECK(peak.at("optimizer state").get<double>() == 12.0 * static_cast<double>(trainable));
  CHECK(peak.at("parameters").get<double>() == 4.0 * static_cast<double>(trainable + frozen));
  CHECK_THAT(t.run.out, Catch::Contains("frozen parameters: " + std::to_string(frozen) + " of " +
                                        std::to_string(trainable + frozen) + " elements"));
  // Everything the run allocated at once: the weights, the trainable
  // tensors' gradients and state, and the activations, within 5%.
  const double bound = 4.0 * static_cast<double>(frozen) +
                       (4 + 4 + 12) * static_cast<double>(trainable) +
                       peak.at("activations").get<double>();
  CHECK(t.summary.at("peak_memory_bytes").get<double>() <= 1.05 * bound);
}

TEST_CASE("LoRA: the whole base frozen, gradients and state for the adapters only, peak within 5%",
          "[distributed][freeze][memory][llama][lora]") {
  const fs::path base = scratch() / "lora_base_mem";
  write_base(base);
  Job j = llama_job("lora_mem", base, 1, 0);
  j.steps = 3;
  // The partly frozen model's sections with LoRA instead of `freeze`:
  // rank 4 adapters on q and down; every base tensor frozen.
  std::string model = sections("lora_mem", base);
  model.replace(model.find(kFreeze), std::strlen(kFreeze),
                "lora.rank = 4\nlora.alpha = 8.0\nlora.targets = [\"q\", \"down\"]\n");
  j.model_data = model;
  const Trained t = train_job(j, false);
  INFO(t.run.out);
  size_t base_elems = 0;
  for (const Tensor &x : llama_tensors()) base_elems += numel(x);
  // Per layer: q (64 x 64) gets A [4, 64] and B [64, 4]; down (64 x 176)
  // gets A [4, 176] and B [64, 4]; two layers.
  const size_t adapters = 2 * ((4 * 64 + 64 * 4) + (4 * 176 + 64 * 4));
  const json &peak = t.summary.at("peak_memory_by_purpose");
  INFO(peak.dump());
  CHECK(peak.at("gradients").get<double>() == 4.0 * static_cast<double>(adapters));
  CHECK(peak.at("optimizer state").get<double>() == 12.0 * static_cast<double>(adapters));
  CHECK(peak.at("parameters").get<double>() == 4.0 * static_cast<double>(base_elems + adapters));
  CHECK_THAT(t.run.out,
             Catch::Contains("frozen parameters: " + std::to_string(base_elems) + " of " +
                             std::to_string(base_elems + adapters) + " elements"));
  const double bound = 4.0 * static_cast<double>(base_elems) +
                       (4 + 4 + 12) * static_cast<double>(adapters) +
                       peak.at("activations").get<double>();
  CHECK(t.summary.at("peak_memory_bytes").get<double>() <= 1.05 * bound);
}

TEST_CASE("freeze: every ZeRO stage and offload at 2 CPU ranks match world-1 stage 0",
          "[distributed][equivalence][freeze][llama]") {
  const fs::path base = scratch() / "freeze_base_eq";
  const auto initial = write_base(base);
  std::vector<Job> jobs;
  for (int stage = 0; stage <= 3; ++stage) jobs.push_back(llama_job("freeze_eq", base, 2, stage));
  Job offload = llama_job("freeze_eq", base, 2, 2);
  offload.offload = "cpu";
  jobs.push_back(offload);
  Job params = llama_job("freeze_eq", base, 2, 3);
  params.offload = "cpu";
  params.params = "cpu";
  jobs.push_back(params);
  Job r = jobs.front();
  r.world = 1;
  r.micro = r.global;
  const Trained ref = train_job(r);
  check_frozen_kept(ref.params, initial);
  for (const Job &j : jobs) {
    const Trained t = train_job(j);
    check_equivalent(ref, t);
    INFO(j.name());
    check_frozen_kept(t.params, initial);
  }
}

TEST_CASE("freeze: a stage-3 checkpoint resumes at stage 0 and exports the frozen base unchanged",
          "[distributed][checkpoint][freeze][llama]") {
  const fs::path base = scratch() / "freeze_base_ckpt";
  const auto initial = write_base(base);
  const Trained straight = train_job(llama_job("freeze_straight", base, 2, 3));
  Job half = llama_job("freeze_resumed", base, 2, 3);
  half.steps = 10;
  const Trained first = train_job(half, false);
  REQUIRE(first.run.status == 0);
  const fs::path config = scratch() / (half.name() + ".toml");
  RunOptions o;
  o.timeout_s = 300;
  const RunResult resumed =
      run_cli({"run", "-n", "2", config.string(), "--set", "run.steps=20", "--set",
               "checkpoint.resume=\"auto\"", "--set", "zero.plugin=\"stage0\""},
              o);
  INFO(describe(resumed));
  REQUIRE(resumed.status == 0);
  CHECK_THAT(resumed.out, Catch::Contains("at step 10"));
  const auto params = final_params(first.dir, 20);
  check_frozen_kept(params, initial);
  for (const auto &[name, ref] : straight.params) {
    INFO(name);
    REQUIRE(params.count(name) == 1);
    const auto &got = params.at(name).data;
    REQUIRE(got.size() == ref.data.size());
    for (size_t i = 0; i < got.size(); ++i)
      REQUIRE(std::fabs(got[i] - ref.data[i]) <= 1e-4 * std::fabs(ref.data[i]) + 1e-5);
  }
  // Unfreezing on resume: the parameters saved frozen have no optimizer
  // state, so the run is refused naming one.
  const RunResult thawed = run_cli(
      {"run", "-n", "2", config.string(), "--set", "run.steps=30", "--set",
       "checkpoint.resume=\"auto\"", "--set", "model.freeze=[\"model.embed_tokens.weight\"]"},
      o);
  CHECK(thawed.status != 0);
  CHECK_THAT(thawed.all(), Catch::Contains("model.layers.0.self_attn.q_proj.weight") &&
                               Catch::Contains("was frozen when the checkpoint was saved"));
  // The Hugging Face export of the checkpoint: the frozen base as it came.
  const fs::path hf = scratch() / "freeze_hf";
  fs::remove_all(hf);
  const RunResult e = run_cli(
      {"ckpt", "export", (first.dir / "ckpt" / "step_00000020").string(), "-o", hf.string()});
  INFO(describe(e));
  REQUIRE(e.status == 0);
  check_frozen_kept(read_safetensors_f32(hf / "model.safetensors"), initial);
}

}  // namespace itest_test_frozen
