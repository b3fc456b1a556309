// tessera plugin new KIND NAME [DIR]: writes a plugin project that builds
// against an installed SDK (find_package(Tessera)) and trains with the
// config it comes with. The files come from engine/cli/templates, embedded
// in the binary (cli/plugin_templates.hpp says why).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "cli/args.hpp"
#include "cli/plugin_templates.hpp"
#include "plugin/registry.hpp"

namespace tessera::cli {

namespace {

namespace fs = std::filesystem;

const char *kPluginUsage = R"(usage: tessera plugin new KIND NAME [DIR] [--force]
       tessera plugin check CONFIG [options]   (tessera plugin check --help)

Writes a new plugin project into DIR (default: ./NAME), ready to build
against an installed tessera and to train with:

  DIR/CMakeLists.txt   find_package(Tessera) + tessera_add_plugin
  DIR/NAME.cpp         the plugin, a small working example of its kind
  DIR/NAME.toml        a config that trains with it
  DIR/README.md        how to build, check and run it
  DIR/.gitignore

KIND is one of:
  model       a linear softmax classifier computed through the host's ops
  dataset     synthetic Gaussian blobs, generated per index
  sampler     contiguous equal blocks, one per rank
  optimizer   SGD with weight decay
  offload     master weights and optimizer state in host memory

NAME is what configs use (plugin = "NAME"): a lower-case letter, then
lower-case letters, digits, '_' or '-'; it must not be the name of a plugin
of that kind tessera already has. Then:

