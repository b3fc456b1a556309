// The llama plugin's architecture from a Hugging Face config.json (both
// transformers 4's and 5's rope forms) and the header of an init_from
// directory's model.safetensors (hf_config.cpp).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "llama.hpp"

namespace tessera::llama {

// The architecture config.json describes; throws sdk::Error naming the file
// and the key for anything the plugin does not compute (other
// architectures, sliding windows, MoE, other rope types, other activations).
Arch arch_from_hf_config(const std::string &config_path);

// A JSON file (config.json, a safetensors index); throws naming it.
nlohmann::json read_json(const std::string &path);

// The JSON header of a safetensors file; throws naming the file.
nlohmann::json safetensors_header(const std::string &path);

// "llama3" or "default".
const char *rope_type_name(tsr_rope_type t);

}  // namespace tessera::llama
