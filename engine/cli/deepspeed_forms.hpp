// DeepSpeed's command-line forms onto tessera's own, before the options are
// parsed (docs/distributed.md, "DeepSpeed's launcher options"): a user's
// `deepspeed --num_gpus 2 ... --deepspeed --deepspeed_config ds.json` works
// as `tessera run --num_gpus 2 --deepspeed --deepspeed_config ds.json`.
#pragma once

#include <string>
#include <vector>

#include "cli/cli.hpp"

namespace tessera::cli {

struct DeepSpeedForms {
  Args args;                       // the arguments in tessera's forms
  std::vector<std::string> notes;  // one line per mapping, printed once at start
  std::string visible_devices;     // CUDA_VISIBLE_DEVICES for the workers; "": unchanged
};

// Maps `args` (those after the command's name). Everywhere: `--deepspeed`
// alone (DeepSpeed's switch) is dropped, `--deepspeed FILE.json` is
// `--deepspeed_config FILE.json`. With `launcher` (tessera run), and
// without --hostfile: `--num_gpus N`, `--include localhost:0,1` and
// `--exclude localhost:1` become `-n K` and the devices the workers see,
// `--num_nodes 1` is dropped (more nodes need a hostfile); with or without
// it, `--master_addr A [--master_port P]` becomes `--master A:P`.
// `cuda_visible` is the CUDA_VISIBLE_DEVICES now (null: unset); slot
// numbers index it, as DeepSpeed's do. Throws UsageError (cli/args.hpp)
// for a form that cannot be mapped, saying what to write instead.
DeepSpeedForms map_deepspeed_forms(const Args &args, bool launcher, const char *cuda_visible);

}  // namespace tessera::cli
