// Dynamic loss scaling for fp16 (DeepSpeed's DynamicLossScaler semantics):
// the loss is multiplied by `scale` before backward so small gradients
// survive fp16; a step whose gradients overflow is skipped, and after
// `hysteresis` consecutive overflows the scale halves (never below the
// minimum); after `window` steps without overflow it doubles. bf16 and fp32
// runs use a fixed scale of 1.
#pragma once

#include <cstdint>
#include <string>

#include "config/settings.hpp"

namespace tessera {

struct LossScaler {
  bool dynamic = false;
  double scale = 1;
  double min_scale = 1;
  int64_t window = 1000;
  int64_t hysteresis = 2;       // configured
  int64_t hysteresis_left = 2;  // overflows left before the scale halves
  int64_t good_steps = 0;       // steps since the last overflow (or change)
  int64_t skipped = 0;          // overflowing steps skipped so far

  // From run.precision and [fp16]: fp16 with loss_scale = 0 is dynamic,
  // a fixed loss_scale is static, bf16/fp32 are 1.
  static LossScaler from(const config::Settings &st);

  // Records one step's outcome. On overflow returns false (skip the step)
  // and may halve the scale; throws once an overflow happens at the
  // minimum scale (the run cannot make progress). `step` names the step in
  // messages.
  bool update(bool overflow, int64_t step);
};

}  // namespace tessera
