// plugins, plugins show, version.
#include <cstdio>
#include <string>

#include "cli/args.hpp"
#include "config/validate.hpp"
#include "plugin/registry.hpp"
#include "plugin/verify.hpp"

namespace tessera::cli {

namespace {

const char *kPluginsUsage = R"(usage: tessera plugins [--plugin-path DIR]...
       tessera plugins show NAME [--kind KIND] [--plugin-path DIR]...
       tessera plugins --verify [--plugin-path DIR]... [LIBRARY.so]...

Without arguments, a table of every plugin found: kind, name, version,
devices and the library it lives in, then any library that was refused
and why. 'show' prints one plugin's summary and every parameter with its
type, default and documentation.

Plugins are searched in --plugin-path, then TESSERA_PLUGIN_PATH
(colon-separated), then lib/tessera/plugins next to the binary, then the
install prefix. (A run also searches its config's run.plugin_path, after
--plugin-path.) A directory or library that is world-writable, or owned by
another user than you and root, is refused (docs/security.md).

--verify checks every library found (or the ones named): it exports only
tessera_plugin_library (read from its ELF symbol table, before loading it),
its ABI version, descriptor and function-table sizes, kinds, and each
declared parameter (type, default, range). Exits 1 when any fails.
)";

int verify_body(const Parsed &p) {
  std::vector<std::string> libs = p.positional;
  if (libs.empty()) libs = plugin_libraries(Registry::search_dirs(p.all("--plugin-path")));
  int bad = 0;
  for (const auto &lib : libs) {
    const PluginVerdict v = verify_plugin_library(lib);
    std::string names;
    for (const auto &n : v.plugins) names += (names.empty() ? "" : "; ") + n;
    std::printf("%s %s%s%s\n", v.problems.empty() ? "ok  " : "FAIL", lib.c_str(),
                names.empty() ? "" : ": ", names.c_str());
    for (const auto &pr : v.problems) std::printf("       %s\n", pr.c_str());
    bad += v.problems.empty() ? 0 : 1;
  }
  if (libs.empty()) std::printf("no plugin libraries found\n");
  std::printf("%zu librar%s verified, %d with problems\n", libs.size(),
              libs.size() == 1 ? "y" : "ies", bad);
  return bad ? 1 : 0;
}

const char *kVersionUsage =
    "usage: tessera version\n\nPrints the tessera version and its plugin ABI; 'tessera env' "
    "reports the rest\n(CUDA, GPUs, NCCL, cuDNN, io_uring, CPU features, plugins).\n";

std::string devices_of(uint32_t d) {
  std::string s;
  if (d & TSR_DEVICE_CPU) s += "cpu";
  if (d & TSR_DEVICE_CUDA) s += s.empty() ? "cuda" : ",cuda";
  return s.empty() ? "-" : s;
}

int plugins_body(const Parsed &p) {
  if (p.has("--verify")) return verify_body(p);
  Registry reg;
  reg.scan(Registry::search_dirs(p.all("--plugin-path")));
  if (!p.positional.empty()) {
    if (p.positional[0] != "show" || p.positional.size() != 2)
      throw UsageError("tessera plugins: expected 'show NAME'");
    const std::string &name = p.positional[1];
    std::string kind = p.get("--kind");
    std::vector<const PluginEntry *> matches;
    for (const auto &e : reg.plugins())
      if (name == e.desc->name && (kind.empty() || kind == e.kind)) matches.push_back(&e);
    if (matches.empty()) {
      std::vector<std::string> names;
      for (const auto &e : reg.plugins()) names.push_back(e.desc->name);
      std::string dym = config::did_you_mean(name, names);
      throw std::runtime_error("no plugin named '" + name + "'" +
                               (dym.empty() ? "" : "; did you mean '" + dym + "'?"));
    }
    for (const auto *e : matches) {
      const auto *d = e->desc;
      std::printf("%s %s %s: %s\n  devices: %s\n  file: %s\n", e->kind.c_str(), d->name,
                  d->version ? d->version : "?", d->summary ? d->summary : "",
                  devices_of(d->devices).c_str(), e->file.c_str());
      if (e->params.empty())
        std::printf("  parameters: none\n");
      else
        std::printf("  parameters:\n");
      for (const auto &pd : e->params) {
        std::string range;
        if (pd.has_min || pd.has_max) {
          char buf[96];
          std::snprintf(buf, sizeof buf, " range %s%g, %g%s", pd.has_min ? "[" : "(",
                        pd.has_min ? pd.min : -INFINITY, pd.has_max ? pd.max : INFINITY,
                        pd.has_max ? "]" : ")");
          range = buf;
        }
        // '#' among the choices: a number in the range (abi.h).
        std::string choices = pd.choices ? pd.choices : "";
        if (const auto at = choices.find('#'); at != std::string::npos)
          choices.replace(at, 1, "a number");
        std::printf("    %-18s %-22s default %s%s%s%s\n      %s\n", pd.name,
                    config::decl_type_name(pd).c_str(),
                    pd.default_value ? pd.default_value : "(required)", range.c_str(),
                    pd.choices ? "  one of " : "", choices.c_str(), pd.doc ? pd.doc : "");
      }
    }
    return 0;
  }
  std::printf("%-10s %-14s %-8s %-10s %s\n", "KIND", "NAME", "VERSION", "DEVICES", "FILE");
  for (const char *kind : {"model", "dataset", "sampler", "optimizer", "zero", "offload"})
    for (const auto &e : reg.plugins())
      if (e.kind == kind)
        std::printf("%-10s %-14s %-8s %-10s %s\n", e.kind.c_str(), e.desc->name,
                    e.desc->version ? e.desc->version : "?", devices_of(e.desc->devices).c_str(),
                    e.file.c_str());
  if (!reg.refusals().empty()) {
    std::printf("\nrefused:\n");
    for (const auto &r : reg.refusals()) std::printf("  %s\n", r.c_str());
  }
  return 0;
}

int version_body(const Parsed &p) {
  if (!p.positional.empty())
    throw UsageError("tessera version: unexpected argument '" + p.positional[0] + "'");
  std::printf("tessera %s (plugin ABI %d.%d)\n", TESSERA_VERSION, TSR_ABI_MAJOR, TSR_ABI_MINOR);
  std::printf("build options, CUDA, GPUs, NCCL, cuDNN, CPU features and plugins: tessera env\n");
  return 0;
}

}  // namespace

int cmd_plugins(const Args &args) {
  return run_command("plugins", kPluginsUsage, plugins_body, args,
                     {{"--plugin-path", true, true},
                      {"--kind", true, false},
                      {"--verify", false, false},
                      {"--help", false, false},
                      {"-h", false, false}});
}

int cmd_version(const Args &args) {
  return run_command("version", kVersionUsage, version_body, args,
                     {{"--help", false, false}, {"-h", false, false}});
}

}  // namespace tessera::cli
