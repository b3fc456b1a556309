#include "plugin/legacy.hpp"

namespace tessera {

bool predates_extensions(const PluginEntry &e) {
  return !e.desc || !TSR_HAS_FIELD(e.desc, tsr_plugin_descriptor, get_extension);
}

std::optional<double> legacy_base_lr(const toml::table &values) {
  if (auto x = values["lr"].value<double>()) return *x;
  return std::nullopt;
}

std::optional<std::string> legacy_init_from(const toml::table &values) {
  if (auto x = values["init_from"].value<std::string>(); x && !x->empty()) return *x;
  return std::nullopt;
}

std::optional<std::pair<int64_t, int64_t>> legacy_window_shape(const toml::table &values) {
  const auto context = values["context"].value<int64_t>();
  if (!context || *context < 1) return std::nullopt;
  return std::pair{*context, values["vocab"].value<int64_t>().value_or(0)};
}

}  // namespace tessera
