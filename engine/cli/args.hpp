// A small argument parser shared by the commands: options with values
// (--set k=v, --set=k=v), flags, and positional arguments.
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/cli.hpp"

namespace tessera::cli {

struct OptionSpec {
  std::string name;  // "--set"
  bool takes_value;  // false for flags
  bool repeatable;
};

struct Parsed {
  std::vector<std::string> positional;
  std::map<std::string, std::vector<std::string>> values;
  bool has(const std::string &name) const { return values.count(name) != 0; }
  std::string get(const std::string &name, const std::string &fallback = "") const {
    auto it = values.find(name);
    return it == values.end() || it->second.empty() ? fallback : it->second.back();
  }
  const std::vector<std::string> &all(const std::string &name) const;
};

// Throws UsageError on unknown options or missing values.
Parsed parse_args(const Args &args, const std::vector<OptionSpec> &specs,
                  const std::string &command);

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Runs a command body, turning exceptions into a message on stderr and an
// exit status (2 for usage, 1 for everything else).
int run_command(const std::string &command, const char *usage, int (*body)(const Parsed &),
                const Args &args, const std::vector<OptionSpec> &specs);

// Options shared by commands that read a config.
std::vector<OptionSpec> config_options();

}  // namespace tessera::cli
