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
#include "train/instance.hpp"
#include "train/job.hpp"
#include "train/model_pass.hpp"
#include "train/param_home.hpp"
#include "train/update_flight.hpp"

namespace tessera {

struct CheckpointParts;  // ckpt/checkpoint.hpp

// Fills the flat fp32 parameters at start-up (default: each parameter's
// declared initialiser; evaluation loads a checkpoint instead).
using ParamInitializer = std::function<void(const Layout &, float *)>;

// Built in phases (session.cpp): open the data, build the model, the
// initial weights, place the parameters with the zero plugin (and the
// offload backend where it keeps them), attach the update (optimizer and
// offload backend) when training. A step hands the model a handle made for
// each pass (train/model_pass.hpp); nothing here changes during a step but
// the updates in flight.
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
  Layout layout;
  ParamHome home;       // where the owned parameters live (train/param_home.hpp)
  UpdateFlight flight;  // the updates still running (train/update_flight.hpp)

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

  // Reads compute-dtype elements [first, first + n) at `src` on the run's
  // device into n fp32 values in host memory.
  void get_compute(const void *src, size_t first, size_t n, float *dst);
  // The frozen ranges this rank keeps (tessera.zero.frozen/1), their
  // compute parameters in `params`; none where nothing is frozen.
  std::vector<tsr_owned_range> frozen_ranges();

  // The ranges this rank owns and updates, in owned order: the trainer
  // walks them itself (host/zero_update.hpp).
  std::vector<tsr_owned_range> owned_ranges();
  // Stages 1-2 at several ranks: each rank updated its slices of the full
  // parameters, so they must be all-gathered before the next forward.
  bool needs_reshare() const;
};

}  // namespace tessera
