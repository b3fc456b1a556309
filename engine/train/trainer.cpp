// The training loop (DESIGN.md, "The step").
#include "train/trainer.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "ckpt/checkpoint.hpp"
#include "data/loader.hpp"
#include "ops/cpu_ops.hpp"
#include "train/device_select.hpp"
#include "train/fault.hpp"
#include "train/loss_scale.hpp"
#include "train/model_file.hpp"
#include "train/observe.hpp"
#include "train/schedule.hpp"
#include "util/error.hpp"

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

// A value agreed by every rank (the maximum), through the run's collectives.
int64_t agree_max(Session &s, int64_t v, const char *what) {
  if (s.host.facts().world_size == 1) return v;
  int64_t one = 1;
  DLTensor t{&v, DLDevice{kDLCPU, 0}, 1, DLDataType{kDLInt, 64, 1}, &one, nullptr, 0};
  plugin_ok(s.host, s.host.table()->comm->all_reduce(s.host.ctx(), &t, TSR_REDUCE_MAX, nullptr),
            what);
  return v;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

size_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<size_t>(ru.ru_maxrss) * 1024;
}

// The optimizer's base learning rate: every optimizer declares `lr`.
double base_lr(const Job &job) {
  const auto &v = job.plugin("optimizer").values;
  if (auto x = v["lr"].value<double>()) return *x;
  throw Error(TSR_ERR_CONFIG, "[optimizer] plugin '" +
                                  std::string(job.plugin("optimizer").entry->desc->name) +
                                  "' declares no 'lr' parameter; the schedule needs one");
}

// What the zero plugin and offload backend see of one optimizer step.
struct UpdateCtx {
  Session *s;
  double lr = 0, grad_scale = 1;
  int64_t step = 0;
  // Decay segments of each owned range (by flat offset): fixed for the run,
  // so they are worked out once rather than every step.
  std::map<size_t, std::vector<tsr_segment>> segments;
};

tsr_status update_range(void *p, const tsr_owned_range *r) {
  trace::Span span(trace::Stream::offload, "offload step");
  auto *u = static_cast<UpdateCtx *>(p);
  Session &s = *u->s;
  auto it = u->segments.find(r->flat_offset);
  if (it == u->segments.end())
    it = u->segments.emplace(r->flat_offset, s.layout.segments(r->flat_offset, r->count)).first;
  const std::vector<tsr_segment> &segs = it->second;
  tsr_offload_step os{};
  os.struct_size = sizeof os;
  os.offset = r->owned_offset;
  os.count = r->count;
  os.grads = r->grads;
  os.params = r->params;
  os.segments = segs.data();
  os.num_segments = segs.size();
  os.lr = u->lr;
  os.grad_scale = u->grad_scale;
  os.step = u->step;
  return s.offload.vt->step(s.offload.self, &os);
}

tsr_status flush_updates(void *p) {
  auto *u = static_cast<UpdateCtx *>(p);
  return u->s->offload.vt->flush(u->s->offload.self);
}

