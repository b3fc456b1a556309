// What `tessera env` reports (like DeepSpeed's ds_report): how this binary
// was built and what the machine gives it -- the CUDA driver and runtime,
// the GPUs, NCCL, cuDNN, cuBLASLt, io_uring, the CPU's vector units,
// OpenBLAS, host memory and the plugins. Every GPU library is probed with
// dlopen, never linked for the probe, so the report works on a machine
// without CUDA (and says so) whatever the build.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera::cli {

// One line of the report: a thing, whether it is there and usable, what was
// found, and what to install (or set) when it is not.
struct EnvItem {
  std::string section;  // "build", "cuda", "cpu", "memory", "plugins"
  std::string name;     // "CUDA driver", "GPU 0", "plugin model/mlp"
  bool ok = false;
  std::string value;    // what was found, or why it is missing
  std::string fix;      // what to install or set; "" when ok or nothing helps
  nlohmann::json data;  // the same facts for --json (versions as numbers, bytes)
};

struct EnvReport {
  std::vector<EnvItem> items;
};

// Probes everything; `plugin_paths` are the --plugin-path directories
// searched first. Never throws for a missing library: that is an item.
EnvReport env_probe(const std::vector<std::string> &plugin_paths);

// {"tessera": ..., "items": [{section, name, ok, value, fix, ...data}]}.
nlohmann::json env_json(const EnvReport &r);

}  // namespace tessera::cli
