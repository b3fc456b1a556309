#include "train/schedule.hpp"

#include <algorithm>
#include <cmath>

namespace tessera {

namespace {

// Fraction of warmup done at `step`: DeepSpeed's "log" ramp is
// log(step + 1) / log(warmup_steps), its "linear" ramp step / warmup_steps.
double warmup_gamma(const config::ScheduleSettings &s, int64_t step) {
  if (s.warmup_steps <= 0) return 1.0;
  if (s.warmup_type == "log")
    return s.warmup_steps > 1 ? std::log(static_cast<double>(step + 1)) /
                                    std::log(static_cast<double>(s.warmup_steps))
                              : 1.0;
  return static_cast<double>(step) / static_cast<double>(s.warmup_steps);
}

}  // namespace

double schedule_lr(const config::ScheduleSettings &s, double base_lr, int64_t step, int64_t total) {
  const int64_t horizon = s.total_steps > 0 ? s.total_steps : total;
  const std::string &t = s.type;
  if (t == "constant") return base_lr;
  if (t == "warmup" || t == "warmup_decay") {
    // WarmupLR / WarmupDecayLR: min_lr + (max_lr - min_lr) * gamma.
    double gamma;
    if (step < s.warmup_steps) {
      gamma = warmup_gamma(s, step);
    } else if (t == "warmup") {
      gamma = 1.0;
    } else {
      gamma =
          std::max(0.0, static_cast<double>(horizon - step) /
                            std::max<double>(1.0, static_cast<double>(horizon - s.warmup_steps)));
    }
    return s.warmup_min_lr + (base_lr - s.warmup_min_lr) * gamma;
  }
  if (t == "warmup_cosine") {
    // WarmupCosineLR: ratios of the optimizer's lr.
    double ratio;
    if (step < s.warmup_steps) {
      ratio = s.warmup_min_ratio + (1.0 - s.warmup_min_ratio) * warmup_gamma(s, step);
    } else {
      double span = std::max<double>(1.0, static_cast<double>(horizon - s.warmup_steps));
      double progress = std::min(1.0, static_cast<double>(step - s.warmup_steps) / span);
      double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
      ratio = s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cosine;
    }
    return base_lr * ratio;
  }
  if (t == "one_cycle") {
    // OneCycle: min -> max over the first step size, back over the second,
    // then min_lr / (1 + decay_rate * intervals).
    double lo = s.cycle_min_lr, hi = s.cycle_max_lr > 0 ? s.cycle_max_lr : base_lr;
    int64_t up = s.cycle_first_step_size;
    int64_t down = s.cycle_second_step_size > 0 ? s.cycle_second_step_size : up;
    if (step <= up) return lo + (hi - lo) * static_cast<double>(step) / static_cast<double>(up);
    if (step <= up + down)
      return hi - (hi - lo) * static_cast<double>(step - up) / static_cast<double>(down);
    if (s.decay_step_size <= 0 || s.decay_lr_rate <= 0) return lo;
    double intervals =
        static_cast<double>(step - up - down) / static_cast<double>(s.decay_step_size);
    return lo / (1.0 + s.decay_lr_rate * intervals);
  }
  return base_lr;
}

}  // namespace tessera
