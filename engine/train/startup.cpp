// Before the first step (startup.hpp).
#include "train/startup.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "ckpt/checkpoint.hpp"
#include "plugin/legacy.hpp"
#include "train/device_select.hpp"
#include "util/error.hpp"
#include "util/text.hpp"

namespace tessera {

int64_t agree_max(Session &s, int64_t v, const char *what) {
  if (s.host.facts().world_size == 1) return v;
  int64_t one = 1;
  DLTensor t{&v, DLDevice{kDLCPU, 0}, 1, DLDataType{kDLInt, 64, 1}, &one, nullptr, 0};
  plugin_ok(s.host, s.host.table()->comm->all_reduce(s.host.ctx(), &t, TSR_REDUCE_MAX, nullptr),
            what);
  return v;
}

double base_lr(Session &s) {
  const PluginChoice &c = s.job.plugin("optimizer");
  const std::string who = "[optimizer] plugin '" + std::string(c.entry->desc->name) + "'";
  if (predates_extensions(*c.entry)) {
    if (auto lr = legacy_base_lr(c.values)) return *lr;
    throw Error(TSR_ERR_CONFIG, who + " declares no 'lr' parameter; the schedule needs one");
  }
  const tsr_ext_optimizer_lr *ext = c.entry->caps.optimizer.lr;
  if (!ext)
    throw Error(TSR_ERR_CONFIG, who + " offers no learning rate (extension " +
                                    TSR_EXT_OPTIMIZER_LR +
                                    "), which the schedule scales; docs/abi.md says how a "
                                    "plugin offers it");
  return ext->base_lr(s.optimizer.self);
}

EpochPlan plan_epochs(Session &s, const ProcessInfo &proc) {
  const auto &st = s.job.settings;
  EpochPlan e;
  tsr_sampler_args &a = e.sampler;
  a.struct_size = tsr_sampler_args_STRUCT_SIZE;
  a.dataset_size = s.train_info.length;
  a.rank = proc.rank;
  a.world_size = proc.world_size;
  a.seed = static_cast<uint64_t>(st.seed);
  plugin_ok(s.host, s.sampler.vt->epoch_size(s.sampler.self, &a, &e.epoch_size),
            "[sampler] epoch_size");
  // Steps per epoch: whole optimizer steps only; the rest of an epoch is
  // dropped so every rank takes the same number of steps.
  e.per_step = st.micro_batch * st.accumulation;
  e.steps_per_epoch = e.epoch_size / e.per_step;
  if (proc.world_size > 1) {
    // A sampler may give ranks unequal shares: the smallest wins.
    int64_t one = 1;
    DLTensor t{
        &e.steps_per_epoch, DLDevice{kDLCPU, 0}, 1, DLDataType{kDLInt, 64, 1}, &one, nullptr, 0};
    plugin_ok(s.host, s.host.table()->comm->all_reduce(s.host.ctx(), &t, TSR_REDUCE_MIN, nullptr),
              "agree on steps per epoch");
  }
  if (e.steps_per_epoch == 0)
    throw Error(TSR_ERR_CONFIG, "the training data gives this rank " +
                                    std::to_string(e.epoch_size) +
                                    " samples per epoch, fewer than one step needs (micro " +
                                    std::to_string(st.micro_batch) + " x accumulation " +
                                    std::to_string(st.accumulation) + ")");
  e.total = st.steps > 0 ? st.steps : st.epochs * e.steps_per_epoch;
  if (e.total <= 0)
    throw Error(TSR_ERR_CONFIG, "[run] needs 'steps' or 'epochs' (how long to train)");
  return e;
}

void print_startup(Session &s, const ProcessInfo &proc, const EpochPlan &e) {
  if (proc.rank != 0) return;
  const auto &st = s.job.settings;
  std::printf(
      "tessera: model %s (%zu parameters, %zu groups), %lld steps of %lld samples "
      "(micro %lld x accumulation %lld x world %u), %lld steps per epoch\n",
      s.model.name.c_str(), s.layout.numel, s.layout.group_offset.size(),
      static_cast<long long>(e.total), static_cast<long long>(st.global_batch),
      static_cast<long long>(st.micro_batch), static_cast<long long>(st.accumulation),
      proc.world_size, static_cast<long long>(e.steps_per_epoch));
  std::printf("tessera: device %s, precision %s\n", describe_device(s.host.facts().device).c_str(),
              st.precision.c_str());
  if (!proc.transport.empty()) std::printf("tessera: collectives: %s\n", proc.transport.c_str());
}

namespace {

void print_resumed(const std::string &path, const TrainState &ts) {
  std::printf("tessera: resumed from %s at step %lld (epoch %lld, %lld steps into it)\n",
              path.c_str(), static_cast<long long>(ts.step), static_cast<long long>(ts.epoch),
              static_cast<long long>(ts.in_epoch));
  std::fflush(stdout);
}

}  // namespace

TrainState start_state(Session &s, const EpochPlan &e) {
  const auto &st = s.job.settings;
  TrainState ts;
  ts.total = e.total;
  ts.scaler = LossScaler::from(st);
  std::string resume = st.resume;
  if (const char *r = std::getenv("TESSERA_RESUME")) resume = r;
  if (resume.empty()) return ts;
  const std::string path = resolve_checkpoint(resume, st.ckpt_dir);
  const bool primary = s.host.facts().rank == 0;
  if (path.empty()) {
    if (primary && resume == "auto")
      std::printf("tessera: no checkpoint in %s yet; starting fresh\n", st.ckpt_dir.c_str());
    return ts;
  }
  const RunPosition at = load_checkpoint(s.checkpoint_parts(), path, st.ckpt_allow_nonfinite);
  ts.step = at.step;
  ts.epoch = at.epoch;
  ts.samples = at.samples;
  ts.in_epoch = at.batch_in_epoch;
  if (at.loss_scale > 0 && ts.scaler.dynamic) {
    ts.scaler.scale = at.loss_scale;
    ts.scaler.good_steps = at.scale_good_steps;
    ts.scaler.hysteresis_left = std::max<int64_t>(1, at.scale_hysteresis);
    ts.scaler.skipped = at.scale_skipped;
  }
  if (at.global_batch != st.global_batch) {
    // Another global batch: continue after the same samples of the epoch.
    const int64_t consumed = at.batch_in_epoch * at.global_batch;
    if (consumed % st.global_batch != 0)
      throw Error(TSR_ERR_CONFIG,
                  path + " stopped " + std::to_string(consumed) +
                      " samples into its epoch, not a whole number of steps at global batch " +
                      std::to_string(st.global_batch));
    ts.in_epoch = consumed / st.global_batch;
  }
  if (primary) print_resumed(path, ts);
  return ts;
}

namespace {

// Parameter offload: where rank 0's owned compute parameters are, in bytes
// per place (the backend says what it holds in host memory and on disk).
// On the GPU only gathered groups live, and none yet at start-up: the
// largest group, whole, is what one of them takes while it is used.
// Where compute happens, in the words of the device the run uses: a CPU
// run's report must not speak of a GPU.
const char *compute_place(Session &s) {
  return s.host.facts().device.device_type == kDLCUDA ? "on the GPU"
                                                      : "in the CPU's compute buffers";
}

void print_offloaded_params(Session &s, int64_t on_device) {
  uint64_t host_b = 0, disk_b = 0;
  s.offload.caps.offload.params->bytes(s.offload.self, &host_b, &disk_b);
  size_t largest = 0;
  for (size_t g : s.layout.group_size) largest = std::max(largest, g);
  std::printf(
      "tessera: parameters of rank 0 live in %s ([offload] plugin '%s'): %.2f MiB %s "
      "now (groups are gathered as they are used, the largest %.2f MiB whole), %.2f MiB in "
      "host memory, %.2f MiB on disk\n",
      s.home.where == TSR_PARAMS_ON_DISK ? "a file" : "host memory", s.offload.name.c_str(),
      static_cast<double>(on_device) / 1048576.0, compute_place(s),
      static_cast<double>(largest * s.compute_bytes()) / 1048576.0,
      static_cast<double>(host_b) / 1048576.0, static_cast<double>(disk_b) / 1048576.0);
}

// The frozen parameters, apart: weights only, counted in the parameters
// line (each rank keeps them whole, or its slice under stage 3), with no
// gradients, master copy or optimizer state anywhere.
void print_frozen(Session &s) {
  const Layout &L = s.layout;
  size_t frozen_numel = L.numel - L.trainable_numel;
  const double kept = static_cast<double>(L.frozen_total) /
                      (s.plan.partition_params ? s.host.facts().world_size : 1);
  std::printf(
      "tessera: frozen parameters: %zu of %zu elements, weights %.2f MiB per rank in the "
      "parameters above (%s); no gradients, master copy or optimizer state for them: "
      "gradients and optimizer state cover the %zu trainable elements only\n",
      frozen_numel, L.numel, kept * static_cast<double>(s.compute_bytes()) / 1048576.0,
      s.plan.partition_params ? "partitioned and gathered as weights" : "whole on every rank",
      L.trainable_numel);
}

// Where every byte rank 0 has allocated lives now (the engine's and the
// plugins' allocations through the host; activations come on top of the
// GPU's, during the step): GPU, pinned and pageable host memory, and disk
// where the offload backend keeps parameters there (a backend's own state
// files are in its own line).
void print_placement(Session &s) {
  const MemoryStats host = s.host.host_memory();
  uint64_t disk = 0;
  if (s.offload.caps.offload.params)
    s.offload.caps.offload.params->bytes(s.offload.self, nullptr, &disk);
  const double pinned = static_cast<double>(s.host.pinned_bytes());
  if (s.host.facts().device.device_type == kDLCUDA)
    std::printf(
        "tessera: where rank 0's bytes live: GPU %s, pinned host memory %s, pageable host memory "
        "%s, disk %s (allocated so far; the step's activations come on top of the GPU's)\n",
        format_bytes(static_cast<double>(s.host.memory().current_total)).c_str(),
        format_bytes(pinned).c_str(),
        format_bytes(static_cast<double>(host.current_total) - pinned).c_str(),
        format_bytes(static_cast<double>(disk)).c_str());
  else
    std::printf(
        "tessera: where rank 0's bytes live: pageable host memory %s (a CPU run: no GPU, nothing "
        "pinned), disk %s (allocated so far)\n",
        format_bytes(static_cast<double>(host.current_total)).c_str(),
        format_bytes(static_cast<double>(disk)).c_str());
}

}  // namespace

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
    // docs/architecture.md's memory table: compute-dtype bytes per parameter and gradient,
    // and the fp32 master plus the optimizer's state arrays; divided by the
    // world where the stage partitions them.
    // Frozen parameters count among the parameters only: weights without
    // gradients, master copy or optimizer state (docs/architecture.md).
    const double psi = static_cast<double>(s.layout.total), w = f.world_size;
    const double psi_t = static_cast<double>(s.layout.total - s.layout.frozen_total);
    const double states = 1 + s.state_count;
    const double cb = static_cast<double>(s.compute_bytes());
    const std::string b = std::to_string(s.compute_bytes());
    const bool offloaded = s.home.where != TSR_PARAMS_ON_DEVICE;
    const std::string p_rule = offloaded ? "live groups only: " + b + "Psi/N offloaded"
                               : s.plan.partition_params ? b + "Psi/N + live groups"
                                                         : b + "Psi";
    const std::string g_rule = s.home.grads_streamed    ? "buckets only: " + b + "Psi/N on the host"
                               : s.plan.partition_grads ? b + "Psi/N + buckets"
                                                        : b + "Psi";
    std::printf(
        "tessera: expected for %s at %u ranks (docs/architecture.md, %s, Psi = %.0f%s): "
        "parameters %.2f MiB "
        "(%s), gradients %.2f MiB (%s), optimizer state %.2f MiB (%s)\n",
        stage, f.world_size, s.job.settings.precision.c_str(), psi,
        psi_t < psi ? (", trainable " + std::to_string(s.layout.total - s.layout.frozen_total) +
                       ": gradients and state cover only those")
                          .c_str()
                    : "",
        offloaded ? 0.0 : mib(cb * psi / (s.plan.partition_params ? w : 1)), p_rule.c_str(),
        s.home.grads_streamed ? 0.0 : mib(cb * psi_t / (s.plan.partition_grads ? w : 1)),
        g_rule.c_str(), mib(4 * states * psi_t / (s.plan.partition_optimizer ? w : 1)),
        s.plan.partition_optimizer ? "4(1+k)Psi/N" : "4(1+k)Psi");
    if (s.layout.frozen_total > 0) print_frozen(s);
    if (offloaded) print_offloaded_params(s, all[0]);
    if (s.home.grads_streamed)
      std::printf(
          "tessera: gradients of rank 0 leave %s as each bucket is reduce-scattered "
          "([offload] plugin '%s'): no gradient slice %s (only the reduce-scatter "
          "buckets in flight), %.2f MiB in host memory\n",
          s.host.facts().device.device_type == kDLCUDA ? "the GPU" : "the CPU's compute buffers",
          s.offload.name.c_str(), compute_place(s), mib(cb * psi_t / w));
    print_placement(s);
    std::fflush(stdout);
  }
  return by_rank;
}

}  // namespace tessera
