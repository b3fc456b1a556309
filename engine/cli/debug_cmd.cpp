// debug vscode: VS Code debug configurations for tessera.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli/args.hpp"
#include "debug/vscode_launch.hpp"
#include "util/text.hpp"

namespace tessera::cli {

namespace {

namespace fs = std::filesystem;

const char *kDebugUsage = R"(usage: tessera debug vscode [DIR] [--force]

Writes DIR/.vscode/launch.json (DIR: the current directory by default) with
two configurations for VS Code's C/C++ extension (cppdbg):

  tessera: launch (one process)   runs 'tessera run configs/quickstart.toml'
                                  under gdb; edit "args" for your config
  tessera: attach to a rank       attaches to a rank of
                                  'tessera run -n N CONFIG --debug-rank R'
                                  (pick the pid the rank prints)

"program" is this tessera binary. An existing launch.json is left alone
unless --force is given: VS Code keeps every configuration in that one
file, so merge by hand (the template is docs/vscode/launch.json) to keep
yours. docs/debugging.md walks through both.

  --force                   replace an existing .vscode/launch.json
  -h, --help                this help
)";

int debug_body(const Parsed &p) {
  if (p.positional.empty() || p.positional[0] != "vscode")
    throw UsageError("tessera debug: expected 'vscode'");
  if (p.positional.size() > 2) throw UsageError("tessera debug vscode: expected at most one DIR");
  const fs::path dir = p.positional.size() == 2 ? fs::path(p.positional[1]) : fs::path(".");
  const fs::path file = dir / ".vscode" / "launch.json";
  if (fs::exists(file) && !p.has("--force"))
    throw std::runtime_error(file.string() +
                             " exists; --force replaces it (or merge the configurations of "
                             "docs/vscode/launch.json into it by hand)");
  std::string text = vscode_launch_json();
  const std::string placeholder = kVscodeProgramPlaceholder, exe = self_exe();
  for (size_t at; (at = text.find(placeholder)) != std::string::npos;)
    text.replace(at, placeholder.size(), exe);
  fs::create_directories(file.parent_path());
  std::ofstream out(file, std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw std::runtime_error("cannot write " + file.string());
  std::printf("wrote %s (program: %s)\n", file.string().c_str(), exe.c_str());
  return 0;
}

}  // namespace

int cmd_debug(const Args &args) {
  return run_command("debug", kDebugUsage, debug_body, args,
                     {{"--force", false, false}, {"--help", false, false}, {"-h", false, false}});
}

}  // namespace tessera::cli
