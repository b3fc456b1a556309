// DeepSpeed JSON configs: DeepSpeed's names and defaults mapped onto the
// engine's sections (see docs/config.md, "DeepSpeed JSON").
#pragma once

#include <string>
#include <vector>

namespace tessera::config {

class Document;

// Layers the DeepSpeed JSON at `path` onto `doc`. Sections the JSON speaks
// for (batch, optimizer, schedule) replace the TOML's wholesale; keys the
// engine does not use are reported as warnings.
void deepspeed_apply(Document &doc, const std::string &path);

// DeepSpeed's own top-level keys (deepspeed_keys.cpp): one of them that
// tessera does not use is a warning; any other key is an error.
const std::vector<std::string> &deepspeed_known_keys();

}  // namespace tessera::config
