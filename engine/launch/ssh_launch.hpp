// `tessera run --hostfile FILE`: the head launcher. It starts one node
// launcher per host over ssh (`tessera run --nnodes M --node-rank R
// --master HOST:PORT -n SLOTS --watch-stdin ...`, in the same working
// directory, with the forwarded environment), copies their output prefixed
// with the host, and supervises them: when one node fails, the others are
// stopped, and the exit names the host and the rank.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "launch/hostfile.hpp"

namespace tessera {

struct SshLaunchOptions {
  std::vector<HostSlots> hosts;                          // after --include/--exclude/--num_*
  std::string master;                                    // HOST:PORT node 0 serves the store on
  int ssh_port = 0;                                      // --ssh-port (0: ssh's own default)
  std::vector<std::string> ssh_opts;                     // TESSERA_SSH_OPTS, then --ssh-opts
  std::vector<std::pair<std::string, std::string>> env;  // forwarded_env()
  double grace_s = 30;   // after Ctrl-C or SIGTERM (as the node launchers')
  bool dry_run = false;  // print each node's ssh command and exit
  // The rendezvous store's secret, sent as "secret VALUE" on each node
  // launcher's standard input (docs/security.md).
  std::string job_secret;
};

// The ssh command line (argv) that starts node `node` of the job;
// `node_args` are the node launchers' arguments after `tessera run`.
std::vector<std::string> ssh_command(const SshLaunchOptions &opt, size_t node,
                                     const std::vector<std::string> &node_args);

// Runs the job; returns the exit status (0 when every node succeeded).
int launch_over_ssh(const SshLaunchOptions &opt, const std::vector<std::string> &node_args);

}  // namespace tessera
