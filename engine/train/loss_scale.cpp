#include "train/loss_scale.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "util/error.hpp"

namespace tessera {

LossScaler LossScaler::from(const config::Settings &st) {
  LossScaler s;
  if (st.precision != "fp16") return s;
  const auto &f = st.fp16;
  if (f.loss_scale > 0) {
    s.scale = f.loss_scale;  // static: never changes, overflowing steps still skip
    s.min_scale = f.loss_scale;
    return s;
  }
  s.dynamic = true;
  s.scale = std::ldexp(1.0, static_cast<int>(f.initial_scale_power));
  s.min_scale = std::max(f.min_loss_scale, 1e-30);
  s.window = f.loss_scale_window;
  s.hysteresis = s.hysteresis_left = std::max<int64_t>(1, f.hysteresis);
  return s;
}

bool LossScaler::update(bool overflow, int64_t step) {
  if (!overflow) {
    ++good_steps;
    if (dynamic && good_steps % window == 0) {
      scale *= 2;
      hysteresis_left = hysteresis;
    }
    return true;
  }
  ++skipped;
  good_steps = 0;
  if (!dynamic) {
    spdlog::warn("step {}: gradients overflowed at the fixed loss scale {}; step skipped", step,
                 scale);
    return false;
  }
  if (hysteresis_left > 1) {
    --hysteresis_left;
    spdlog::warn(
        "step {}: gradients overflowed at loss scale {}; step skipped (the scale halves "
        "after {} more)",
        step, scale, hysteresis_left);
    return false;
  }
  if (scale <= min_scale)
    throw Error(TSR_ERR_INVALID,
                "step " + std::to_string(step) +
                    ": gradients overflow even at the minimum loss "
                    "scale fp16.min_loss_scale = " +
                    std::to_string(min_scale) +
                    "; the run cannot continue in fp16 (try run.precision = \"bf16\", a lower "
                    "optimizer.lr, or run.gradient_clipping)");
  const double old = scale;
  scale = std::max(scale / 2, min_scale);
  spdlog::warn("step {}: gradients overflowed at loss scale {}; step skipped, scale now {}", step,
               old, scale);
  return false;
}

}  // namespace tessera
