// A Hugging Face GPT-2 checkpoint for model.init_from: its config.json (the
// dimensions, and the settings the gpt2 plugin refuses) and the header of its
// model.safetensors (each tensor's shape and dtype; the engine loads the
// weights themselves: engine/train/init_from.cpp).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "gpt2.hpp"

namespace tessera::gpt2 {

// A Hugging Face GPT-2 checkpoint directory (config.json + model.safetensors).
struct HfCheckpoint {
  std::string dir, config_path, weights_path;
  Dims dims;
  nlohmann::json header;  // the safetensors header
};

// Opens `from`, a model directory or its model.safetensors (config.json
// beside it), and reads config.json and the safetensors header; throws
// sdk::Error naming the file.
HfCheckpoint open_checkpoint(const std::string &from);

// Fills a dimension from config.json: an explicit (non-zero) config key must
// agree with it; zero takes it.
void merge_dim(int64_t &dim, int64_t from_file, const char *key, const char *hf_key,
               const std::string &file);

}  // namespace tessera::gpt2
