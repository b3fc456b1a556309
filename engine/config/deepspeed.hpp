// DeepSpeed JSON configs: DeepSpeed's names and defaults mapped onto the
// engine's sections (see docs/config.md, "DeepSpeed JSON").
#pragma once

#include <string>

namespace tessera::config {

class Document;

// Layers the DeepSpeed JSON at `path` onto `doc`. Sections the JSON speaks
// for (batch, optimizer, schedule) replace the TOML's wholesale; keys the
// engine does not use are reported as warnings.
void deepspeed_apply(Document &doc, const std::string &path);

}  // namespace tessera::config
