// Sharded checkpoints (docs/checkpoints.md; docs/architecture.md): each rank writes what it
// owns, in the canonical index space (parameters in declaration order, no
// padding), so any checkpoint loads at any world size and ZeRO stage; each
// rank reads back only the byte ranges it owns now. A manifest records a
// checksum per file and per 1 MiB block of every tensor; `latest` moves
// only after every rank has written and synced.
#pragma once

#include <tessera/tessera.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "host/host.hpp"
#include "host/plugin_call.hpp"
#include "plugin/layout.hpp"

namespace tessera {

// One plugin instance as a checkpoint calls it: its table, its state, and
// the name its errors give.
template <typename VTable>
struct PluginRef {
  const VTable *vt = nullptr;
  void *self = nullptr;
  std::string name;
};

// What saving and loading a checkpoint touch, handed in by the trainer
// (Session::checkpoint_parts) rather than the whole session: the host (its
// collectives and facts), the flat layout, the zero plugin (owned ranges,
// the reload step), the optimizer (state names) and the offload backend
// (the state itself).
struct CheckpointParts {
  Host &host;
  const Layout &layout;
  PluginRef<tsr_zero_vtable> zero;
  PluginRef<tsr_optimizer_vtable> optimizer;
  PluginRef<tsr_offload_vtable> offload;
  std::string model_name;
  bool partition_optimizer = false;  // the plan's: ranks own disjoint optimizer state
  // Stages 1-2 at several ranks: loaded slices are all-gathered, as after
  // an update (Session::needs_reshare).
  bool needs_reshare = false;
  uint32_t state_count = 0;  // optimizer state arrays per parameter
  int64_t data_length = 0;   // training samples (0: unknown), to check the position
  // Completes every update in flight before the state is read or replaced.
  std::function<void()> settle_update;
  // Writes n fp32 values into compute-dtype memory at dst on the device.
  std::function<void(const float *, size_t, void *)> put_compute;
  // Reads compute-dtype elements [first, first + n) at src on the device
  // into n fp32 values at dst.
  std::function<void(const void *src, size_t first, size_t n, float *dst)> get_compute;
  // The frozen ranges this rank keeps (tessera.zero.frozen/1): weights
  // only, saved and loaded in the "master" slot from and into their
  // compute parameters; no optimizer state.
  std::vector<tsr_owned_range> frozen;
  bool partition_params = false;  // the plan's: ranks keep disjoint parameter slices
};

// Where training stands: enough to continue exactly.
struct RunPosition {
  int64_t step = 0;            // optimizer steps completed
  int64_t epoch = 0;           // current epoch
  int64_t batch_in_epoch = 0;  // optimizer steps already taken in this epoch
  int64_t samples = 0;         // samples seen over all ranks
  int64_t global_batch = 0;
  uint64_t seed = 0;
  // fp16 dynamic loss scaling (DeepSpeed's names): scale < 0 when the run
  // has no scaler (bf16, fp32).
  double loss_scale = -1;
  int64_t scale_good_steps = 0, scale_hysteresis = 0, scale_skipped = 0;
};

// Writes <dir>/step_<step>/ from every rank (collective: every rank calls
// it), then points <dir>/latest at it and removes checkpoints beyond keep.
// Returns the checkpoint directory.
std::string save_checkpoint(const CheckpointParts &s, const RunPosition &st, const std::string &dir,
                            int64_t keep, const std::string &config_toml);

// The checkpoint `spec` names: "auto" (the latest under dir, or "" when
// there is none), or a path to a step_ directory or a checkpoint root.
std::string resolve_checkpoint(const std::string &spec, const std::string &dir);

// Loads the owned master weights and optimizer state into the offload
// backend and the compute parameters from them; returns where training
// stands. Every rank calls it. A NaN or an infinity in the weights or the
// optimizer state is refused naming the slot and parameter, unless
// `allow_nonfinite` (checkpoint.allow_nonfinite).
RunPosition load_checkpoint(const CheckpointParts &s, const std::string &path,
                            bool allow_nonfinite = false);

// Reads the full fp32 parameters (canonical order, every parameter) of a
// checkpoint into `canonical`, verifying every block read.
void read_canonical_params(const std::string &path, std::vector<float> *canonical,
                           nlohmann::json *manifest);

// Verifies every file and tensor block of a checkpoint, each shard's header
// against the manifest, and (unless `allow_nonfinite`) that every value of
// every slot is a number; returns problems found (empty when sound).
std::vector<std::string> verify_checkpoint(const std::string &path, bool allow_nonfinite = false);

nlohmann::json read_manifest(const std::string &path);

// "[256, 784]"
std::string shape_text(const std::vector<int64_t> &shape);
// Why the saved parameter table (a manifest's "params") does not fit the
// model's layout, naming the parameter and both shapes
// ("fc0.weight: checkpoint [256, 784], model [128, 784]") and what to
// check; "" when it fits.
std::string params_mismatch(const nlohmann::json &table, const Layout &layout);
// Throws Error naming the parameter, its element and `slot` (and `dir`) if
// canonical elements [c0, c0 + n) of that slot, `values`, hold a NaN or an
// infinity; the message names checkpoint.allow_nonfinite.
void require_finite_params(const nlohmann::json &manifest, const std::string &dir,
                           const std::string &slot, size_t c0, const float *values, size_t n);
// "parameter 'fc0.weight' element 17": where canonical element `canonical`
// of a checked manifest lies.
std::string param_element(const nlohmann::json &manifest, size_t canonical);

}  // namespace tessera
