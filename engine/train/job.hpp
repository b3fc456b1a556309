// A job: the config layered from its sources, validated against the
// engine's schema and each chosen plugin's declared parameters.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "config/settings.hpp"
#include "plugin/registry.hpp"

namespace tessera {

struct JobOptions {
  std::string config_path;
  // The config's TOML itself, when it does not come from a file (a
  // checkpoint's manifest): config_path then only names it in messages.
  std::string config_text;
  std::string deepspeed_path;             // --deepspeed_config
  std::vector<std::string> sets;          // --set key=value, in order
  std::vector<std::string> unsets;        // --unset key: applied before every --set
  std::vector<std::string> plugin_paths;  // --plugin-path
  // --model / --data: a TOML file whose [model] / [data] replaces the
  // config's, or a plugin's name (config/deepspeed.hpp, take_model).
  std::string model, data;
};

struct PluginChoice {
  const PluginEntry *entry = nullptr;
  toml::table values;  // validated, defaults filled, without "plugin"
};

struct Job {
  config::Document doc;
  config::Settings settings;
  toml::table engine;  // resolved engine sections
  std::unique_ptr<Registry> registry;
  std::map<std::string, PluginChoice> plugins;  // by section ("model", "data.train", ...)
  uint32_t world_size = 1;

  bool has(const std::string &section) const { return plugins.count(section) != 0; }
  const PluginChoice &plugin(const std::string &section) const;
  // The whole resolved config as TOML (engine sections, then plugin sections
  // with their plugin names and every parameter).
  std::string resolved_toml() const;
};

// Loads and validates. `training` requires the training slots (optimizer
// and the rest); eval needs only model and data.
Job load_job(const JobOptions &opts, uint32_t world_size, bool training);

// Reads the layered document only (no plugins), e.g. for config convert.
config::Document load_document(const JobOptions &opts);

}  // namespace tessera
