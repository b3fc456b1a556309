// `tessera plugin check` (docs/writing-a-model.md): what a model plugin's
// author gets wrong, found on one small batch before any training run.
//  - gradients: every trainable parameter tensor's analytic gradient
//    (backward) against central finite differences of the forward loss;
//  - the ABI's conventions: struct sizes kept and not overrun, every
//    declared group read, grads_done once per group and no gradient taken
//    after it, forward deterministic for the same batch and parameters.
// It runs on a Session built for the CPU in fp32 with ZeRO stage 0, where
// the parameters and gradients are plain host memory it can perturb and
// read.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "train/session.hpp"

namespace tessera {

struct GradCheckOptions {
  int64_t max_elements = 24;  // per tensor (half the largest gradients, half at random); 0: all
  double tolerance = 1e-2;    // relative error above which a tensor fails
  uint64_t seed = 1;          // which elements are drawn
};

// One parameter tensor's verdict.
struct TensorCheck {
  std::string name;
  std::vector<int64_t> shape;
  size_t numel = 0, checked = 0;
  bool trainable = true;
  double step = 0;       // the finite-difference step h
  double rel_error = 0;  // |numeric - analytic|_2 / max(|numeric|_2, |analytic|_2) over `checked`
  // fp32's resolution of a numeric derivative at this step: the loss's
  // rounding noise (GradCheckReport::loss_noise) over the step, per element.
  double floor = 0;
  // |numeric - analytic|_2 over what passes: tolerance * max(|numeric|_2,
  // |analytic|_2) + floor * sqrt(checked). Above 1 fails.
  double excess = 0;
  // The gradients are within 10x of `floor`: the check cannot see an error
  // smaller than the noise there (a larger init scale makes them larger).
  bool near_noise = false;
  std::vector<int64_t> worst_index;  // the element with the largest |numeric - analytic|
  double worst_analytic = 0, worst_numeric = 0;
  bool ok = true;
};

// A check of the conventions: its verdict and a line saying what was seen
// (and, when it failed, what to change).
struct ConventionCheck {
  std::string what;  // "struct sizes", "groups", "grads_done", "forward"
  bool ok = true;
  std::string detail;
};

struct GradCheckReport {
  std::vector<ConventionCheck> conventions;
  std::vector<TensorCheck> tensors;
  double loss = 0;        // the batch's mean loss
  double loss_noise = 0;  // how much fp32 rounding moves it (measured)
  // Indices into `tensors` in the order backward first took their gradients.
  std::vector<size_t> backward_order;
  bool ok() const;
  // The failing tensor nearest the bug: a wrong gradient flows from where
  // it enters to every tensor backward computes after it, so the one whose
  // excess jumps most over the tensor backward computed just before it;
  // -1 when every tensor passes.
  int blamed() const;
  // The failure to name on the command's last line ("" when all passed).
  std::string first_failure(double tolerance) const;
};

// Runs every check on `batch`. `on_tensor` sees each tensor as it is done
// (the checks of a large model take a while). The session must be a
// training session on the CPU in fp32 under ZeRO stage 0 with one rank.
GradCheckReport check_model(Session &s, const tsr_batch &batch, const GradCheckOptions &o,
                            const std::function<void(const TensorCheck &)> &on_tensor = {});

}  // namespace tessera
