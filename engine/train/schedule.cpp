#include "train/schedule.hpp"

#include <algorithm>
#include <cmath>

namespace tessera {

// `step` plays the part of DeepSpeed's last_batch_iteration: schedule_lr(s,
// lr, k, total) is what DeepSpeed's scheduler get_lr() returns after k + 1
// calls of scheduler.step() (deepspeed/runtime/lr_schedules.py).

namespace {

// DeepSpeed clamps warmup_num_steps to at least 2 (log(1) would divide by
// zero); tessera's warmup_steps = 0 means no warmup at all.
int64_t warmup_span(const config::ScheduleSettings &s) {
  return s.warmup_steps <= 0 ? 0 : std::max<int64_t>(2, s.warmup_steps);
}

// Fraction of warmup done at `step` (< warmup_span): DeepSpeed's "log" ramp
// is log(step + 1) / log(warmup), its "linear" ramp step / warmup.
double warmup_gamma(const config::ScheduleSettings &s, int64_t warmup, int64_t step) {
  if (s.warmup_type == "log")
    return std::log(static_cast<double>(step + 1)) / std::log(static_cast<double>(warmup));
  return static_cast<double>(step) / static_cast<double>(warmup);
}

}  // namespace

double schedule_lr(const config::ScheduleSettings &s, double base_lr, int64_t step, int64_t total) {
  const int64_t horizon = s.total_steps > 0 ? s.total_steps : total;
  const int64_t warmup = warmup_span(s);
  const std::string &t = s.type;
  if (t == "constant") return base_lr;
  if (t == "warmup" || t == "warmup_decay") {
    // WarmupLR / WarmupDecayLR: min_lr + (max_lr - min_lr) * gamma.
    double gamma;
    if (step < warmup) {
      gamma = warmup_gamma(s, warmup, step);
    } else if (t == "warmup") {
      gamma = 1.0;
    } else {
      gamma = std::max(0.0, static_cast<double>(horizon - step) /
                                std::max(1.0, static_cast<double>(horizon - warmup)));
    }
    return s.warmup_min_lr + (base_lr - s.warmup_min_lr) * gamma;
  }
  if (t == "warmup_cosine") {
    // WarmupCosineLR: ratios of the optimizer's lr; the cosine starts one
    // step into the decay (real_last_step = step - warmup + 1).
    double ratio;
    if (step < warmup) {
      ratio = s.warmup_min_ratio + (1.0 - s.warmup_min_ratio) * warmup_gamma(s, warmup, step);
    } else {
      double span = std::max(1.0, static_cast<double>(horizon - warmup));
      double progress = std::min(1.0, static_cast<double>(step - warmup + 1) / span);
      double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
      ratio = std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cosine);
    }
    return base_lr * ratio;
  }
  if (t == "one_cycle") {
    // OneCycle: batch iteration b = step + 1 climbs min -> max over the
    // first step size and back over the second (b = up + down lands on
    // min); after the cycle, min_lr / (1 + decay_rate * intervals) with
    // intervals = (step - cycle + 1) / decay_step_size.
    double lo = s.cycle_min_lr, hi = s.cycle_max_lr > 0 ? s.cycle_max_lr : base_lr;
    int64_t up = s.cycle_first_step_size;
    int64_t down = s.cycle_second_step_size > 0 ? s.cycle_second_step_size : up;
    int64_t cycle = up + down;
    if (step < cycle) {
      int64_t b = step + 1;
      double scale = b <= up ? static_cast<double>(b) / static_cast<double>(up)
                             : static_cast<double>(cycle - b) / static_cast<double>(down);
      return lo + (hi - lo) * scale;
    }
    if (s.decay_step_size <= 0 || s.decay_lr_rate <= 0) return lo;
    double intervals =
        static_cast<double>(step - cycle + 1) / static_cast<double>(s.decay_step_size);
    return lo / (1.0 + s.decay_lr_rate * intervals);
  }
  return base_lr;
}

}  // namespace tessera
