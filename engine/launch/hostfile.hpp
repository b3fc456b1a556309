// `tessera run --hostfile FILE`: DeepSpeed's hostfile format, its
// --include/--exclude/--num_nodes/--num_gpus selection, and the environment
// a node launcher started over ssh receives.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

// One host of a hostfile, in file order: `worker-1 slots=4`.
struct HostSlots {
  std::string host;
  std::vector<int> slots;  // slot (GPU) indices kept on this host: 0..N-1 unless filtered
  int line = 0;            // where the hostfile named it
};

// Reads `host slots=N` lines; `#` starts a comment, blank lines are skipped.
// A malformed line, a host named twice or a file without hosts throws
// ConfigError naming FILE:LINE.
std::vector<HostSlots> parse_hostfile(const std::string &path);

// DeepSpeed's selection: --include or --exclude ("host1:0,2@host2": hosts
// separated by '@', optional slot lists after ':'), or --num_nodes (the
// first N hosts) and --num_gpus (the first N slots of each); -1: not given.
// A selection naming an unknown host or slot, or leaving nothing, throws.
std::vector<HostSlots> select_hosts(std::vector<HostSlots> hosts, const std::string &include,
                                    const std::string &exclude, int num_nodes, int num_gpus);

// KEY=VALUE lines of a .tessera_env file (like DeepSpeed's .deepspeed_env):
// '#' comments and blank lines skipped, an optional `export ` prefix, a
// value optionally in single or double quotes. Throws naming FILE:LINE.
std::vector<std::pair<std::string, std::string>> read_env_file(const std::string &path);

// What a node launcher started over ssh gets in its environment, in order
// (later entries win): ~/.tessera_env, ./.tessera_env, then the variables of
// this process named NCCL_*, GLOO_*, TESSERA_* (but the launcher's own), and
// those named by --env NAME (or set by --env NAME=VALUE). `notes` receives
// one line per file read.
std::vector<std::pair<std::string, std::string>> forwarded_env(
    const std::vector<std::string> &env_opts, std::vector<std::string> *notes);

// `text` quoted for a POSIX shell (single quotes, unless it needs none).
std::string shell_quote(const std::string &text);

// Splits TESSERA_SSH_OPTS / --ssh-opts into words: whitespace separates,
// single and double quotes group.
std::vector<std::string> split_words(const std::string &text);

}  // namespace tessera
