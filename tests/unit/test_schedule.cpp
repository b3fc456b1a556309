// Learning-rate schedules against DeepSpeed's (deepspeed/runtime/
// lr_schedules.py): WarmupLR (log and linear ramps), WarmupDecayLR,
// WarmupCosineLR and OneCycle. The references below are written from
// DeepSpeed's get_lr() with last_batch_iteration = step, independently of
// schedule.cpp: warmup_num_steps clamped to at least 2, WarmupCosineLR's
// cosine counting from step - warmup + 1, and OneCycle's scale factor from
// batch_iteration = step + 1.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>

#include "config/settings.hpp"
#include "train/schedule.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_schedule {

namespace {

using tessera::schedule_lr;
using tessera::config::ScheduleSettings;

// WarmupLR._get_gamma / WarmupDecayLR._get_gamma.
double ds_warmup_gamma(int64_t it, int64_t warmup_num_steps, const std::string &warmup_type,
                       bool decay, int64_t total_num_steps) {
  const double w = static_cast<double>(std::max<int64_t>(2, warmup_num_steps));
  if (static_cast<double>(it) < w) {
    if (warmup_type == "log") return (1.0 / std::log(w)) * std::log(static_cast<double>(it + 1));
    return static_cast<double>(it) / w;
  }
  if (!decay) return 1.0;
  return std::max(0.0, static_cast<double>(total_num_steps - it) /
                           std::max(1.0, static_cast<double>(total_num_steps) - w));
}

// WarmupLR.get_lr: min_lr + delta_lr * gamma.
double ds_warmup_lr(int64_t it, double min_lr, double max_lr, int64_t warmup,
                    const std::string &type, bool decay = false, int64_t total = 0) {
  return min_lr + (max_lr - min_lr) * ds_warmup_gamma(it, warmup, type, decay, total);
}

// WarmupCosineLR.get_lr_ratio.
double ds_cosine_ratio(int64_t it, int64_t total_num_steps, double warmup_min_ratio,
                       int64_t warmup_num_steps, double cos_min_ratio,
                       const std::string &warmup_type) {
  const int64_t w = std::max<int64_t>(2, warmup_num_steps);
  if (it < w) {
    double ratio = warmup_type == "log"
                       ? (1.0 / std::log(static_cast<double>(w))) * std::log(it + 1.0)
                       : static_cast<double>(it) / static_cast<double>(w);
    return warmup_min_ratio + ratio * (1.0 - warmup_min_ratio);
  }
  double real_last_step = static_cast<double>(it - w + 1);
  double real_total_steps = static_cast<double>(std::max<int64_t>(1, total_num_steps - w));
  double progress = std::min(1.0, real_last_step / real_total_steps);
  double ratio = (1.0 + std::cos(M_PI * progress)) / 2.0;
  return std::max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * ratio);
}

// OneCycle.get_lr, as DeepSpeed computes it (floats, floor, step_ratio).
double ds_one_cycle_lr(int64_t it, double min_lr, double max_lr, int64_t first, int64_t second,
                       double decay_lr_rate, int64_t decay_step_size) {
  const double first_step_size = static_cast<double>(first);
  const double second_step_size = second > 0 ? static_cast<double>(second) : first_step_size;
  const double total_size = first_step_size + second_step_size;
  const double step_ratio = first_step_size / total_size;
  if (static_cast<double>(it) < total_size) {
    double batch_iteration = static_cast<double>(it + 1);
    double cycle = std::floor(1.0 + batch_iteration / total_size);
    double x = 1.0 + batch_iteration / total_size - cycle;
    double scale = x <= step_ratio ? x / step_ratio : (x - 1.0) / (step_ratio - 1.0);
    return min_lr + (max_lr - min_lr) * scale;
  }
  bool skip = decay_step_size == 0 || decay_lr_rate == 0.0;
  if (skip) return min_lr;
  double decay_batch_iteration = static_cast<double>(it) - total_size + 1.0;
  double decay_interval = decay_batch_iteration / static_cast<double>(decay_step_size);
  return min_lr / (1.0 + decay_lr_rate * decay_interval);
}

ScheduleSettings warmup(const std::string &type, int64_t steps, const std::string &ramp,
                        double min_lr = 0.0, int64_t total = 0) {
  ScheduleSettings s;
  s.type = type;
  s.warmup_steps = steps;
  s.warmup_type = ramp;
  s.warmup_min_lr = min_lr;
  s.total_steps = total;
  return s;
}

}  // namespace

TEST_CASE("constant keeps the optimizer's lr", "[schedule]") {
  ScheduleSettings s;
  s.type = "constant";
  for (int64_t step : {0, 1, 100, 100000}) CHECK(schedule_lr(s, 0.003, step, 1000) == 0.003);
}

