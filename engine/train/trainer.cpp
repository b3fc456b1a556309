#include "train/trainer.hpp"

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "data/loader.hpp"
#include "ops/cpu_ops.hpp"
#include "train/model_file.hpp"
#include "train/schedule.hpp"
#include "util/error.hpp"

namespace fs = std::filesystem;

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int64_t env_int(const char *name, int64_t fallback) {
  const char *v = std::getenv(name);
  if (!v || !*v) return fallback;
  char *end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (*end != '\0' || x < 0)
    throw Error(TSR_ERR_CONFIG, std::string("environment variable ") + name + "='" + v +
                                    "' is not a non-negative integer");
  return x;
}

Host::RunFacts facts_for(const Job &job, const ProcessInfo &proc) {
  const auto &st = job.settings;
  if (st.device == "cuda")
    throw Error(TSR_ERR_UNSUPPORTED,
                "run.device = \"cuda\": this tessera build has no CUDA device "
                "support yet; use \"cpu\" or \"auto\"");
  if (st.precision != "fp32")
    throw Error(TSR_ERR_CONFIG, "run.precision = \"" + st.precision +
                                    "\": CPU runs compute in fp32 (bf16 and fp16 need a GPU)");
  Host::RunFacts f;
  f.rank = proc.rank;
  f.world_size = proc.world_size;
  f.local_rank = proc.local_rank;
  f.local_world_size = proc.local_world_size;
  f.device = DLDevice{kDLCPU, 0};
  f.precision = TSR_PRECISION_FP32;
  f.seed = static_cast<uint64_t>(st.seed);
  f.run_dir = st.dir;
  return f;
}

// Threads per rank: run.threads, else the cores shared among local ranks.
void set_threads(const Job &job, const ProcessInfo &proc) {
  int64_t t = job.settings.threads;
  if (t == 0) {
    unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    t = std::max<int64_t>(1, cores / std::max<uint32_t>(1, proc.local_world_size));
  }
  cpu_ops_set_threads(static_cast<int>(t));
}

size_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<size_t>(ru.ru_maxrss) * 1024;
}

// Reads the optimizer's base learning rate: every optimizer declares `lr`.
double base_lr(const Job &job) {
  const auto &v = job.plugin("optimizer").values;
  if (auto x = v["lr"].value<double>()) return *x;
  throw Error(TSR_ERR_CONFIG, "[optimizer] plugin '" +
                                  std::string(job.plugin("optimizer").entry->desc->name) +
                                  "' declares no 'lr' parameter; the schedule needs one");
}

}  // namespace

ProcessInfo process_info(int cli_local_rank) {
  ProcessInfo p;
  // Our launcher and torchrun: RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE;
  // mpirun: OMPI_COMM_WORLD_*; Slurm: SLURM_PROCID/NTASKS/LOCALID.
  if (std::getenv("RANK") || std::getenv("WORLD_SIZE")) {
    p.rank = static_cast<uint32_t>(env_int("RANK", 0));
    p.world_size = static_cast<uint32_t>(env_int("WORLD_SIZE", 1));
    p.local_rank = static_cast<uint32_t>(env_int("LOCAL_RANK", p.rank));
    p.local_world_size = static_cast<uint32_t>(env_int("LOCAL_WORLD_SIZE", p.world_size));
  } else if (std::getenv("OMPI_COMM_WORLD_RANK")) {
    p.rank = static_cast<uint32_t>(env_int("OMPI_COMM_WORLD_RANK", 0));
    p.world_size = static_cast<uint32_t>(env_int("OMPI_COMM_WORLD_SIZE", 1));
    p.local_rank = static_cast<uint32_t>(env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0));
    p.local_world_size = static_cast<uint32_t>(env_int("OMPI_COMM_WORLD_LOCAL_SIZE", p.world_size));
  } else if (std::getenv("SLURM_PROCID")) {
    p.rank = static_cast<uint32_t>(env_int("SLURM_PROCID", 0));
    p.world_size = static_cast<uint32_t>(env_int("SLURM_NTASKS", 1));
    p.local_rank = static_cast<uint32_t>(env_int("SLURM_LOCALID", 0));
    p.local_world_size = static_cast<uint32_t>(env_int("SLURM_NTASKS_PER_NODE", 1));
  } else if (const char *lr = std::getenv("LOCAL_RANK")) {
    (void)lr;
    p.local_rank = static_cast<uint32_t>(env_int("LOCAL_RANK", 0));
  }
  if (cli_local_rank >= 0) p.local_rank = static_cast<uint32_t>(cli_local_rank);
  if (p.world_size == 0) throw Error(TSR_ERR_CONFIG, "WORLD_SIZE is 0");
  if (p.rank >= p.world_size)
    throw Error(TSR_ERR_CONFIG, "RANK " + std::to_string(p.rank) + " is not below WORLD_SIZE " +
                                    std::to_string(p.world_size));
  if (p.world_size > 1)
    throw Error(TSR_ERR_UNSUPPORTED,
                "WORLD_SIZE=" + std::to_string(p.world_size) +
                    ": this build trains in one process; multi-process data parallelism needs the "
                    "Gloo communicator, which it does not have yet");
  return p;
}

