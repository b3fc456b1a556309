// tessera config check and convert: a config validated and printed
// resolved, or a DeepSpeed JSON printed as TOML.
#include <spdlog/spdlog.h>

#include <iostream>
#include <string>

#include "cli/command_support.hpp"
#include "config/config.hpp"
#include "train/param_home.hpp"
#include "util/error.hpp"

namespace tessera::cli {

namespace {

const char *kConfigUsage = R"(usage: tessera config check CONFIG [options]
       tessera config convert DS.json

check    validates CONFIG against the engine's schema and every chosen
         plugin's declared parameters, then prints the resolved config
         (defaults filled in). Options: --set, --unset,
         --deepspeed_config, --model, --data, --plugin-path as for
         'tessera run'.
convert  prints the TOML equivalent of a DeepSpeed JSON config.
)";

int config_body(const Parsed &p) {
  if (p.positional.empty()) throw UsageError("tessera config: expected 'check' or 'convert'");
  std::string sub = p.positional[0];
  Parsed rest = p;
  rest.positional.erase(rest.positional.begin());
  if (sub == "check") {
    JobOptions o = job_options(rest, "config check");
    Job job = load_job(o, 1, true);
    // What the run refuses when it joins the plugins, refused here too.
    param_home_check(job);
    print_warnings(job);
    std::cout << "# resolved from " << o.config_path << " (valid)\n" << job.resolved_toml() << "\n";
    return 0;
  }
  if (sub == "convert") {
    if (rest.positional.size() != 1)
      throw UsageError("tessera config convert: expected one DeepSpeed JSON file");
    config::Document doc;
    doc.apply_deepspeed(rest.positional[0]);
    for (const auto &w : doc.warnings()) spdlog::warn("{}", w);
    std::cout << "# converted from " << rest.positional[0] << "\n"
              << config::to_toml(doc.root()) << "\n";
    return 0;
  }
  throw UsageError("tessera config: unknown subcommand '" + sub + "' (check, convert)");
}

}  // namespace

int cmd_config(const Args &given) {
  Args args;
  if (!deepspeed_forms(given, false, "config", kConfigUsage, &args)) return 2;
  return run_command("config", kConfigUsage, config_body, args, config_options());
}

}  // namespace tessera::cli