// Memory by purpose on every rank, measured from the allocator, beside
// DESIGN.md's table for the stage. Collective: every rank calls it; rank 0
// prints. Returns the per-rank figures for summary.json.
nlohmann::json report_memory(Session &s) {
  const auto &f = s.host.facts();
  MemoryStats m = s.host.memory();
  int64_t mine[4] = {static_cast<int64_t>(m.current[TSR_MEM_PARAMS]),
                     static_cast<int64_t>(m.current[TSR_MEM_GRADS]),
                     static_cast<int64_t>(m.current[TSR_MEM_OPTIMIZER]),
                     static_cast<int64_t>(m.current[TSR_MEM_COMM] + m.current[TSR_MEM_OTHER])};
  std::vector<int64_t> all(4 * f.world_size);
  int64_t four = 4, n = static_cast<int64_t>(all.size());
  DLTensor in{mine, DLDevice{kDLCPU, 0}, 1, DLDataType{kDLInt, 64, 1}, &four, nullptr, 0};
  DLTensor out{all.data(), DLDevice{kDLCPU, 0}, 1, DLDataType{kDLInt, 64, 1}, &n, nullptr, 0};
  plugin_ok(s.host, s.host.table()->comm->all_gather(s.host.ctx(), &in, &out, nullptr),
            "gather memory figures");
  nlohmann::json by_rank = nlohmann::json::array();
  const char *stage = s.zero.name.c_str();
  auto mib = [](double b) { return b / 1048576.0; };
  for (uint32_t r = 0; r < f.world_size; ++r) {
    const int64_t *x = &all[4 * r];
    by_rank.push_back({{"rank", r},
                       {"parameters", x[0]},
                       {"gradients", x[1]},
                       {"optimizer", x[2]},
                       {"buffers", x[3]}});
    if (f.rank == 0)
      std::printf(
          "tessera: memory on rank %u (%s): parameters %.2f MiB, gradients %.2f MiB, "
          "optimizer state %.2f MiB, buffers %.2f MiB\n",
          r, stage, mib(static_cast<double>(x[0])), mib(static_cast<double>(x[1])),
          mib(static_cast<double>(x[2])), mib(static_cast<double>(x[3])));
  }
  if (f.rank == 0) {
    // DESIGN.md's table: compute-dtype bytes per parameter and gradient,
    // and the fp32 master plus the optimizer's state arrays; divided by the
    // world where the stage partitions them.
    const double psi = static_cast<double>(s.layout.total), w = f.world_size;
    const double states = 1 + s.state_count;
    const double cb = static_cast<double>(s.compute_bytes());
    const std::string b = std::to_string(s.compute_bytes());
    const std::string p_rule = s.plan.partition_params ? b + "Psi/N + live groups" : b + "Psi";
    const std::string g_rule = s.plan.partition_grads ? b + "Psi/N + buckets" : b + "Psi";
    std::printf(
        "tessera: expected for %s at %u ranks (DESIGN.md, %s, Psi = %.0f): parameters %.2f MiB "
        "(%s), gradients %.2f MiB (%s), optimizer state %.2f MiB (%s)\n",
        stage, f.world_size, s.job.settings.precision.c_str(), psi,
        mib(cb * psi / (s.plan.partition_params ? w : 1)), p_rule.c_str(),
        mib(cb * psi / (s.plan.partition_grads ? w : 1)), g_rule.c_str(),
        mib(4 * states * psi / (s.plan.partition_optimizer ? w : 1)),
        s.plan.partition_optimizer ? "4(1+k)Psi/N" : "4(1+k)Psi");
    std::fflush(stdout);
  }
  return by_rank;
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
  f.comm_state = proc.comm_state;
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
  cpu_ops_set_threads(static_cast<int>(t));
}