TEST_CASE("warmup is DeepSpeed's WarmupLR", "[schedule]") {
  const double min_lr = 0.001, max_lr = 0.01;
  for (const std::string ramp : {"log", "linear"}) {
    for (int64_t w : {1, 2, 10, 37}) {
      ScheduleSettings s = warmup("warmup", w, ramp, min_lr);
      for (int64_t step = 0; step < 3 * w + 5; ++step) {
        INFO(ramp << " warmup " << w << " step " << step);
        CHECK(schedule_lr(s, max_lr, step, 1000) ==
              Approx(ds_warmup_lr(step, min_lr, max_lr, w, ramp)).epsilon(1e-12));
      }
    }
  }
  // The published shapes, spelled out for warmup 10.
  ScheduleSettings log = warmup("warmup", 10, "log", min_lr);
  CHECK(schedule_lr(log, max_lr, 0, 100) == Approx(min_lr));
  CHECK(schedule_lr(log, max_lr, 4, 100) ==
        Approx(min_lr + (max_lr - min_lr) * std::log(5.0) / std::log(10.0)));
  CHECK(schedule_lr(log, max_lr, 9, 100) == Approx(max_lr));
  CHECK(schedule_lr(log, max_lr, 10, 100) == Approx(max_lr));
  CHECK(schedule_lr(log, max_lr, 5000, 100) == Approx(max_lr));
  ScheduleSettings linear = warmup("warmup", 10, "linear", min_lr);
  CHECK(schedule_lr(linear, max_lr, 0, 100) == Approx(min_lr));
  CHECK(schedule_lr(linear, max_lr, 5, 100) == Approx(min_lr + (max_lr - min_lr) * 0.5));
  CHECK(schedule_lr(linear, max_lr, 9, 100) == Approx(min_lr + (max_lr - min_lr) * 0.9));
  CHECK(schedule_lr(linear, max_lr, 10, 100) == Approx(max_lr));
  // DeepSpeed clamps warmup_num_steps to 2: a 1-step warmup still starts at min.
  CHECK(schedule_lr(warmup("warmup", 1, "log", min_lr), max_lr, 0, 100) == Approx(min_lr));
  CHECK(schedule_lr(warmup("warmup", 1, "linear", min_lr), max_lr, 1, 100) ==
        Approx(min_lr + (max_lr - min_lr) * 0.5));
  // tessera's warmup_steps = 0: no warmup at all.
  CHECK(schedule_lr(warmup("warmup", 0, "log", min_lr), max_lr, 0, 100) == Approx(max_lr));
}

TEST_CASE("warmup_decay is DeepSpeed's WarmupDecayLR", "[schedule]") {
  const double min_lr = 0.0005, max_lr = 0.02;
  for (const std::string ramp : {"log", "linear"}) {
    for (int64_t w : {1, 10, 50}) {
      for (int64_t total : {60, 200}) {
        ScheduleSettings s = warmup("warmup_decay", w, ramp, min_lr, total);
        for (int64_t step = 0; step < total + 20; ++step) {
          INFO(ramp << " warmup " << w << " total " << total << " step " << step);
          CHECK(schedule_lr(s, max_lr, step, 99999) ==
                Approx(ds_warmup_lr(step, min_lr, max_lr, w, ramp, true, total)).epsilon(1e-12));
        }
      }
    }
  }
  // Linear decay to min_lr from the end of warmup to total_num_steps.
  ScheduleSettings s = warmup("warmup_decay", 10, "linear", 0.0, 110);
  CHECK(schedule_lr(s, 1.0, 10, 0) == Approx(1.0));
  CHECK(schedule_lr(s, 1.0, 60, 0) == Approx(0.5));
  CHECK(schedule_lr(s, 1.0, 110, 0) == Approx(0.0).margin(1e-15));
  CHECK(schedule_lr(s, 1.0, 500, 0) == Approx(0.0).margin(1e-15));
  // total_steps = 0: the run's total steps are the horizon.
  ScheduleSettings run_total = warmup("warmup_decay", 10, "linear", 0.0, 0);
  CHECK(schedule_lr(run_total, 1.0, 60, 110) == Approx(0.5));
}

