// Text generation from a checkpoint: the model the checkpoint's manifest
// describes, built frozen on one process (no dataset opened), continues a
// prompt one token at a time through the model's predict entry (ABI 1.1),
// greedily or by top-k sampling with a temperature.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace tessera {

struct GenerateOptions {
  std::string ckpt;  // a step_ directory, or a checkpoint root holding `latest`
  std::string prompt;
  int64_t max_tokens = 200;
  int64_t top_k = 40;             // 0: greedy (argmax)
  double temperature = 1.0;       // > 0; divides the logits before sampling
  std::optional<uint64_t> seed;   // default: the run's run.seed
  std::string encoder, bpe;       // GPT-2's encoder.json and vocab.bpe; empty: bytes
  std::string tokenizer;          // a Hugging Face tokenizer.json or its directory
  std::string device;             // cpu | cuda | auto; empty: the checkpoint's run.device
  std::vector<std::string> sets;  // --set overrides of the checkpoint's config
  std::vector<std::string> plugin_paths;
};

struct GenerateResult {
  std::string checkpoint;  // the step_ directory read
  int64_t prompt_tokens = 0, tokens = 0;
  double seconds = 0;  // generation only, after the model is built
};

// Streams the prompt and then each generated token's text to `out` as it
// comes (flushed per token). Stops after max_tokens, at GPT-2's
// <|endoftext|> with its BPE files, or with a tokenizer.json at the
// eos_token_id of the generation_config.json or config.json beside it. Throws Error naming the flag
// or file on bad input.
GenerateResult generate(const GenerateOptions &opts, std::FILE *out);

}  // namespace tessera
