// One optimizer step (docs/architecture.md, "One training step"), in the order it runs:
//
//   train_step = micro_step (next batch, forward, backward) per micro-batch
//              + apply_update (finish grads, grad norm, clip, lr, the update
//                of every owned range where its state lives, re-share)
//
// The trainer drives the update itself: it walks the zero plugin's owned
// ranges and hands each to the offload backend. With a backend of ABI 1.2
// the update may still be running when train_step returns; the next
// forward waits only for the group it is about to use (train/
// update_flight.hpp), and the gradients are cleared just before the next
// backward. Each pass of the model gets a step handle made for it, told
// where the step stands (train/model_pass.hpp): the step's meaning travels
// in that value, not in fields of the session.
#pragma once

#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "data/loader.hpp"
#include "train/loss_scale.hpp"
#include "train/observe.hpp"
#include "train/report.hpp"
#include "train/session.hpp"

namespace tessera {

// Where the loop stands: everything train() carries from step to step.
struct TrainState {
  using Clock = std::chrono::steady_clock;
  int64_t step = 0;      // optimizer steps done
  int64_t total = 0;     // steps this run takes
  int64_t epoch = 0;     // current epoch
  int64_t in_epoch = 0;  // steps taken in the current epoch
  int64_t samples = 0;   // samples seen, over all ranks
  LossScaler scaler;
  double lr = 0;  // of the last update
  // The last step's global gradient norm (unscaled), where the step
  // computed it (clipping, fp16); NaN where not.
  double grad_norm = NAN;
  // The interval since the last progress line.
  double interval_loss = 0;
  int64_t interval_steps = 0, interval_samples = 0;
  double last_loss = NAN;  // mean over the last interval and all ranks
  Clock::time_point train_start, interval_start;
  // The last update's gradients are still to be cleared (before the next
  // backward, once the offload backend has read them).
  bool grads_dirty = false;
  bool stopped = false;  // by a signal
  EvalResult last_eval;
  int64_t last_eval_step = -1;  // -1: none yet
  std::string ckpt_path;        // the last checkpoint written
};

// What every step uses and the run fixes: the session, the observer that
// times the parts, the settings, the base lr.
struct StepPlan {
  Session &s;
  RunObserver &obs;
  const config::Settings &st;
  double lr0;
  // Decay segments of each owned range (by flat offset): fixed for the
  // run, so worked out once rather than every step.
  std::map<size_t, std::vector<tsr_segment>> segments;
  // This step's owned ranges and which were handed over early, during
  // backward (see early_start in step.cpp).
  std::vector<tsr_owned_range> ranges;
  std::vector<char> started;
  // A speculative round is open (step.cpp, speculates): the offload
  // backend awaits the verdict once the norm is known.
  bool speculating = false;
};

// One optimizer step over `accumulation` micro-batches from `loader`;
// returns its loss (the mean over this rank's samples).
double train_step(StepPlan &p, TrainState &ts, Loader &loader);

// Where a micro-batch stands in its step: what its backward pass is told
// (train/model_pass.hpp, PassPhase).
struct MicroBatch {
  uint32_t index = 0;  // within the step
  bool last = true;    // the step's last micro-batch
  // Set when the update starts during this backward (early_start in
  // step.cpp): called with each group whose gradients are final.
  std::function<tsr_status(uint32_t)> grads_final;
};

// Forward and backward of one micro-batch; returns its share of the step's
// loss.
double micro_step(StepPlan &p, TrainState &ts, Loader &loader, const MicroBatch &mb);

// The update after the step's last backward, given the step's loss.
void apply_update(StepPlan &p, TrainState &ts, double loss);

}  // namespace tessera