TEST_CASE("warmup_cosine is DeepSpeed's WarmupCosineLR", "[schedule]") {
  const double lr = 0.004;
  for (const std::string ramp : {"log", "linear"}) {
    for (int64_t w : {1, 10, 40}) {
      for (double warmup_min_ratio : {0.0, 0.1}) {
        for (double cos_min_ratio : {0.0001, 0.2}) {
          const int64_t total = 120;
          ScheduleSettings s;
          s.type = "warmup_cosine";
          s.warmup_steps = w;
          s.warmup_type = ramp;
          s.warmup_min_ratio = warmup_min_ratio;
          s.cos_min_ratio = cos_min_ratio;
          s.total_steps = total;
          for (int64_t step = 0; step < total + 30; ++step) {
            INFO(ramp << " warmup " << w << " ratios " << warmup_min_ratio << "/" << cos_min_ratio
                      << " step " << step);
            double want =
                lr * ds_cosine_ratio(step, total, warmup_min_ratio, w, cos_min_ratio, ramp);
            CHECK(schedule_lr(s, lr, step, 99999) == Approx(want).epsilon(1e-12));
          }
        }
      }
    }
  }
  // Spelled out: warmup 10 (linear from 0.1), cosine over 100 steps to 0.01.
  ScheduleSettings s;
  s.type = "warmup_cosine";
  s.warmup_steps = 10;
  s.warmup_type = "linear";
  s.warmup_min_ratio = 0.1;
  s.cos_min_ratio = 0.01;
  s.total_steps = 0;  // the run's total
  CHECK(schedule_lr(s, 1.0, 0, 110) == Approx(0.1));
  CHECK(schedule_lr(s, 1.0, 5, 110) == Approx(0.1 + 0.9 * 0.5));
  // The first step after warmup is already one step into the cosine.
  CHECK(schedule_lr(s, 1.0, 10, 110) ==
        Approx(0.01 + 0.99 * (1 + std::cos(M_PI * 1.0 / 100.0)) / 2));
  CHECK(schedule_lr(s, 1.0, 59, 110) == Approx(0.01 + 0.99 * 0.5));
  CHECK(schedule_lr(s, 1.0, 109, 110) == Approx(0.01));
  CHECK(schedule_lr(s, 1.0, 1000, 110) == Approx(0.01));
}

TEST_CASE("one_cycle is DeepSpeed's OneCycle", "[schedule]") {
  const double lo = 0.001, hi = 0.01;
  struct Case {
    int64_t first, second;
    double decay_rate;
    int64_t decay_step;
  };
  for (Case c : {Case{10, 0, 0.0, 0}, Case{10, 20, 0.5, 5}, Case{7, 3, 0.1, 0},
                 Case{25, 25, 0.0, 4}, Case{1, 1, 1.0, 1}}) {
    ScheduleSettings s;
    s.type = "one_cycle";
    s.cycle_min_lr = lo;
    s.cycle_max_lr = hi;
    s.cycle_first_step_size = c.first;
    s.cycle_second_step_size = c.second;
    s.decay_lr_rate = c.decay_rate;
    s.decay_step_size = c.decay_step;
    const int64_t cycle = c.first + (c.second > 0 ? c.second : c.first);
    for (int64_t step = 0; step < 3 * cycle + 10; ++step) {
      INFO("first " << c.first << " second " << c.second << " decay " << c.decay_rate << "/"
                    << c.decay_step << " step " << step);
      double want = ds_one_cycle_lr(step, lo, hi, c.first, c.second, c.decay_rate, c.decay_step);
      CHECK(schedule_lr(s, 0.5, step, 1000) == Approx(want).epsilon(1e-12).margin(1e-15));
    }
  }
  // Spelled out: up over 10 steps, down over 20, then min / (1 + 0.5 * k / 5).
  ScheduleSettings s;
  s.type = "one_cycle";
  s.cycle_min_lr = 0.0;
  s.cycle_max_lr = 1.0;
  s.cycle_first_step_size = 10;
  s.cycle_second_step_size = 20;
  CHECK(schedule_lr(s, 0.5, 0, 0) == Approx(0.1));  // batch iteration 1 of 10
  CHECK(schedule_lr(s, 0.5, 9, 0) == Approx(1.0));  // the peak
  CHECK(schedule_lr(s, 0.5, 19, 0) == Approx(0.5));
  CHECK(schedule_lr(s, 0.5, 29, 0) == Approx(0.0).margin(1e-15));
  s.cycle_min_lr = 0.2;
  s.decay_lr_rate = 0.5;
  s.decay_step_size = 5;
  CHECK(schedule_lr(s, 0.5, 30, 0) == Approx(0.2 / (1 + 0.5 * 1 / 5.0)));
  CHECK(schedule_lr(s, 0.5, 39, 0) == Approx(0.2 / (1 + 0.5 * 10 / 5.0)));
  // cycle_max_lr = 0: the optimizer's lr is the peak.
  s.cycle_max_lr = 0.0;
  CHECK(schedule_lr(s, 0.5, 9, 0) == Approx(0.5));
}

}  // namespace unit_test_schedule
