// `tessera plugins --verify`: checks a plugin library without running any
// of its code but the entry function (and its static initialisers, which
// loading any library runs): the symbols it exports, read from its ELF
// dynamic symbol table, then what the registry checks (ABI version,
// descriptor and function-table sizes, kinds), then each declared
// parameter (type, name, default, range, choices).
#pragma once

#include <string>
#include <vector>

namespace tessera {

// The defined, globally visible symbols of an ELF shared library's dynamic
// symbol table. Throws tessera::Error when `path` is not a well-formed
// 64-bit little-endian ELF file (every offset is checked against its size).
std::vector<std::string> elf_exported_symbols(const std::string &path);

struct PluginVerdict {
  std::string file;
  std::vector<std::string> plugins;   // "kind name version"
  std::vector<std::string> problems;  // empty: the library passes
};

PluginVerdict verify_plugin_library(const std::string &path);

// The libraries (*.so) of `dirs`, in order, each once.
std::vector<std::string> plugin_libraries(const std::vector<std::string> &dirs);

}  // namespace tessera