nlohmann::json train(const Job &job, const ProcessInfo &proc) {
  auto t_start = Clock::now();
  const auto &st = job.settings;
  std::error_code ec;
  fs::create_directories(st.dir, ec);
  if (ec) throw Error(TSR_ERR_IO, st.dir + ": cannot create run directory: " + ec.message());
  prepare_process(job, proc);
  Session s(job, run_facts(job, proc), true);
  const bool primary = proc.rank == 0;
  if (primary) std::ofstream(st.dir + "/config.toml") << job.resolved_toml();

  // Steps per epoch: whole optimizer steps only; the rest of an epoch is
  // dropped so every rank takes the same number of steps.
  tsr_sampler_args sargs{};
  sargs.struct_size = sizeof sargs;
  sargs.dataset_size = s.train_info.length;
  sargs.rank = proc.rank;
  sargs.world_size = proc.world_size;
  sargs.seed = static_cast<uint64_t>(st.seed);
  int64_t epoch_size = 0;
  plugin_ok(s.host, s.sampler.vt->epoch_size(s.sampler.self, &sargs, &epoch_size),
            "[sampler] epoch_size");
  const int64_t per_step = st.micro_batch * st.accumulation;
  int64_t steps_per_epoch = epoch_size / per_step;
  if (proc.world_size > 1) {
    // Every rank must take the same number of steps (a sampler may give
    // ranks unequal shares): the smallest wins.
    int64_t one = 1;
    DLTensor t{
        &steps_per_epoch, DLDevice{kDLCPU, 0}, 1, DLDataType{kDLInt, 64, 1}, &one, nullptr, 0};
    plugin_ok(s.host, s.host.table()->comm->all_reduce(s.host.ctx(), &t, TSR_REDUCE_MIN, nullptr),
              "agree on steps per epoch");
  }
  if (steps_per_epoch == 0)
    throw Error(TSR_ERR_CONFIG, "the training data gives this rank " + std::to_string(epoch_size) +
                                    " samples per epoch, fewer than one step needs (micro " +
                                    std::to_string(st.micro_batch) + " x accumulation " +
                                    std::to_string(st.accumulation) + ")");
  const int64_t total = st.steps > 0 ? st.steps : st.epochs * steps_per_epoch;
  if (total <= 0)
    throw Error(TSR_ERR_CONFIG, "[run] needs 'steps' or 'epochs' (how long to train)");
  const double lr0 = base_lr(job);

  Reporter rep(st.dir, primary, total);
  if (primary) {
    std::printf(
        "tessera: model %s (%zu parameters, %zu groups), %lld steps of %lld samples "
        "(micro %lld x accumulation %lld x world %u), %lld steps per epoch\n",
        s.model.name.c_str(), s.layout.numel, s.layout.group_offset.size(),
        static_cast<long long>(total), static_cast<long long>(st.global_batch),
        static_cast<long long>(st.micro_batch), static_cast<long long>(st.accumulation),
        proc.world_size, static_cast<long long>(steps_per_epoch));
    std::printf("tessera: device %s, precision %s\n",
                describe_device(s.host.facts().device).c_str(), st.precision.c_str());
    if (!proc.transport.empty()) std::printf("tessera: collectives: %s\n", proc.transport.c_str());
  }
  nlohmann::json memory_by_rank = report_memory(s);

  tsr_step *step_ctx = s.step_handle();
  UpdateCtx uctx{&s, 0, 1, 0, {}};
  tsr_zero_step zstep{sizeof(tsr_zero_step), update_range, flush_updates, &uctx};

  int64_t step = 0, epoch = 0, samples = 0;
  double interval_loss = 0, last_loss = NAN;
  int64_t interval_steps = 0, interval_samples = 0;
  auto interval_start = Clock::now(), train_start = Clock::now();
  EvalResult last_eval;
  bool have_eval = false;
  int64_t last_eval_step = -1;
  std::string ckpt_path;
  RunObserver obs(job, s, total);  // [log]: breakdown, trace, run report

  auto run_eval = [&](int64_t at_step) {
    auto timed = obs.time(Part::eval, "eval");
    auto t0 = Clock::now();
    last_eval = evaluate(s, st.micro_batch);
    have_eval = true;
    last_eval_step = at_step;
    rep.eval(at_step, epoch, last_eval);
    // Evaluation time is not training time.
    train_start += Clock::now() - t0;
    interval_start += Clock::now() - t0;
  };
  LossScaler scaler = LossScaler::from(st);
  // Resume: from checkpoint.resume ("auto" or a path), or TESSERA_RESUME
  // when the launcher restarts the job after a failure.
  int64_t in_epoch = 0;  // steps taken in the current epoch
  std::string resume = st.resume;
  if (const char *r = std::getenv("TESSERA_RESUME")) resume = r;
  if (!resume.empty()) {
    std::string path = resolve_checkpoint(resume, st.ckpt_dir);
    if (!path.empty()) {
      TrainState ts = load_checkpoint(s, path);
      step = ts.step;
      epoch = ts.epoch;
      samples = ts.samples;
      in_epoch = ts.batch_in_epoch;
      if (ts.loss_scale > 0 && scaler.dynamic) {
        scaler.scale = ts.loss_scale;
        scaler.good_steps = ts.scale_good_steps;
        scaler.hysteresis_left = std::max<int64_t>(1, ts.scale_hysteresis);
        scaler.skipped = ts.scale_skipped;
      }
      if (ts.global_batch != st.global_batch) {
        // Another global batch: continue after the same samples of the epoch.
        int64_t consumed = ts.batch_in_epoch * ts.global_batch;
        if (consumed % st.global_batch != 0)
          throw Error(TSR_ERR_CONFIG,
                      path + " stopped " + std::to_string(consumed) +
                          " samples into its epoch, not a whole number of steps at global batch " +
                          std::to_string(st.global_batch));
        in_epoch = consumed / st.global_batch;
      }
      if (primary) {
        std::printf("tessera: resumed from %s at step %lld (epoch %lld, %lld steps into it)\n",
                    path.c_str(), static_cast<long long>(step), static_cast<long long>(epoch),
                    static_cast<long long>(in_epoch));
        std::fflush(stdout);
      }
    } else if (primary && resume == "auto") {
      std::printf("tessera: no checkpoint in %s yet; starting fresh\n", st.ckpt_dir.c_str());
    }
  }
  auto save = [&](int64_t at_step) {
    auto timed = obs.time(Part::checkpoint, "checkpoint");
    TrainState ts{at_step, epoch,           in_epoch,
                  samples, st.global_batch, static_cast<uint64_t>(st.seed)};
    if (st.precision == "fp16") {
      ts.loss_scale = scaler.scale;
      ts.scale_good_steps = scaler.good_steps;
      ts.scale_hysteresis = scaler.hysteresis_left;
      ts.scale_skipped = scaler.skipped;
    }
    ckpt_path = save_checkpoint(s, ts, st.ckpt_dir, st.ckpt_keep, job.resolved_toml());
  };
  install_stop_handlers();
  bool stopped = false;

  while (step < total) {
    auto epoch_data = obs.time(Part::data, "data: new epoch");
    sargs.epoch = epoch;
    std::vector<int64_t> indices(static_cast<size_t>(epoch_size));
    plugin_ok(s.host, s.sampler.vt->indices(s.sampler.self, &sargs, indices.data()),
              "[sampler] indices");
    // After a resume, this epoch's first steps are done already.
    const int64_t skip = std::min(in_epoch, steps_per_epoch);
    indices.erase(indices.begin(), indices.begin() + skip * per_step);
    Loader loader(s.host, s.train_data.vt, s.train_data.self, s.train_info, std::move(indices),
                  st.micro_batch, false, static_cast<int>(st.workers),
                  static_cast<int>(st.prefetch), "data.train");
    epoch_data.stop();
    for (int64_t b = skip; b < steps_per_epoch && step < total && !stopped; ++b) {
      obs.begin_step(step + 1);
      double step_loss = 0;
      for (int64_t m = 0; m < st.accumulation; ++m) {
        auto data_t = obs.time(Part::data, "data wait");
        const tsr_batch *batch = loader.next();
        data_t.stop();
        if (!batch) throw Error(TSR_ERR_INTERNAL, "loader ran out of batches mid-epoch");
        s.last_micro = (m == st.accumulation - 1) ? 1 : 0;
        s.backward = false;
        tsr_forward_result res{};
        res.struct_size = sizeof res;
        auto fwd_t = obs.time(Part::forward, "forward");
        plugin_ok(s.host, s.model.vt->forward(s.model.self, step_ctx, batch, 1, &res),
                  "[model] forward");
        plugin_ok(s.host, s.zero.vt->end_pass(s.zero.self), "[zero] end_pass");
        fwd_t.stop();
        if (res.count <= 0)
          throw Error(TSR_ERR_INVALID, "[model] forward counted no targets in a batch");
        // The step's loss is the mean over its samples: each micro-batch's
        // summed loss is scaled by 1 / (its count x accumulation), and the
        // zero plugin averages over ranks.
        double scale =
            1.0 / (static_cast<double>(res.count) * static_cast<double>(st.accumulation));
        s.backward = true;
        auto bwd_t = obs.time(Part::backward, "backward");
        plugin_ok(s.host,
                  s.model.vt->backward(s.model.self, step_ctx, batch,
                                       static_cast<float>(scale * scaler.scale)),
                  "[model] backward");
        plugin_ok(s.host, s.zero.vt->end_pass(s.zero.self), "[zero] end_pass");
        bwd_t.stop();
        step_loss += res.loss_sum * scale;
        samples += batch->size * proc.world_size;
        interval_samples += batch->size * proc.world_size;
      }
      auto comm_t = obs.time(Part::comm_wait, "finish_grads");
      plugin_ok(s.host, s.zero.vt->finish_grads(s.zero.self), "[zero] finish_grads");
      comm_t.stop();
      const bool fp16 = st.precision == "fp16";
      if (!std::isfinite(step_loss) && !fp16)
        throw Error(TSR_ERR_INVALID, "loss is " + std::to_string(step_loss) + " at step " +
                                         std::to_string(step + 1) +
                                         "; lower optimizer.lr or set run.gradient_clipping");
      // Clip by the global L2 norm over all ranks; in fp16 the same norm
      // (of the scaled gradients) detects overflow on any rank.
      auto opt_t = obs.time(Part::optimizer, "optimizer step");
      double clip = 1.0;
      bool overflow = false;
      if (st.gradient_clipping > 0 || fp16) {
        double sq = 0;
        plugin_ok(s.host, s.zero.vt->grad_norm_sq(s.zero.self, &sq), "[zero] grad norm");
        overflow = !std::isfinite(sq) || !std::isfinite(step_loss);
        double norm = std::sqrt(sq) / scaler.scale;
        if (!overflow && st.gradient_clipping > 0 && norm > st.gradient_clipping)
          clip = st.gradient_clipping / (norm + 1e-6);
      }
      uctx.lr = schedule_lr(st.schedule, lr0, step, total);
      uctx.grad_scale = clip / scaler.scale;
      uctx.step = step + 1 - scaler.skipped;
      if (scaler.update(overflow, step + 1)) {
        uctx.step = step + 1 - scaler.skipped;
        plugin_ok(s.host, s.zero.vt->step(s.zero.self, &zstep), "[zero] step");
      } else {
        // Skipped: no update, but the zero plugin still clears the
        // gradients (and re-shares the unchanged parameters).
        tsr_zero_step skip{sizeof(tsr_zero_step),
                           [](void *, const tsr_owned_range *) -> tsr_status { return TSR_OK; },
                           flush_updates, &uctx};
        plugin_ok(s.host, s.zero.vt->step(s.zero.self, &skip), "[zero] step (skipped)");
        if (!std::isfinite(step_loss)) step_loss = 0;
      }
      opt_t.stop();
      ++step;
      in_epoch = b + 1;
      maybe_crash(proc.rank, step, FaultPoint::step_end);
      interval_loss += step_loss;
      ++interval_steps;
      if (step % st.log_every == 0 || step == total) {
        double dt = seconds_since(interval_start);
        // The loss of the whole job: each rank's mean over its samples,
        // averaged over ranks (equal shares).
        double mean = interval_loss / static_cast<double>(interval_steps);
        if (proc.world_size > 1) {
          int64_t one = 1;
          DLTensor t{&mean, DLDevice{kDLCPU, 0}, 1, DLDataType{kDLFloat, 64, 1}, &one, nullptr, 0};
          plugin_ok(s.host,
                    s.host.table()->comm->all_reduce(s.host.ctx(), &t, TSR_REDUCE_AVG, nullptr),
                    "average the loss over ranks");
        }
        last_loss = mean;
        rep.progress(step, epoch, last_loss, uctx.lr,
                     dt > 0 ? static_cast<double>(interval_samples) / dt : 0,
                     seconds_since(train_start), obs.at_log(interval_steps));
        interval_loss = 0;
        interval_steps = 0;
        interval_samples = 0;
        interval_start = Clock::now();
        obs.restart_interval();
      }
      if (st.eval_every > 0 && step % st.eval_every == 0) run_eval(step);
      if (st.ckpt_every > 0 && step % st.ckpt_every == 0 && step < total) save(step);
      // Preemption: every rank agrees on the step to stop at (checked every
      // step alone, every 4 steps across ranks to keep collectives few).
      if ((proc.world_size == 1 || step % 4 == 0) && step < total &&
          agree_max(s, g_stop_signal, "agree on stopping") != 0)
        stopped = true;
    }
    if (stopped) break;
    if (st.eval_every == 0) run_eval(step);  // at the end of every epoch
    if (in_epoch >= steps_per_epoch) {
      ++epoch;
      in_epoch = 0;
    }
  }
  if (stopped) {
    save(step);
    if (primary) {
      std::printf(
          "tessera: stopped by a signal at step %lld; checkpoint saved to %s (resume with "
          "checkpoint.resume = \"auto\")\n",
          static_cast<long long>(step), ckpt_path.c_str());
      std::fflush(stdout);
    }
  }
  const double train_s = seconds_since(train_start);
  if (!stopped) {
    if (last_eval_step != step) run_eval(step);
    save(step);
  }

  MemoryStats mem = s.host.memory();
  nlohmann::json peak = nlohmann::json::object();
  for (int p = 0; p < TSR_MEM_PURPOSE_COUNT; ++p)
    peak[purpose_name(p)] = mem.peak[static_cast<size_t>(p)];
  nlohmann::json summary = {
      {"name", st.name},
      {"status", stopped ? "stopped" : "completed"},
      {"steps", step},
      {"epochs", epoch},
      {"samples", samples},
      {"world_size", proc.world_size},
      {"zero", s.zero.name},
      {"train_loss", last_loss},
      {"eval_loss", have_eval ? nlohmann::json(last_eval.loss) : nlohmann::json(nullptr)},
      {"eval_accuracy", have_eval && last_eval.accuracy >= 0 ? nlohmann::json(last_eval.accuracy)
                                                             : nlohmann::json(nullptr)},
      {"samples_per_s", train_s > 0 ? static_cast<double>(samples) / train_s : 0.0},
      {"train_s", train_s},
      {"wall_s", seconds_since(t_start)},
      {"peak_memory_bytes", mem.peak_total},
      {"peak_memory_by_purpose", peak},
      {"memory_at_start_by_rank", memory_by_rank},
      {"peak_rss_bytes", peak_rss_bytes()},
      {"parameters", s.layout.numel},
      {"checkpoint", ckpt_path},
      {"device", describe_device(s.host.facts().device)},
      {"precision", st.precision},
  };
  if (st.precision == "fp16") {
    summary["loss_scale"] = scaler.scale;
    summary["skipped_steps"] = scaler.skipped;
  }
  obs.finish(summary);  // collective
  rep.write_summary(summary);
  rep.print_summary(summary);
  return summary;
}

}  // namespace tessera
