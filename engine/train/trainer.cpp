// The training loop (docs/architecture.md, "One training step"): train() is a short loop of
// step, log, eval and save; the step itself is train/step.cpp, and what
// happens once before the first step is train/startup.cpp.
#include "train/trainer.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "backend/cpu/cpu_ops.hpp"
#include "ckpt/checkpoint.hpp"
#include "debug/fault.hpp"
#include "train/device_select.hpp"
#include "train/startup.hpp"
#include "train/step.hpp"
#include "util/error.hpp"
#include "util/spin_policy.hpp"

namespace fs = std::filesystem;

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

// Set by SIGTERM/SIGINT (preemption): the run saves a checkpoint and ends.
volatile sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) {
  g_stop_signal = sig;
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

size_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<size_t>(ru.ru_maxrss) * 1024;
}

// The parts of a run the loop hands around.
struct Loop {
  Session &s;
  StepPlan &plan;
  Reporter &rep;
  RunObserver &obs;
  const config::Settings &st;
  const ProcessInfo &proc;
};

void run_eval(Loop &l, TrainState &ts) {
  auto timed = l.obs.time(Part::eval, "eval");
  const auto t0 = Clock::now();
  ts.last_eval = evaluate(l.s, l.st.micro_batch);
  ts.last_eval_step = ts.step;
  l.rep.eval(ts.step, ts.epoch, ts.last_eval);
  // Evaluation time is not training time.
  ts.train_start += Clock::now() - t0;
  ts.interval_start += Clock::now() - t0;
}

void save(Loop &l, TrainState &ts) {
  auto timed = l.obs.time(Part::checkpoint, "checkpoint");
  RunPosition at{ts.step,    ts.epoch,          ts.in_epoch,
                 ts.samples, l.st.global_batch, static_cast<uint64_t>(l.st.seed)};
  if (l.st.precision == "fp16") {
    at.loss_scale = ts.scaler.scale;
    at.scale_good_steps = ts.scaler.good_steps;
    at.scale_hysteresis = ts.scaler.hysteresis_left;
    at.scale_skipped = ts.scaler.skipped;
  }
  ts.ckpt_path = save_checkpoint(l.s.checkpoint_parts(), at, l.st.ckpt_dir, l.st.ckpt_keep,
                                 l.s.job.resolved_toml());
}

// The progress line and metrics of the interval since the last one.
void log_interval(Loop &l, TrainState &ts) {
  const double dt = seconds_since(ts.interval_start);
  // The loss of the whole job: each rank's mean over its samples, averaged
  // over ranks (equal shares).
  double mean = ts.interval_loss / static_cast<double>(ts.interval_steps);
  if (l.proc.world_size > 1) {
    int64_t one = 1;
    DLTensor t{&mean, DLDevice{kDLCPU, 0}, 1, DLDataType{kDLFloat, 64, 1}, &one, nullptr, 0};
    plugin_ok(l.s.host,
              l.s.host.table()->comm->all_reduce(l.s.host.ctx(), &t, TSR_REDUCE_AVG, nullptr),
              "average the loss over ranks");
  }
  ts.last_loss = mean;
  nlohmann::json extra = l.obs.at_log(ts.interval_steps);
  if (std::isfinite(ts.grad_norm)) extra["grad_norm"] = ts.grad_norm;  // the last step's
  l.rep.progress(ts.step, ts.epoch, ts.last_loss, ts.lr,
                 dt > 0 ? static_cast<double>(ts.interval_samples) / dt : 0,
                 seconds_since(ts.train_start), extra);
  ts.interval_loss = 0;
  ts.interval_steps = 0;
  ts.interval_samples = 0;
  ts.interval_start = Clock::now();
  l.obs.restart_interval();
}

