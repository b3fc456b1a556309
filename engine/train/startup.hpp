// What train() does once before its first step: the epoch arithmetic, the
// start-up lines, the memory report, and resuming from a checkpoint.
#pragma once

#include <nlohmann/json.hpp>

#include "train/step.hpp"
#include "train/trainer.hpp"

namespace tessera {

// How the data splits into steps, the same on every rank.
struct EpochPlan {
  tsr_sampler_args sampler{};  // this rank's sampler arguments (epoch set per epoch)
  int64_t epoch_size = 0;      // samples this rank sees per epoch
  int64_t per_step = 0;        // samples per optimizer step on this rank
  int64_t steps_per_epoch = 0;
  int64_t total = 0;  // steps the run takes
};

// Collective (ranks agree on the smallest steps per epoch).
EpochPlan plan_epochs(Session &s, const ProcessInfo &proc);

// The start-up lines (rank 0): model, steps, batch, device, collectives.
void print_startup(Session &s, const ProcessInfo &proc, const EpochPlan &e);

// Memory by purpose on every rank, measured from the allocator, beside
// docs/architecture.md's memory table for the stage. Collective: every rank calls it; rank 0
// prints. Returns the per-rank figures for summary.json.
nlohmann::json report_memory(Session &s);

// The loop's state at the start: fresh, or resumed from checkpoint.resume
// ("auto" or a path) or TESSERA_RESUME (set by the launcher on a restart).
TrainState start_state(Session &s, const EpochPlan &e);

// The optimizer's base learning rate, the peak of the schedule: what it
// answers through TSR_EXT_OPTIMIZER_LR (before ABI 1.2: its `lr` value).
double base_lr(Session &s);

// A value agreed by every rank (the maximum), through the run's collectives.
int64_t agree_max(Session &s, int64_t v, const char *what);

}  // namespace tessera
