// Model-specific exports of a checkpoint (`tessera ckpt export`): a model
// whose weights another framework can load gets an exporter here, keyed by
// the manifest's model plugin name; every other model keeps the generic
// export (one consolidated safetensors file with the model's own names and
// declared shapes, in ckpt_cmd.cpp).
//
// gpt2 -> a Hugging Face transformers directory that
// GPT2LMHeadModel.from_pretrained loads: model.safetensors (Hugging Face's
// names, which the plugin uses already; wte trimmed to the real vocabulary,
// the padding rows dropped) and config.json. The dimensions come from the
// run's config saved in the manifest, resolved by the gpt2 plugin's own rule
// (plugins/models/gpt2/create.cpp, build()): a non-zero [model] key, else
// init_from's config.json, else GPT-2 small's value. Plugins cannot be linked
// by the engine, so the rule is implemented again here;
// tests/integration/test_export_hf.cpp checks that both agree.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera {

// fp32 -> bfloat16, rounded to nearest even; a NaN stays a (quiet) NaN.
uint16_t fp32_to_bf16(float x);

// What a model exporter gets: a checkpoint read and checked.
struct ExportInput {
  std::string ckpt_dir;                           // the step_ directory
  const nlohmann::json *manifest = nullptr;       // its manifest.json
  const std::vector<float> *canonical = nullptr;  // master weights, canonical order
  std::string out;                                // -o as given
  std::string dtype;                              // "fp32" or "bf16"
};

struct ModelExporter {
  const char *model;   // the manifest's "model" (plugin name)
  const char *target;  // what the export is for, for messages
  // Writes the export; returns the line to print.
  std::string (*write)(const ExportInput &in);
};

// The exporter for `model`, or nullptr when the generic export applies.
const ModelExporter *find_model_exporter(const std::string &model);

// ---- gpt2 ---------------------------------------------------------------

struct Gpt2Dims {
  int64_t layers = 0, heads = 0, width = 0, context = 0, vocab = 0;
  int64_t vocab_pad_to = 64, padded_vocab = 0;
  double init_std = 0.02;
  std::string init_from_config;  // the config.json read, or "" without init_from
};

// The dimensions of a gpt2 run from its config (TOML text, as the manifest's
// "config" holds it), by the gpt2 plugin's rule. A relative init_from is read
// from the current directory (as the run read it), else from the nearest
// directory above `ckpt_dir` where it exists (the run's working directory
// when run.dir was relative to it). Throws Error naming what is wrong.
Gpt2Dims gpt2_dims_from_config(const std::string &config_toml, const std::string &ckpt_dir);

// config.json for GPT2LMHeadModel with these dimensions; dtype is the
// export's ("fp32" or "bf16").
nlohmann::json gpt2_hf_config(const Gpt2Dims &d, const std::string &dtype);

// The gpt2 plugin's parameters (names and declared shapes, in declaration
// order) for these dimensions.
std::vector<std::pair<std::string, std::vector<int64_t>>> gpt2_param_table(const Gpt2Dims &d);

}  // namespace tessera
