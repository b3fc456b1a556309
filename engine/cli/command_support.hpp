// What the commands that read a config share (commands.cpp defines them;
// config_cmd.cpp uses them too).
#pragma once

#include <string>

#include "cli/args.hpp"
#include "cli/cli.hpp"
#include "train/job.hpp"

namespace tessera::cli {

// The config, DeepSpeed JSON, --model/--data, --set/--unset and plugin paths
// a command's arguments name.
JobOptions job_options(const Parsed &p, const std::string &command);
// The job's config notes, warnings and plugin refusals, once per job (not
// again in a launcher's workers).
void print_warnings(const Job &job);
// DeepSpeed's forms of `args` in tessera's, the mappings printed once;
// false after printing a usage error.
bool deepspeed_forms(const Args &args, bool launcher, const char *command, const char *usage,
                     Args *out);

}  // namespace tessera::cli
