// One pass of the model (forward or backward) as the engine hands it to the
// plugin: the step handle (tsr_step) is made for that pass, with the phase
// the step is in, so the views and callbacks the model calls answer for
// that pass alone and nothing of the session changes meaning mid-step.
#pragma once

#include <tessera/tessera.h>

#include <functional>
#include <utility>

#include "host/host.hpp"

namespace tessera {

struct Session;  // train/session.hpp

// Where the step stands during one pass.
struct PassPhase {
  // Which pass: stage 3 prefetches the next group in its direction.
  bool backward = false;
  // The step's last micro-batch: the zero plugin's grads_done(last_micro).
  bool last_micro = true;
  // The gradient buffers hold zeros (cleared just before this backward):
  // the grads_zeroed callback tells the model its first contribution may
  // overwrite them (ABI 1.5).
  bool grads_zero = false;
  // Set where the update starts during backward (train/step.cpp,
  // early_start): called with each group after the zero plugin's
  // grads_done on the last micro-batch, once the group's gradients are
  // final.
  std::function<tsr_status(uint32_t)> grads_final;
  // Where training stands (ABI 1.9 step_position): the steps completed
  // before this pass (skipped fp16 steps too) and its micro-batch.
  uint64_t update = 0;
  uint32_t micro = 0;
};

// A forward pass's phase; a backward pass's, with what it is told.
inline PassPhase forward_phase(bool last_micro = true) {
  PassPhase p;
  p.last_micro = last_micro;
  return p;
}
inline PassPhase backward_phase(bool last_micro, bool grads_zero = false,
                                std::function<tsr_status(uint32_t)> grads_final = nullptr) {
  PassPhase p;
  p.backward = true;
  p.last_micro = last_micro;
  p.grads_zero = grads_zero;
  p.grads_final = std::move(grads_final);
  return p;
}

// The step handle of one pass: views of parameter i and its gradient
// through the zero plugin (which knows where each group lives now), and the
// groups' done callbacks, all answering for `phase`. Valid while the
// session lives; handle() points into this object, so it stays put while
// the model runs.
class ModelPass {
 public:
  ModelPass(Session &s, PassPhase phase);
  tsr_step *handle() { return host_.step_handle(&hooks); }
  // What the handle calls; a check may wrap them (check/gradcheck.cpp).
  StepHooks hooks;

 private:
  Host &host_;
};

}  // namespace tessera
