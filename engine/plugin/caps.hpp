// What each loaded plugin can do beyond its kind's ABI 1.0 table: the
// optional entries later minors appended to the function tables and the
// extensions it offers (extensions.h, TSR_EXT_*), resolved once when its
// library loads (plugin/registry.cpp) into a typed record the engine reads
// everywhere instead of checking struct sizes at each call. An entry or
// extension counts as present only when the table is long enough for it and
// its functions are set, so a field here can be called without a check.
// docs/abi.md, "Version policy", says what a minor may add.
#pragma once

#include <tessera/tessera.h>

#include <string>

namespace tessera {

struct ModelCaps {
  bool predict = false;  // ABI 1.1 predict (tessera generate)
  const tsr_ext_model_init_from *init_from = nullptr;
  bool init_from_may_lack = false;  // ABI 1.8: init_from->may_lack is there and set
  const tsr_ext_model_export_hf *export_hf = nullptr;
};

struct DatasetCaps {
  const tsr_ext_dataset_shape *shape = nullptr;
};

struct OptimizerCaps {
  const tsr_ext_optimizer_lr *lr = nullptr;
};

struct ZeroCaps {
  // ABI 1.2 reshare and clear_grads: the engine walks the owned ranges. A
  // zero plugin without them is refused at load (caps_zero_refusal).
  bool split_step = false;
  const tsr_ext_zero_param_source *param_source = nullptr;
  const tsr_ext_zero_grad_sink *grad_sink = nullptr;
  // Frozen groups without gradients or owned state (extensions.h).
  const tsr_ext_zero_frozen *frozen = nullptr;
  // ABI 1.10: groups whose reduced gradients are final during backward.
  const tsr_ext_zero_final_groups *final_groups = nullptr;
};

struct OffloadCaps {
  // ABI 1.2, the overlapped step: updates may still run after step()
  // returns; the next forward waits per group, backward for the gradients.
  bool wait_params = false;
  bool wait_grads = false;
  bool stats = false;  // the backend's own timings, for the breakdown
  // Keeps the owned compute parameters itself (home, fetch, ready, bytes).
  const tsr_ext_offload_params *params = nullptr;
  // Holds the owned gradients itself (put, release, norm_sq).
  const tsr_ext_offload_grads *grads = nullptr;
  // ABI 1.7: steps ahead of the gradient norm and redoes (begin, resolve,
  // stats).
  const tsr_ext_offload_speculate *speculate = nullptr;
};

// One plugin's record; only the part of its kind is filled.
struct PluginCaps {
  bool extensions = false;  // the descriptor has get_extension (ABI 1.2)
  ModelCaps model;
  DatasetCaps dataset;
  OptimizerCaps optimizer;
  ZeroCaps zero;
  OffloadCaps offload;
};

// Whether a descriptor can be asked for extensions (ABI 1.2 get_extension).
bool caps_has_extensions(const tsr_plugin_descriptor *desc);

// The record of a plugin of `kind` ("model", "zero", ...) whose descriptor
// the registry has checked (kind known, function table at least 1.0's).
PluginCaps caps_resolve(const std::string &kind, const tsr_plugin_descriptor *desc);

// Why the engine will not serve this zero plugin ("" when it will): one
// built before ABI 1.2 lacks reshare and clear_grads. Zero plugins ship
// with tessera (users write datasets, samplers, models, optimizers and
// offload backends), so the engine serves them only from the minor that
// split the step into calls the engine makes (docs/abi.md, "Version
// policy"); other kinds keep loading from 1.0 on.
std::string caps_zero_refusal(const tsr_plugin_descriptor *desc);

}  // namespace tessera