EvalResult evaluate(Session &s, int64_t batch_size) {
  bool use_eval = s.has_eval();
  auto &inst = use_eval ? s.eval_data : s.train_data;
  const tsr_data_info &info = use_eval ? s.eval_info : s.train_info;
  // Contiguous, balanced shares per rank; no padding so nothing counts twice.
  const auto &f = s.host.facts();
  int64_t n = info.length, w = f.world_size, r = f.rank;
  int64_t base = n / w, extra = n % w;
  int64_t begin = r * base + std::min(r, extra), count = base + (r < extra ? 1 : 0);
  std::vector<int64_t> idx(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) idx[static_cast<size_t>(i)] = begin + i;
  Loader loader(s.host, inst.vt, inst.self, info, std::move(idx), batch_size, true,
                static_cast<int>(s.job.settings.workers), static_cast<int>(s.job.settings.prefetch),
                use_eval ? "data.eval" : "data.train");
  StepHooks hooks;
  hooks.param = [&](uint32_t i, DLTensor *out) {
    if (i >= s.layout.params.size())
      return s.host.table()->error(s.host.ctx(), TSR_ERR_INVALID, "param index out of range");
    *out = s.param_view(i, false);
    return TSR_OK;
  };
  hooks.grad = [&](uint32_t, DLTensor *) {
    return s.host.table()->error(s.host.ctx(), TSR_ERR_INVALID, "no gradients during evaluation");
  };
  tsr_step *step = s.host.step_handle(&hooks);
  double loss_sum = 0;
  int64_t counted = 0, correct = 0;
  bool classifies = true;
  while (const tsr_batch *b = loader.next()) {
    tsr_forward_result res{};
    res.struct_size = sizeof res;
    plugin_ok(s.host, s.model.vt->forward(s.model.self, step, b, 0, &res),
              "[model] forward (eval)");
    loss_sum += res.loss_sum;
    counted += res.count;
    if (res.correct < 0) classifies = false;
    correct += std::max<int64_t>(res.correct, 0);
  }
  EvalResult r0;
  r0.count = counted;
  r0.loss = counted > 0 ? loss_sum / static_cast<double>(counted) : 0.0;
  r0.accuracy =
      classifies && counted > 0 ? static_cast<double>(correct) / static_cast<double>(counted) : -1;
  return r0;
}

