#include "support/fixture.hpp"

#include "config/config.hpp"
#include "config/validate.hpp"

namespace tessera::test {

Fixture::Fixture(Host::RunFacts facts) : host(std::move(facts)) {
  registry.scan({TESSERA_TEST_PLUGIN_DIR});
}

const tsr_plugin_descriptor &Fixture::desc(const std::string &kind, const std::string &name) {
  return *registry.get(kind, name).desc;
}

tsr_config *Fixture::config(const std::string &kind, const std::string &name,
                            const std::string &toml_body) {
  const PluginEntry &e = registry.get(kind, name);
  auto doc = config::Document::from_string("[" + kind + "]\n" + toml_body, "test.toml");
  toml::table values =
      config::validate_section(doc, kind, std::span<const tsr_param_decl>(e.params), {"plugin"});
  return host.make_config(kind, name, std::move(values));
}

std::string data_path(const std::string &relative) {
  return std::string(TESSERA_TEST_DATA_DIR) + "/" + relative;
}

}  // namespace tessera::test
