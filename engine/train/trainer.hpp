// The training loop and evaluation (docs/architecture.md, "One training step").
#pragma once

#include <string>

#include "train/job.hpp"
#include "train/report.hpp"
#include "train/session.hpp"

namespace tessera {

struct ProcessInfo {
  uint32_t rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  // The collectives of a multi-process job (null: a world of one).
  Comm *comm = nullptr;
  std::string transport;  // how the ranks exchange data, for the start-up report
  // The compute device, once chosen (choose_device; before the rendezvous,
  // since NCCL needs the GPU selected).
  DLDevice device{kDLCPU, 0};
  bool device_chosen = false;
};

// Where this process sits in the job, from the launcher's variables
// (RANK/WORLD_SIZE/LOCAL_RANK..., torchrun, mpirun, Slurm) and --local_rank.
ProcessInfo process_info(int cli_local_rank);

// The host facts for this process, checked against the config.
Host::RunFacts run_facts(const Job &job, const ProcessInfo &proc);
// Per-process set-up before a session: CPU threads per rank.
void prepare_process(const Job &job, const ProcessInfo &proc);

// Trains the job; returns the summary (also written to summary.json).
nlohmann::json train(const Job &job, const ProcessInfo &proc);

// Evaluates `session`'s model on its eval data (or train data when there is
// none), every rank a share, summed over ranks.
EvalResult evaluate(Session &s, int64_t batch_size);

// Loads a checkpoint into a frozen model and evaluates it; with `ckpt` "",
// the model's own initial weights (its init_from file, else its declared
// initialisers).
nlohmann::json evaluate_checkpoint(const Job &job, const ProcessInfo &proc,
                                   const std::string &ckpt);

}  // namespace tessera