nlohmann::json train(const Job &job, const ProcessInfo &proc) {
  auto t_start = Clock::now();
  const auto &st = job.settings;
  std::error_code ec;
  fs::create_directories(st.dir, ec);
  if (ec) throw Error(TSR_ERR_IO, st.dir + ": cannot create run directory: " + ec.message());
  set_threads(job, proc);
  Session s(job, facts_for(job, proc), true);
  bool primary = proc.rank == 0;
  if (primary) {
    std::ofstream(st.dir + "/config.toml") << job.resolved_toml();
  }

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
  const int64_t steps_per_epoch = epoch_size / per_step;
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
    // Memory by purpose, measured from the allocator (DESIGN.md, "State").
    MemoryStats m = s.host.memory();
    std::printf("tessera: memory on rank 0: parameters %.2f MiB, gradients %.2f MiB, optimizer state "
                "%.2f MiB\n",
                m.current[TSR_MEM_PARAMS] / 1048576.0, m.current[TSR_MEM_GRADS] / 1048576.0,
                m.current[TSR_MEM_OPTIMIZER] / 1048576.0);
    std::fflush(stdout);
  }

  // The step context the model sees.
  int32_t last_micro = 0;
  StepHooks hooks;
  hooks.param = [&](uint32_t i, DLTensor *out) {
    if (i >= s.layout.params.size())
      return s.host.table()->error(s.host.ctx(), TSR_ERR_INVALID, "param index out of range");
    *out = s.param_view(i, false);
    return TSR_OK;
  };
  hooks.grad = [&](uint32_t i, DLTensor *out) {
    if (i >= s.layout.params.size())
      return s.host.table()->error(s.host.ctx(), TSR_ERR_INVALID, "grad index out of range");
    *out = s.param_view(i, true);
    return TSR_OK;
  };
  hooks.grads_done = [&](uint32_t g) { return s.zero.vt->grads_done(s.zero.self, g, last_micro); };
  tsr_step *step_ctx = s.host.step_handle(&hooks);

  // The update callback the zero plugin drives: owned range -> offload.
  struct UpdateCtx {
    Session *s;
    double lr, grad_scale;
    int64_t step;
  } uctx{&s, 0, 1, 0};
  auto update = [](void *p, size_t offset, size_t count) -> tsr_status {
    auto *u = static_cast<UpdateCtx *>(p);
    Session &ss = *u->s;
    std::vector<tsr_segment> segs = ss.layout.segments(offset, count);
    DLTensor g = ss.flat_view(ss.grads);
    tsr_offload_step os{};
    os.struct_size = sizeof os;
    os.offset = offset;
    os.count = count;
    os.grads = &g;
    os.segments = segs.data();
    os.num_segments = segs.size();
    os.lr = u->lr;
    os.grad_scale = u->grad_scale;
    os.step = u->step;
    return ss.offload.vt->step(ss.offload.self, &os);
  };
  tsr_zero_step zstep{sizeof(tsr_zero_step), update, &uctx};

  const int64_t eval_batch = st.micro_batch;
  int64_t step = 0, epoch = 0, samples = 0;
  double interval_loss = 0, last_loss = NAN;
  int64_t interval_steps = 0, interval_samples = 0;
  auto interval_start = Clock::now();
  auto train_start = Clock::now();
  double train_s = 0;
  EvalResult last_eval;
  bool have_eval = false;
  int64_t last_eval_step = -1;
  std::string ckpt_path;
  DLTensor flat_grads = s.flat_view(s.grads);

  auto run_eval = [&](int64_t at_step) {
    auto t0 = Clock::now();
    last_eval = evaluate(s, eval_batch);
    have_eval = true;
    last_eval_step = at_step;
    rep.eval(at_step, epoch, last_eval);
    train_start += Clock::now() - t0;  // eval time is not training time
    interval_start += Clock::now() - t0;
  };

  while (step < total) {
    sargs.epoch = epoch;
    std::vector<int64_t> indices(static_cast<size_t>(epoch_size));
    plugin_ok(s.host, s.sampler.vt->indices(s.sampler.self, &sargs, indices.data()),
              "[sampler] indices");
    Loader loader(s.host, s.train_data.vt, s.train_data.self, s.train_info, std::move(indices),
                  st.micro_batch, false, static_cast<int>(st.workers),
                  static_cast<int>(st.prefetch), "data.train");
    for (int64_t b = 0; b < steps_per_epoch && step < total; ++b) {
      std::memset(s.grads, 0, s.layout.total * sizeof(float));
      double step_loss = 0;
      for (int64_t m = 0; m < st.accumulation; ++m) {
        const tsr_batch *batch = loader.next();
        if (!batch) throw Error(TSR_ERR_INTERNAL, "loader ran out of batches mid-epoch");
        last_micro = (m == st.accumulation - 1) ? 1 : 0;
        tsr_forward_result res{};
        res.struct_size = sizeof res;
        plugin_ok(s.host, s.model.vt->forward(s.model.self, step_ctx, batch, 1, &res),
                  "[model] forward");
        if (res.count <= 0)
          throw Error(TSR_ERR_INVALID, "[model] forward counted no targets in a batch");
        // Mean over the samples of the whole step: each micro-batch's
        // summed loss is scaled by 1 / (its count x accumulation).
        float loss_scale = static_cast<float>(
            1.0 / (static_cast<double>(res.count) * static_cast<double>(st.accumulation)));
        plugin_ok(s.host, s.model.vt->backward(s.model.self, step_ctx, batch, loss_scale),
                  "[model] backward");
        step_loss +=
            res.loss_sum / static_cast<double>(res.count) / static_cast<double>(st.accumulation);
        samples += batch->size;
        interval_samples += batch->size;
      }
      plugin_ok(s.host, s.zero.vt->finish_grads(s.zero.self), "[zero] finish_grads");
      if (!std::isfinite(step_loss))
        throw Error(TSR_ERR_INVALID, "loss is " + std::to_string(step_loss) + " at step " +
                                         std::to_string(step + 1) +
                                         "; lower optimizer.lr or enable gradient clipping");
      // Clip by the global L2 norm.
      double clip = 1.0;
      if (st.gradient_clipping > 0) {
        double sq = 0;
        plugin_ok(s.host, s.host.table()->ops->sum_squares(s.host.ctx(), &flat_grads, &sq),
                  "grad norm");
        double norm = std::sqrt(sq);
        if (norm > st.gradient_clipping) clip = st.gradient_clipping / (norm + 1e-6);
      }
      uctx.lr = schedule_lr(st.schedule, lr0, step, total);
      uctx.grad_scale = clip;
      uctx.step = step + 1;
      plugin_ok(s.host, s.zero.vt->step(s.zero.self, &zstep), "[zero] step");
      ++step;
      interval_loss += step_loss;
      ++interval_steps;
      last_loss = step_loss;
      if (step % st.log_every == 0 || step == total) {
        double dt = seconds_since(interval_start);
        rep.progress(step, epoch, interval_loss / static_cast<double>(interval_steps), uctx.lr,
                     dt > 0 ? static_cast<double>(interval_samples) / dt : 0,
                     seconds_since(train_start));
        interval_loss = 0;
        interval_steps = 0;
        interval_samples = 0;
        interval_start = Clock::now();
      }
      if (st.eval_every > 0 && step % st.eval_every == 0) run_eval(step);
      if (st.ckpt_every > 0 && step % st.ckpt_every == 0 && step < total && primary)
        ckpt_path = save_model_checkpoint(st.ckpt_dir, step, s.layout, s.params,
                                          job.resolved_toml(), st.ckpt_keep);
    }
    ++epoch;
    if (st.eval_every == 0 && (step < total || true)) run_eval(step);
  }
  train_s = seconds_since(train_start);
  if (last_eval_step != step) run_eval(step);
  if (primary)
    ckpt_path = save_model_checkpoint(st.ckpt_dir, step, s.layout, s.params, job.resolved_toml(),
                                      st.ckpt_keep);

  MemoryStats mem = s.host.memory();
  nlohmann::json peak = nlohmann::json::object();
  for (int p = 0; p < TSR_MEM_PURPOSE_COUNT; ++p)
    peak[purpose_name(p)] = mem.peak[static_cast<size_t>(p)];
  nlohmann::json summary = {
      {"name", st.name},
      {"status", "completed"},
      {"steps", step},
      {"epochs", epoch},
      {"samples", samples},
      {"world_size", proc.world_size},
      {"train_loss", last_loss},
      {"eval_loss", have_eval ? nlohmann::json(last_eval.loss) : nlohmann::json(nullptr)},
      {"eval_accuracy", have_eval && last_eval.accuracy >= 0 ? nlohmann::json(last_eval.accuracy)
                                                             : nlohmann::json(nullptr)},
      {"samples_per_s", train_s > 0 ? static_cast<double>(samples) / train_s : 0.0},
      {"train_s", train_s},
      {"wall_s", seconds_since(t_start)},
      {"peak_memory_bytes", mem.peak_total},
      {"peak_memory_by_purpose", peak},
      {"peak_rss_bytes", peak_rss_bytes()},
      {"parameters", s.layout.numel},
      {"checkpoint", ckpt_path},
  };
  rep.write_summary(summary);
  rep.print_summary(summary);
  return summary;
}

nlohmann::json evaluate_checkpoint(const Job &job, const ProcessInfo &proc,
                                   const std::string &ckpt) {
  set_threads(job, proc);
  Session s(job, facts_for(job, proc), false);
  std::string file = load_model_params(ckpt, s.layout, s.params);
  EvalResult r = evaluate(s, job.settings.micro_batch);
  MemoryStats mem = s.host.memory();
  nlohmann::json out = {
      {"checkpoint", file},
      {"eval_loss", r.loss},
      {"eval_accuracy", r.accuracy >= 0 ? nlohmann::json(r.accuracy) : nlohmann::json(nullptr)},
      {"samples", r.count},
      {"optimizer_state_bytes", mem.peak[TSR_MEM_OPTIMIZER]},
      {"peak_memory_bytes", mem.peak_total}};
  return out;
}

}  // namespace tessera
