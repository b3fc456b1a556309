// Test support: the plugins built in this tree, a host, and configs for
// plugins made from TOML text the way the engine makes them.
#pragma once

#include <string>

#include "host/host.hpp"
#include "plugin/registry.hpp"

namespace tessera::test {

struct Fixture {
  explicit Fixture(Host::RunFacts facts = {});
  Registry registry;
  Host host;

  const tsr_plugin_descriptor &desc(const std::string &kind, const std::string &name);
  template <typename VTable>
  const VTable *vtable(const std::string &kind, const std::string &name) {
    return static_cast<const VTable *>(desc(kind, name).vtable);
  }
  // A validated config for plugin `name` of `kind` from the section's body
  // in TOML ("lr = 0.1\nmomentum = 0.9"); throws ConfigError like a run.
  tsr_config *config(const std::string &kind, const std::string &name,
                     const std::string &toml_body = "");
};

// Path of a file under tests/data.
std::string data_path(const std::string &relative);

}  // namespace tessera::test
