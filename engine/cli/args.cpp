#include "cli/args.hpp"

#include <spdlog/spdlog.h>

#include <cstdio>

#include "util/error.hpp"

namespace tessera::cli {

const std::vector<std::string> &Parsed::all(const std::string &name) const {
  static const std::vector<std::string> none;
  auto it = values.find(name);
  return it == values.end() ? none : it->second;
}

Parsed parse_args(const Args &args, const std::vector<OptionSpec> &specs,
                  const std::string &command) {
  Parsed p;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &a = args[i];
    if (a.size() < 2 || a[0] != '-' || a == "-") {
      p.positional.push_back(a);
      continue;
    }
    if (a == "--") {
      for (size_t j = i + 1; j < args.size(); ++j) p.positional.push_back(args[j]);
      break;
    }
    std::string name = a, value;
    bool inline_value = false;
    if (auto eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      inline_value = true;
    }
    const OptionSpec *spec = nullptr;
    for (const auto &s : specs)
      if (s.name == name) spec = &s;
    if (!spec)
      throw UsageError("tessera " + command + ": unknown option '" + name + "' (see --help)");
    if (spec->takes_value) {
      if (!inline_value) {
        if (i + 1 >= args.size())
          throw UsageError("tessera " + command + ": " + name + " needs a value");
        value = args[++i];
      }
    } else if (inline_value) {
      throw UsageError("tessera " + command + ": " + name + " takes no value");
    }
    auto &v = p.values[name];
    if (!spec->repeatable && !v.empty() && spec->takes_value)
      throw UsageError("tessera " + command + ": " + name + " given twice");
    v.push_back(value);
  }
  return p;
}

std::vector<OptionSpec> config_options() {
  return {{"--set", true, true},
          {"--unset", true, true},
          {"--deepspeed_config", true, false},
          {"--model", true, false},
          {"--data", true, false},
          {"--plugin-path", true, true},
          {"--local_rank", true, false},
          {"--local-rank", true, false},
          {"--help", false, false},
          {"-h", false, false},
          {"--verbose", false, false}};
}

int run_command(const std::string &command, const char *usage, int (*body)(const Parsed &),
                const Args &args, const std::vector<OptionSpec> &specs) {
  try {
    Parsed p = parse_args(args, specs, command);
    if (p.has("--help") || p.has("-h")) {
      std::fputs(usage, stdout);
      return 0;
    }
    if (p.has("--verbose")) spdlog::set_level(spdlog::level::debug);
    return body(p);
  } catch (const UsageError &e) {
    std::fprintf(stderr, "%s\n\n%s", error_for_user(e).c_str(), usage);
    return 2;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "tessera %s: error: %s\n", command.c_str(), error_for_user(e).c_str());
    return 1;
  }
}

}  // namespace tessera::cli
