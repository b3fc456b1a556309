// The templates of `tessera plugin new`: the files under engine/cli/templates,
// embedded in the binary at build time (cmake/EmbedTemplates.cmake), so the
// command works from the build tree and from any installed copy alike, and
// always writes plugins for the ABI of the binary that will load them.
#pragma once

#include <cstddef>

namespace tessera::cli {

struct TemplateFile {
  const char *path;  // relative to engine/cli/templates: "model/plugin.cpp.in"
  const char *text;
};

extern const TemplateFile kTemplateFiles[];
extern const size_t kNumTemplateFiles;

}  // namespace tessera::cli