// After each step: log, evaluate, save as configured; and preemption, where
// every rank agrees on the step to stop at (checked every step alone, every
// 4 steps across ranks to keep collectives few).
void after_step(Loop &l, TrainState &ts, double loss) {
  maybe_crash(l.proc.rank, ts.step, FaultPoint::step_end);
  ts.interval_loss += loss;
  ++ts.interval_steps;
  if (ts.step % l.st.log_every == 0 || ts.step == ts.total) log_interval(l, ts);
  if (l.st.eval_every > 0 && ts.step % l.st.eval_every == 0) run_eval(l, ts);
  if (l.st.ckpt_every > 0 && ts.step % l.st.ckpt_every == 0 && ts.step < ts.total) save(l, ts);
  if ((l.proc.world_size == 1 || ts.step % 4 == 0) && ts.step < ts.total &&
      agree_max(l.s, g_stop_signal, "agree on stopping") != 0)
    ts.stopped = true;
}

// The loader of the current epoch, past the steps a resume has done already.
std::unique_ptr<Loader> open_epoch(Loop &l, EpochPlan &e, TrainState &ts) {
  auto timed = l.obs.time(Part::data, "data: new epoch");
  e.sampler.epoch = ts.epoch;
  std::vector<int64_t> indices(static_cast<size_t>(e.epoch_size));
  plugin_ok(l.s.host, l.s.sampler.vt->indices(l.s.sampler.self, &e.sampler, indices.data()),
            "[sampler] indices");
  ts.in_epoch = std::min(ts.in_epoch, e.steps_per_epoch);
  indices.erase(indices.begin(), indices.begin() + ts.in_epoch * e.per_step);
  return std::make_unique<Loader>(l.s.host, l.s.train_data.vt, l.s.train_data.self, l.s.train_info,
                                  std::move(indices), l.st.micro_batch, false,
                                  static_cast<int>(l.st.workers), static_cast<int>(l.st.prefetch),
                                  "data.train");
}

// summary.json's fields (the observer adds the run report).
nlohmann::json run_summary(Loop &l, const TrainState &ts, double train_s, double wall_s) {
  const auto &st = l.st;
  MemoryStats mem = l.s.host.memory();
  nlohmann::json peak = nlohmann::json::object();
  for (int p = 0; p < TSR_MEM_PURPOSE_COUNT; ++p)
    peak[purpose_name(p)] = mem.peak[static_cast<size_t>(p)];
  const bool have_eval = ts.last_eval_step >= 0;
  nlohmann::json summary = {
      {"name", st.name},
      {"status", ts.stopped ? "stopped" : "completed"},
      {"steps", ts.step},
      {"epochs", ts.epoch},
      {"samples", ts.samples},
      {"world_size", l.proc.world_size},
      {"zero", l.s.zero.name},
      {"train_loss", ts.last_loss},
      {"eval_loss", have_eval ? nlohmann::json(ts.last_eval.loss) : nlohmann::json(nullptr)},
      {"eval_accuracy", have_eval && ts.last_eval.accuracy >= 0
                            ? nlohmann::json(ts.last_eval.accuracy)
                            : nlohmann::json(nullptr)},
      {"samples_per_s", train_s > 0 ? static_cast<double>(ts.samples) / train_s : 0.0},
      {"train_s", train_s},
      {"wall_s", wall_s},
      {"peak_memory_bytes", mem.peak_total},
      {"peak_memory_by_purpose", peak},
      {"peak_rss_bytes", peak_rss_bytes()},
      {"parameters", l.s.layout.numel},
      {"checkpoint", ts.ckpt_path},
      {"device", describe_device(l.s.host.facts().device)},
      {"precision", st.precision},
  };
  if (st.precision == "fp16") {
    summary["loss_scale"] = ts.scaler.scale;
    summary["skipped_steps"] = ts.scaler.skipped;
  }
  return summary;
}

// The end of the run: a last evaluation and checkpoint, the summary.
nlohmann::json finish(Loop &l, TrainState &ts, const nlohmann::json &memory_by_rank,
                      Clock::time_point t_start) {
  const double train_s = seconds_since(ts.train_start);
  flight_settle(l.s.flight);
  if (ts.stopped) {
    save(l, ts);
    if (l.proc.rank == 0) {
      std::printf(
          "tessera: stopped by a signal at step %lld; checkpoint saved to %s (resume with "
          "checkpoint.resume = \"auto\")\n",
          static_cast<long long>(ts.step), ts.ckpt_path.c_str());
      std::fflush(stdout);
    }
  } else {
    if (ts.last_eval_step != ts.step) run_eval(l, ts);
    if (l.st.ckpt_final) save(l, ts);
  }
  nlohmann::json summary = run_summary(l, ts, train_s, seconds_since(t_start));
  summary["memory_at_start_by_rank"] = memory_by_rank;
  l.obs.finish(summary);  // collective
  l.rep.write_summary(summary);
  l.rep.print_summary(summary);
  return summary;
}

}  // namespace

