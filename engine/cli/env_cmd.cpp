// tessera env: the environment report (cli/env_probe.hpp), as text or JSON.
#include <cstdio>
#include <iostream>
#include <string>

#include "cli/args.hpp"
#include "cli/env_probe.hpp"

namespace tessera::cli {

namespace {

const char *kEnvUsage = R"(usage: tessera env [--json] [--plugin-path DIR]...

Reports what this tessera was built with and what the machine gives it,
each line OK or missing, and for what is missing what to install:

  build     version, plugin ABI, compiler; CUDA and cuDNN support built in
  cuda      the CUDA driver and each GPU (name, memory, compute capability),
            the CUDA runtime, cuBLASLt, NCCL, cuDNN (found with dlopen: the
            report works on a machine without CUDA and says so), and
            whether runs can use CUDA
  cpu       the CPU, AVX2 and AVX-512, OpenBLAS's core and threads
  host      io_uring (offload 'nvme'), host memory
  plugins   the plugin path and every plugin found, with its library's ABI

It always exits 0: missing things are findings, not errors.

  --json              the same as one JSON object, for bug reports
  --plugin-path DIR   search DIR for plugins first (repeatable)
  -h, --help          this help
)";

int env_body(const Parsed &p) {
  if (!p.positional.empty())
    throw UsageError("tessera env: unexpected argument '" + p.positional[0] + "'");
  const EnvReport r = env_probe(p.all("--plugin-path"));
  if (p.has("--json")) {
    std::cout << env_json(r).dump(2) << std::endl;
    return 0;
  }
  std::string section;
  size_t width = 0;
  for (const auto &i : r.items) width = std::max(width, i.name.size());
  for (const auto &i : r.items) {
    if (i.section != section) {
      section = i.section;
      std::printf("%s%s:\n", &i == &r.items.front() ? "" : "\n", section.c_str());
    }
    std::printf("  %-7s %-*s %s\n", i.ok ? "OK" : "missing", static_cast<int>(width),
                i.name.c_str(), i.value.c_str());
    if (!i.fix.empty())
      std::printf("  %-7s %-*s install: %s\n", "", static_cast<int>(width), "", i.fix.c_str());
  }
  return 0;
}

}  // namespace

int cmd_env(const Args &args) {
  return run_command("env", kEnvUsage, env_body, args,
                     {{"--json", false, false},
                      {"--plugin-path", true, true},
                      {"--help", false, false},
                      {"-h", false, false}});
}

}  // namespace tessera::cli
