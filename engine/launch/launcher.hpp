// `tessera run -n N`: starts N workers of this binary, prefixes their
// output with the rank, serves the rendezvous store, and supervises them.
#pragma once

#include <string>
#include <vector>

namespace tessera {

// Why a job failed, for the run's summary.json: the launcher's verdict and
// the rank it names (-1 when none: a signal, or the head stopped us).
struct LaunchOutcome {
  std::string reason;
  int failed_rank = -1;
};

struct LaunchOptions {
  int nproc = 1;         // workers on this node (-n)
  int nnodes = 1;        // --nnodes
  int node_rank = 0;     // --node-rank
  std::string master;    // --master host:port ("" on one node: loopback, a free port)
  double grace_s = 30;   // after a SIGINT/SIGTERM: time to save before SIGKILL
  int max_restarts = 0;  // --max-restarts: restarts from the latest checkpoint
  // --watch-stdin (a node launcher started over ssh by --hostfile): end of
  // input (the ssh session died, or the head launcher closed it) stops the
  // workers as SIGTERM does; a "stop" line stops them at once (another node
  // failed).
  bool watch_stdin = false;
  // comm.interface (or GLOO_SOCKET_IFNAME): node 0 serves the store on its
  // address ("" : see store_listen_address).
  std::string interface;
  // --job-secret-file: the rendezvous store's secret (docs/security.md); ""
  // takes TESSERA_JOB_SECRET, the head's over stdin, or makes one.
  std::string job_secret_file;
  // Filled in when the job fails (may be null).
  LaunchOutcome *outcome = nullptr;
};

// Runs the job; returns the launcher's exit status (0 when every worker
// succeeded). `worker_args` are the arguments after `tessera`.
int launch(const LaunchOptions &opt, const std::vector<std::string> &worker_args);

}  // namespace tessera