Host::RunFacts run_facts(const Job &job, const ProcessInfo &proc) {
  const auto &st = job.settings;
  Host::RunFacts f;
  f.rank = proc.rank;
  f.world_size = proc.world_size;
  f.local_rank = proc.local_rank;
  f.local_world_size = proc.local_world_size;
  f.device =
      proc.device_chosen ? proc.device : choose_device(st, proc.local_rank, proc.local_world_size);
  f.precision = st.precision == "bf16"   ? TSR_PRECISION_BF16
                : st.precision == "fp16" ? TSR_PRECISION_FP16
                                         : TSR_PRECISION_FP32;
  f.seed = static_cast<uint64_t>(st.seed);
  f.run_dir = st.dir;
  f.comm = proc.comm;
  f.max_gpu_memory = st.max_gpu_memory;
  return f;
}

void prepare_process(const Job &job, const ProcessInfo &proc) {
  // Threads per rank: run.threads, else the cores shared among local ranks.
  int64_t t = job.settings.threads;
  if (t == 0) {
    // The cores this process may run on (taskset, cgroups via affinity),
    // not every core of the machine.
    cpu_set_t set;
    CPU_ZERO(&set);
    unsigned cores = sched_getaffinity(0, sizeof set, &set) == 0
                         ? static_cast<unsigned>(CPU_COUNT(&set))
                         : std::thread::hardware_concurrency();
    cores = std::max(1u, cores);
    t = std::max<int64_t>(1, cores / std::max<uint32_t>(1, proc.local_world_size));
  }
  // The CPU pool and the shared-memory barrier spin only while this node's
  // threads (ranks x threads per rank) fit the cores.
  spin_set_local_ranks(std::max<uint32_t>(1, proc.local_world_size));
  cpu_ops_set_threads(static_cast<int>(t));
}

nlohmann::json train(const Job &job, const ProcessInfo &proc) {
  const auto t_start = Clock::now();
  const auto &st = job.settings;
  std::error_code ec;
  fs::create_directories(st.dir, ec);
  if (ec) throw Error(TSR_ERR_IO, st.dir + ": cannot create run directory: " + ec.message());
  prepare_process(job, proc);
  Session s(job, run_facts(job, proc), true);
  if (proc.rank == 0) std::ofstream(st.dir + "/config.toml") << job.resolved_toml();
  EpochPlan epochs = plan_epochs(s, proc);
  Reporter rep(st.dir, proc.rank == 0, epochs.total);
  print_startup(s, proc, epochs);
  const nlohmann::json memory_by_rank = report_memory(s);
  RunObserver obs(job, s, epochs.total);  // [log]: breakdown, trace, run report
  StepPlan plan{s, obs, st, base_lr(s), {}, {}, {}};
  Loop loop{s, plan, rep, obs, st, proc};
  TrainState ts = start_state(s, epochs);
  install_stop_handlers();
  ts.train_start = ts.interval_start = Clock::now();
  while (ts.step < ts.total && !ts.stopped) {
    std::unique_ptr<Loader> loader = open_epoch(loop, epochs, ts);
    while (ts.in_epoch < epochs.steps_per_epoch && ts.step < ts.total && !ts.stopped)
      after_step(loop, ts, train_step(plan, ts, *loader));
    if (ts.stopped) break;
    if (st.eval_every == 0) run_eval(loop, ts);  // at the end of every epoch
    if (ts.in_epoch >= epochs.steps_per_epoch) {
      ++ts.epoch;
      ts.in_epoch = 0;
    }
  }
  return finish(loop, ts, memory_by_rank, t_start);
}

}  // namespace tessera
