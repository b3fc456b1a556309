// Learning-rate schedules with DeepSpeed's names and semantics.
#pragma once

#include <cstdint>

#include "config/settings.hpp"

namespace tessera {

// The learning rate for optimizer step `step` (0-based: the first update
// uses step 0), with `base_lr` the optimizer's lr and `total` the run's
// number of steps.
double schedule_lr(const config::ScheduleSettings &s, double base_lr, int64_t step, int64_t total);

}  // namespace tessera