  cd DIR
  cmake -S . -B build -DCMAKE_PREFIX_PATH=<tessera install prefix>
  cmake --build build
  tessera plugin check NAME.toml --plugin-path build   (a model: its gradients)
  tessera run NAME.toml --plugin-path build

options:
  --force   overwrite files DIR already has
  --help    this text

docs/writing-a-model.md, writing-an-optimizer.md and writing-a-sampler.md
walk through one kind each.
)";

struct Kind {
  const char *name;
  const char *guide;  // the README's pointer to more
};

const Kind kKinds[] = {
    {"model", "`docs/writing-a-model.md`: this model grown by a hidden layer, step by step."},
    {"dataset", "`docs/plugins.md` (section Dataset): what `info` and `read` promise the engine."},
    {"sampler",
     "`docs/writing-a-sampler.md`: this sampler given a per-epoch shuffle, step by "
     "step."},
    {"optimizer", "`docs/writing-an-optimizer.md`: this optimizer given momentum, step by step."},
    {"offload",
     "`docs/writing-an-offload.md`: what an offload backend owns, and a pipelined "
     "one."},
};

std::string template_text(const std::string &path) {
  for (size_t i = 0; i < kNumTemplateFiles; ++i)
    if (path == kTemplateFiles[i].path) return kTemplateFiles[i].text;
  throw std::logic_error("no embedded template '" + path + "'");
}

std::string substitute(std::string text, const std::map<std::string, std::string> &vars) {
  for (const auto &[key, value] : vars) {
    const std::string token = "@" + key + "@";
    for (size_t at = text.find(token); at != std::string::npos;
         at = text.find(token, at + value.size()))
      text.replace(at, token.size(), value);
  }
  return text;
}

std::string trim_trailing_newlines(std::string s) {
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// The prefix this binary is installed in, if it is: <exe>/../lib/cmake/Tessera
// holds the package find_package(Tessera) reads.
std::string install_prefix() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const fs::path prefix = exe.parent_path().parent_path();
  if (fs::exists(prefix / "lib" / "cmake" / "Tessera" / "TesseraConfig.cmake", ec))
    return prefix.string();
  return "";
}

// Quotes a path for the shell when it needs it.
std::string sh_quote(const std::string &s) {
  if (std::regex_match(s, std::regex("[A-Za-z0-9_./+-]+"))) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// KIND and NAME of `plugin new KIND NAME [DIR]`, checked: a kind the
// templates have, a valid plugin name.
const Kind &parse_kind_and_name(const Parsed &p) {
  if (p.positional.empty() || p.positional[0] != "new")
    throw UsageError(p.positional.empty()
                         ? "tessera plugin: expected 'new KIND NAME [DIR]' or 'check CONFIG'"
                         : "tessera plugin: unknown subcommand '" + p.positional[0] +
                               "' (expected 'new' or 'check'; 'tessera plugins' lists plugins)");
  if (p.positional.size() < 3 || p.positional.size() > 4)
    throw UsageError("tessera plugin new: expected KIND NAME [DIR]");
  const std::string kind_name = p.positional[1], name = p.positional[2];
  const Kind *kind = nullptr;
  for (const Kind &k : kKinds)
    if (kind_name == k.name) kind = &k;
  if (!kind) {
    std::string known;
    for (const Kind &k : kKinds) known += std::string(known.empty() ? "" : ", ") + k.name;
    throw UsageError(
        "tessera plugin new: unknown kind '" + kind_name + "' (one of " + known +
        (kind_name == "zero" ? "; a ZeRO stage is best started from plugins/zero" : "") + ")");
  }
  if (!std::regex_match(name, std::regex("[a-z][a-z0-9_-]{0,63}")))
    throw UsageError("tessera plugin new: '" + name +
                     "' is not a plugin name: a lower-case letter, then up to 63 lower-case "
                     "letters, digits, '_' or '-'");
  return *kind;
}

// A name tessera already has for this kind would make one of the two
// libraries be refused at every start.
void check_name_free(const std::string &kind_name, const std::string &name) {
  Registry reg;
  reg.scan(Registry::search_dirs({}));
  for (const auto &e : reg.plugins())
    if (e.kind == kind_name && name == e.desc->name)
      throw std::runtime_error(std::string("tessera already has ") +
                               (kind_name == "optimizer" || kind_name == "offload" ? "an " : "a ") +
                               kind_name + " plugin named '" + name + "' (" + e.file +
                               "); pick another name");
}

// The templates' @KEY@ values for plugin `name` of `kind`.
std::map<std::string, std::string> template_vars(const Kind &kind, const std::string &name,
                                                 const std::string &prefix) {
  const std::string kind_name = kind.name;
  std::string target = "tsr_" + kind_name + "_" + name;
  for (char &c : target)
    if (c == '-') c = '_';
  const std::string version = TESSERA_VERSION;
  return {
      {"NAME", name},
      {"KIND", kind_name},
      {"TARGET", target},
      {"TESSERA_VERSION", version},
      {"TESSERA_VERSION_MAJOR_MINOR", version.substr(0, version.rfind('.'))},
      {"ABI_VERSION", std::to_string(TSR_ABI_MAJOR) + "." + std::to_string(TSR_ABI_MINOR)},
      {"ABOUT", trim_trailing_newlines(template_text(kind_name + "/about.md.in"))},
      {"GUIDE", kind.guide},
      {"PREFIX", prefix.empty() ? "PREFIX" : prefix},
  };
}

using FileList = std::vector<std::pair<std::string, std::string>>;  // out, template

// Writes each file of `files` into `dir` from its template; refuses to
// overwrite without --force.
void write_project(const fs::path &dir, const FileList &files,
                   const std::map<std::string, std::string> &vars, bool force) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw std::runtime_error(dir.string() + " exists and is not a directory");
  if (!force)
    for (const auto &[out, tpl] : files)
      if (fs::exists(dir / out, ec))
        throw std::runtime_error((dir / out).string() +
                                 " already exists; pick another DIR, or --force to overwrite");
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create " + dir.string() + ": " + ec.message());
  for (const auto &[out, tpl] : files) {
    const fs::path path = dir / out;
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << substitute(template_text(tpl), vars);
    f.close();
    if (!f) throw std::runtime_error("cannot write " + path.string());
  }
}

int plugin_new_body(const Parsed &p) {
  const Kind &kind = parse_kind_and_name(p);
  const std::string kind_name = kind.name, name = p.positional[2];
  check_name_free(kind_name, name);
  const fs::path dir = p.positional.size() == 4 ? fs::path(p.positional[3]) : fs::path(name);
  const std::string prefix = install_prefix();
  const FileList files = {
      {"CMakeLists.txt", "common/CMakeLists.txt.in"},
      {name + ".cpp", kind_name + "/plugin.cpp.in"},
      {name + ".toml", kind_name + "/config.toml.in"},
      {"README.md", "common/README.md.in"},
      {".gitignore", "common/gitignore.in"},
  };
  write_project(dir, files, template_vars(kind, name, prefix), p.has("--force"));

  std::printf("created %s plugin '%s' in %s:\n", kind_name.c_str(), name.c_str(),
              dir.string().c_str());
  for (const auto &[out, tpl] : files) std::printf("  %s\n", (dir / out).string().c_str());
  std::printf(
      "next:\n  cd %s\n  cmake -S . -B build -DCMAKE_PREFIX_PATH=%s\n"
      "  cmake --build build\n%s  tessera run %s.toml --plugin-path build\n",
      sh_quote(dir.string()).c_str(),
      prefix.empty() ? "<tessera install prefix>" : sh_quote(prefix).c_str(),
      kind_name == "model" ? ("  tessera plugin check " + name +
                              ".toml --plugin-path build   # gradients and ABI conventions\n")
                                 .c_str()
                           : "",
      name.c_str());
  if (prefix.empty())
    std::printf(
        "(this tessera is not an installed one: install it with\n"
        "  cmake --install <build dir> --prefix <tessera install prefix>)\n");
  return 0;
}

}  // namespace

int cmd_plugin(const Args &args) {
  if (!args.empty() && args[0] == "check") return cmd_plugin_check(args);
  return run_command("plugin", kPluginUsage, plugin_new_body, args,
                     {{"--force", false, false}, {"--help", false, false}, {"-h", false, false}});
}

}  // namespace tessera::cli
