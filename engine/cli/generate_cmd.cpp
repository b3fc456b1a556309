// generate: continue a prompt with a trained language model.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>

#include "cli/args.hpp"
#include "train/generate.hpp"

namespace tessera::cli {

namespace {

const char *kGenerateUsage = R"(usage: tessera generate --ckpt PATH --prompt TEXT [options]

Continues TEXT with a trained language model (a model with predict, ABI 1.1,
e.g. gpt2), one token at a time, printing the prompt and then each token as
it comes. The model and its config come from the checkpoint (its manifest);
it is built frozen in this process and its training data is not opened. The
model sees at most the last T tokens, T being the training windows' length.

  --ckpt PATH               a checkpoint directory (step_NNNNNNNN) or a
                            checkpoint root holding 'latest' (runs/NAME/ckpt)
  --prompt TEXT             the text to continue
  --max-tokens N            tokens to generate (default 200)
  --top-k K                 sample from the K most likely tokens (default 40);
                            0: greedy, always the most likely
  --temperature T           divide the logits by T > 0 before sampling
                            (default 1.0; lower is more conservative)
  --seed S                  seed of the sampling (default: the run's run.seed)
  --encoder FILE            GPT-2's encoder.json: tokenize with GPT-2's BPE
  --bpe FILE                GPT-2's vocab.bpe (with --encoder; see
                            tools/fetch-gpt2-vocab). Without them, or when the
                            model's vocabulary is 256, text is bytes
  --tokenizer PATH          a Hugging Face tokenizer.json or model directory
                            (Llama 3, Qwen2/3, GPT-2; docs/data.md): the
                            prompt is encoded as tokenizer.encode does
  --device D                cpu, cuda or auto (default: the run's run.device)
  --set KEY=VALUE           override a key of the checkpoint's config (repeatable)
  --plugin-path DIR         search DIR for plugins first (repeatable)
  --verbose                 debug logging
  -h, --help                this help

Text goes to stdout, logs to stderr. Generation stops early at
<|endoftext|> with GPT-2's files, and with --tokenizer at the eos_token_id
of the generation_config.json or config.json beside the tokenizer.json.
)";

int64_t count_option(const Parsed &p, const std::string &name, int64_t fallback) {
  const std::string v = p.get(name);
  if (!p.has(name)) return fallback;
  char *end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < 0)
    throw UsageError(name + " '" + v + "' is not a non-negative integer");
  return x;
}

int generate_body(const Parsed &p) {
  if (!p.positional.empty())
    throw UsageError("tessera generate: unexpected argument '" + p.positional[0] + "'");
  if (!p.has("--ckpt")) throw UsageError("tessera generate: --ckpt PATH is required");
  if (!p.has("--prompt")) throw UsageError("tessera generate: --prompt TEXT is required");
  GenerateOptions o;
  o.ckpt = p.get("--ckpt");
  o.prompt = p.get("--prompt");
  o.max_tokens = count_option(p, "--max-tokens", o.max_tokens);
  o.top_k = count_option(p, "--top-k", o.top_k);
  if (p.has("--temperature")) {
    const std::string v = p.get("--temperature");
    char *end = nullptr;
    o.temperature = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !(o.temperature > 0))
      throw UsageError("--temperature '" + v + "' is not a number > 0");
  }
  if (p.has("--seed")) o.seed = static_cast<uint64_t>(count_option(p, "--seed", 0));
  o.encoder = p.get("--encoder");
  o.bpe = p.get("--bpe");
  if (p.has("--encoder") != p.has("--bpe"))
    throw UsageError(p.has("--encoder") ? "--encoder needs --bpe (GPT-2's vocab.bpe) too"
                                        : "--bpe needs --encoder (GPT-2's encoder.json) too");
  o.tokenizer = p.get("--tokenizer");
  if (!o.tokenizer.empty() && p.has("--encoder"))
    throw UsageError("--tokenizer (a tokenizer.json) or --encoder/--bpe (GPT-2's files), not both");
  o.device = p.get("--device");
  o.sets = p.all("--set");
  o.plugin_paths = p.all("--plugin-path");
  const GenerateResult r = generate(o, stdout);
  spdlog::info("generated {} tokens after a prompt of {} in {:.2f} s ({:.1f} tokens/s) from {}",
               r.tokens, r.prompt_tokens, r.seconds,
               r.seconds > 0 ? static_cast<double>(r.tokens) / r.seconds : 0.0, r.checkpoint);
  return 0;
}

}  // namespace

int cmd_generate(const Args &args) {
  std::vector<OptionSpec> specs = {
      {"--ckpt", true, false},     {"--prompt", true, false},      {"--max-tokens", true, false},
      {"--top-k", true, false},    {"--temperature", true, false}, {"--seed", true, false},
      {"--encoder", true, false},  {"--bpe", true, false},         {"--tokenizer", true, false},
      {"--device", true, false},   {"--set", true, true},          {"--plugin-path", true, true},
      {"--verbose", false, false}, {"--help", false, false},       {"-h", false, false}};
  return run_command("generate", kGenerateUsage, generate_body, args, specs);
}

}  // namespace tessera::cli
