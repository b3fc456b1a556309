// LoRA dropout on one GPU (ABI 1.9's dropout op, keyed on the step): the
// CUDA op draws the CPU's masks (tests/gpu/test_cuda_dropout.cpp), so a
// LoRA run with lora.dropout on the GPU trains the adapters the same run
// trains on the CPU: in fp32 within the fp32 job bars, in bf16 within the
// bf16 ones (test_jobs_gpu.cpp's Adam). And the masks act: a run without
// dropout ends elsewhere.
#include <catch2/catch.hpp>
#include <string>

#include "equivalence.hpp"
#include "harness.hpp"

namespace test_lora_dropout_gpu {

using namespace tessera::itest;

namespace {

std::string lora_sections(const fs::path &tokens, const char *dropout) {
  return std::string("[model]\nplugin = \"llama\"\ninit_from = \"") + TESSERA_SOURCE_DIR +
         "/tests/data/llama3_L2_C64\"\nmax_seq = 16\nlora.rank = 4\nlora.alpha = 8.0\n"
         "lora.dropout = " +
         dropout +
         "\nlora.targets = [\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\"]\n\n"
         "[data.train]\nplugin = \"tokens\"\nfiles = \"" +
         tokens.string() + "\"\ncontext = 16\nvocab = 256\n";
}

Job lora_job(const fs::path &tokens, const char *dropout, const char *device, const char *precision,
             const char *tag) {
  Job j{1, 0, 8, 8};
  j.steps = 10;
  j.device = device;
  j.precision = precision;
  j.model_data = lora_sections(tokens, dropout);
  j.tag = tag;
  j.own_names = true;  // the adapters, under the model's own names
  return j;
}

}  // namespace

TEST_CASE("one GPU: LoRA with dropout trains the CPU's adapters (fp32 and bf16)",
          "[gpu][jobs][lora][dropout]") {
  const fs::path tokens = scratch() / "lora_dropout_tokens" / "tok_train_000000.bin";
  write_token_shard(tokens, 100 * 16 + 1, 256, 4245);
  const Trained cpu = train_job(lora_job(tokens, "0.1", "cpu", "fp32", "lora_drop"));
  const Trained gpu32 = train_job(lora_job(tokens, "0.1", "cuda", "fp32", "lora_drop"));
  check_equivalent(cpu, gpu32, Tolerance{1e-4, 1e-3, 1e-5, 0});
  const Trained gpu16 = train_job(lora_job(tokens, "0.1", "cuda", "bf16", "lora_drop"));
  check_equivalent(cpu, gpu16, Tolerance{3e-2, 0, 0, 1e-1});
  // Without dropout the adapters end elsewhere: the masks did something.
  const Trained plain = train_job(lora_job(tokens, "0.0", "cuda", "fp32", "lora_nodrop"));
  bool differ = false;
  for (const auto &[name, t] : gpu32.params)
    if (name.find(".lora_B.") != std::string::npos) differ |= plain.params.at(name).data != t.data;
  CHECK(differ);
}

}  // namespace test_lora_dropout_gpu
