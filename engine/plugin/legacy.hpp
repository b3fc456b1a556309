// What a plugin built before ABI 1.2 cannot tell the host through an
// extension (extensions.h), read from its declared parameters instead. This
// is the one place the engine reads plugin keys by name, and only for
// descriptors that predate get_extension: a 1.2 plugin answers for itself.
#pragma once

#include <toml++/toml.h>

#include <optional>
#include <string>
#include <utility>

#include "plugin/registry.hpp"

namespace tessera {

// True when the plugin's descriptor has no get_extension field (ABI 1.0 or
// 1.1): its capabilities come from the functions below.
bool predates_extensions(const PluginEntry &e);

// An ABI 1.0/1.1 optimizer's configured learning rate: its `lr` value.
std::optional<double> legacy_base_lr(const toml::table &values);

// An ABI 1.0/1.1 model's initial-weights file: its `init_from` value.
std::optional<std::string> legacy_init_from(const toml::table &values);

// An ABI 1.0/1.1 dataset's token windows: its `context` and `vocab` values
// (vocab 0 when it has none), or nullopt without a context.
std::optional<std::pair<int64_t, int64_t>> legacy_window_shape(const toml::table &values);

}  // namespace tessera
