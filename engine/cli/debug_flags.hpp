// `tessera run`'s --debug-rank, --debug-wait and --debug-with
// (docs/debugging.md).
#pragma once

#include <cstdint>
#include <vector>

#include "cli/args.hpp"
#include "train/job.hpp"

namespace tessera::cli {

// The options, for cmd_run's parser.
std::vector<OptionSpec> debug_option_specs();

// Turns the options into the TESSERA_DEBUG_* variables, for this process
// and the workers it starts (which therefore take no --debug-* arguments).
// `world` bounds the ranks when the launcher knows it (0: not yet known).
void export_debug_flags(const Parsed &p, int world);

// In every process that trains: when the job is a debug job, suspends its
// timeouts in `job`; when `rank` is one to debug, waits for a debugger.
void start_debug_job(Job &job, uint32_t rank, uint32_t world);

}  // namespace tessera::cli
