// The plugins of a job, instantiated on one host: data, sampler, model, and
// the zero plugin that holds parameters and gradients, with the optimizer
// and offload backend behind it when training.
#pragma once

#include <tessera/tessera.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "host/host.hpp"
#include "host/plugin_call.hpp"
#include "plugin/layout.hpp"
#include "train/job.hpp"

namespace tessera {

struct CheckpointParts;  // ckpt/checkpoint.hpp

// One live plugin instance of any kind.
template <typename VTable>
struct Instance {
  const VTable *vt = nullptr;
  void *self = nullptr;
  std::string name;
  Instance() = default;
  Instance(const Instance &) = delete;
  Instance &operator=(const Instance &) = delete;
  ~Instance() { reset(); }
  void reset() {
    if (vt && self) vt->destroy(self);
    self = nullptr;
  }
};

// Fills the flat fp32 parameters at start-up (default: each parameter's
// declared initialiser; evaluation loads a checkpoint instead).
using ParamInitializer = std::function<void(const Layout &, float *)>;

struct Session {
  // `model_data`, when given, is the sample shape the model is built for
  // instead of the training data's: no dataset is opened (generation from a
  // checkpoint, whose data files may be elsewhere); needs training = false.
  Session(const Job &job, Host::RunFacts facts, bool training, ParamInitializer init = nullptr,
          const tsr_data_info *model_data = nullptr);
  ~Session();

  const Job &job;
  Host host;
  bool training;

  Instance<tsr_dataset_vtable> train_data, eval_data;
  tsr_data_info train_info{}, eval_info{};
  Instance<tsr_sampler_vtable> sampler;
  Instance<tsr_model_vtable> model;
  Instance<tsr_zero_vtable> zero;
  Instance<tsr_optimizer_vtable> optimizer;
  Instance<tsr_offload_vtable> offload;
  tsr_zero_plan plan{};
  uint32_t state_count = 0;
  // Where the owned compute parameters live: TSR_PARAMS_ON_DEVICE (with
  // the zero plugin), or with the offload backend in host memory or on
  // disk (TSR_EXT_OFFLOAD_PARAMS, handed to the zero plugin as a source).
  int32_t params_home = TSR_PARAMS_ON_DEVICE;
  const tsr_ext_offload_params *offload_params = nullptr;
  // With offloaded parameters, the reduced gradients go to the backend as
  // each bucket completes (TSR_EXT_OFFLOAD_GRADS) where both plugins can.
  bool grads_streamed = false;
  Layout layout;

  // Step hooks: views of parameter i / its gradient through the zero plugin.
  // `backward` tells stage 3 which way to prefetch.
  bool backward = false;
  StepHooks hooks;
  tsr_step *step_handle() { return host.step_handle(&hooks); }
  // Set by the trainer: 1 on the last micro-batch of a step.
  int32_t last_micro = 1;
  // Set by the trainer: the gradient buffers hold zeros (cleared since the
  // last backward, or never written), which the grads_zeroed hook reports
  // to the model so its first contribution may overwrite (ABI 1.5).
  bool grads_zero = false;

  // The full fp32 parameters in flat layout (gathers under stage 3; every
  // rank must call it). In bf16/fp16 runs these are the compute copies,
  // widened.
  std::vector<float> gather_params();

  // The dtype parameters, gradients and activations compute in: float32,
  // or bfloat16/float16 per run.precision.
  DLDataType compute_dtype() const;
  size_t compute_bytes() const { return (compute_dtype().bits + 7) / 8; }
  // Copies `n` fp32 values from host memory into compute-dtype memory at
  // `dst` on the run's device (rounding to nearest even when narrower).
  void put_compute(const float *src, size_t n, void *dst);

  bool has_eval() const { return eval_data.self != nullptr; }

  // What a checkpoint saves and loads (ckpt/checkpoint.hpp), as views of
  // this session: valid while it lives.
  CheckpointParts checkpoint_parts();

  // ---- the update, driven by the trainer (train/step.cpp) ----
  // The zero plugin splits its step (ABI 1.2 reshare, clear_grads), so the
  // trainer walks the owned ranges itself; else it calls zero.step.
  bool host_drives_update() const;
  // The ranges this rank owns and updates, in owned order.
  const std::vector<tsr_owned_range> &owned_ranges();
  // Every owned range was handed to the offload backend. A backend that
  // overlaps (ABI 1.2 wait_params) may still be updating: every group is
  // marked in flight, and the param hook waits for a group's update just
  // before its first use. Any other backend is flushed here.
  void updates_started();
  // Stages 1-2 at several ranks: each rank updated its slices of the full
  // parameters, so they must be all-gathered before the next forward.
  bool needs_reshare() const;
  // Completes every update in flight (offload flush): before anything
  // reads the state or the parameters outside the step (checkpoints,
  // gather_params, the end of the run).
  void settle_update();
  // Before the gradients are cleared: the backend has read them.
  void wait_grads_read();
  // Set by the trainer for the last micro-batch of a step whose owned
  // gradients are final as backward declares them (one rank, gradients not
  // partitioned, nothing to take first such as a clipping norm): called
  // with the group after the zero plugin's grads_done, so its update can
  // start while backward goes on.
  std::function<tsr_status(uint32_t)> grads_final;
  // Seconds the param hook spent waiting for updates in flight (the GPU,
  // or the CPU forward, waiting for the offloaded step).
  double update_wait_s = 0;

 private:
  void source_params_from_offload();
  void sink_grads_to_offload();
  tsr_status wait_group(uint32_t g);
  tsr_status wait_near(uint32_t g);
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<tsr_owned_range> ranges_;
  // Per group: the owned (offset, count) ranges that touch it.
  std::vector<std::vector<std::pair<size_t, size_t>>> group_owned_;
  std::vector<char> in_flight_;  // per group: its update may not have landed
  bool any_in_flight_ = false;
  tsr_param_source param_source_{};
  tsr_grad_sink grad_sink_{};
};

}  // namespace tessera
