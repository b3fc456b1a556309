// Validation of one config section against declared parameters (the same
// tsr_param_decl tables plugins export, used for the engine's own sections).
#pragma once

#include <tessera/abi.h>

#include <span>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace tessera::config {

// Checks the user's table for `section` (may be null: all defaults) against
// `decls`: unknown keys (with did-you-mean), types, ranges and choices.
// Returns the table with every declared key present (defaults filled in).
// Keys in `passthrough` are allowed and kept without checks (e.g. "plugin"
// or sub-sections validated elsewhere).
toml::table validate_section(const Document &doc, const std::string &section,
                             std::span<const tsr_param_decl> decls,
                             const std::vector<std::string> &passthrough = {});

// The default of a declaration as a TOML node (table holding key "v").
toml::table parse_default(const tsr_param_decl &d, const std::string &owner);

const char *type_name(tsr_param_type t);

// A STRING declared with the choice '#' takes a number too (abi.h).
bool takes_number(const tsr_param_decl &d);
// The declaration's type as `plugins show` says it: "a number or a word"
// for one that takes_number, else type_name's.
std::string decl_type_name(const tsr_param_decl &d);

}  // namespace tessera::config
