// Loading a model's parameters for evaluation: from a checkpoint (sharded,
// any world size) or a consolidated safetensors file with the model's own
// tensor names (what `tessera ckpt export` writes).
#pragma once

#include <string>

#include "plugin/layout.hpp"

namespace tessera {

// Fills `flat` (the layout's padded flat buffer) from `path`: a step_
// directory, a checkpoint root holding `latest`, or a .safetensors file.
// Every declared parameter must be present with its shape. Returns what was
// read.
std::string load_model_params(const std::string &path, const Layout &layout, float *flat);

}  // namespace tessera
