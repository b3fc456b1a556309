// Saving and loading a model's parameters under its own tensor names
// (model.safetensors inside a checkpoint directory step_NNNNNNNN/).
#pragma once

#include <string>

#include "train/layout.hpp"

namespace tessera {

// Writes <ckpt_dir>/step_<step>/ with model.safetensors and manifest.json,
// replaces <ckpt_dir>/latest atomically, and removes checkpoints beyond
// `keep`. Returns the checkpoint directory.
std::string save_model_checkpoint(const std::string &ckpt_dir, int64_t step, const Layout &layout,
                                  const float *flat, const std::string &config_toml, int64_t keep);

// Loads parameters into `flat` from a checkpoint directory (a step_ dir,
// or a checkpoint root holding `latest`) or a .safetensors file. Every
// declared parameter must be present with its shape.
std::string load_model_params(const std::string &path, const Layout &layout, float *flat);

}  // namespace tessera
