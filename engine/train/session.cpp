#include "train/session.hpp"

#include <spdlog/spdlog.h>

#include <cstring>
#include <optional>
#include <tessera/cpp/half.hpp>

#include "backend/cpu/cpu_ops.hpp"
#include "ckpt/checkpoint.hpp"
#include "host/zero_update.hpp"
#include "plugin/legacy.hpp"
#include "train/init_from.hpp"
#include "util/error.hpp"
#include "util/zeroed_pages.hpp"

namespace tessera {

namespace {

// The model's file of initial weights: what it answers through
// TSR_EXT_MODEL_INIT_FROM (before ABI 1.2: its `init_from` value).
std::optional<std::string> model_weights_file(const PluginChoice &c, void *self) {
  if (predates_extensions(*c.entry)) return legacy_init_from(c.values);
  const tsr_ext_model_init_from *ext = c.entry->caps.model.init_from;
  if (!ext) return std::nullopt;
  const char *f = ext->weights_file(self);
  if (!f || !*f) return std::nullopt;
  return std::string(f);
}

// A plugin that computes (model, optimizer, zero, offload) must declare the
// device the run computes on; datasets and samplers work in host memory
// whatever the device.
void check_device(Session &s, const PluginChoice &c, const std::string &section) {
  if (section.rfind("data.", 0) == 0 || section == "sampler") return;
  const bool cuda = s.host.facts().device.device_type == kDLCUDA;
  const uint32_t need = cuda ? TSR_DEVICE_CUDA : TSR_DEVICE_CPU;
  if (!(c.entry->desc->devices & need))
    throw Error(TSR_ERR_UNSUPPORTED, "[" + section + "] plugin '" + c.entry->desc->name + "' (" +
                                         c.entry->file + ") does not run on " +
                                         (cuda ? "CUDA" : "the CPU"));
}

// The instance's table, name and capabilities from the plugin the job
// chose for `section`, after its device check; returns its config.
template <typename VTable>
tsr_config *choose(Session &s, Instance<VTable> &inst, const std::string &section) {
  const PluginChoice &c = s.job.plugin(section);
  check_device(s, c, section);
  inst.vt = static_cast<const VTable *>(c.entry->desc->vtable);
  inst.name = c.entry->desc->name;
  inst.caps = c.entry->caps;
  return s.host.make_config(section, inst.name, c.values);
}

template <typename VTable>
void create_simple(Session &s, Instance<VTable> &inst, const std::string &section) {
  tsr_config *cfg = choose(s, inst, section);
  plugin_ok(
      s.host, inst.vt->create(s.host.table(), cfg, &inst.self),
      "[" + section + "] plugin '" + inst.name + "' (" + s.job.plugin(section).entry->file + ")");
}

void create_dataset(Session &s, Instance<tsr_dataset_vtable> &inst, tsr_data_info &info,
                    const std::string &section, const char *split) {
  tsr_config *cfg = choose(s, inst, section);
  std::string what = "[" + section + "] dataset '" + inst.name + "'";
  plugin_ok(s.host, inst.vt->create(s.host.table(), cfg, split, &inst.self), what);
  std::memset(&info, 0, sizeof info);
  info.struct_size = tsr_data_info_STRUCT_SIZE;
  plugin_ok(s.host, inst.vt->info(inst.self, &info), what + " info");
  TSR_CHECK(info.input_ndim >= 0 && info.input_ndim <= 8 && info.target_ndim >= 0 &&
                info.target_ndim <= 8,
            TSR_ERR_INVALID, what + " reports more than 8 dimensions");
}

// ---- the phases of building a session, in order ----

// The datasets (or, for a frozen model, only the sample shape) and, when
// training, the sampler.
void open_data(Session &s, const tsr_data_info *model_data) {
  if (model_data) {
    s.train_info = *model_data;
  } else {
    create_dataset(s, s.train_data, s.train_info, "data.train", "train");
    if (s.job.has("data.eval")) create_dataset(s, s.eval_data, s.eval_info, "data.eval", "eval");
  }
  if (s.training) create_simple(s, s.sampler, "sampler");
}

// The model, built for the training data's sample shape, and the flat
// layout of its declared parameters.
void build_model(Session &s) {
  tsr_config *cfg = choose(s, s.model, "model");
  tsr_model_init init{};
  init.struct_size = tsr_model_init_STRUCT_SIZE;
  init.data = &s.train_info;
  init.max_micro_batch = s.job.settings.micro_batch;
  plugin_ok(s.host, s.model.vt->create(s.host.table(), cfg, &init, &s.model.self),
            "[model] plugin '" + s.model.name + "'");
  s.layout = make_layout(s.model.vt, s.model.self, s.host.facts().world_size, s.model.name,
                         s.host.facts().local_world_size);
}

// The zero plugin and, when training, the offload backend (where it keeps
// the parameters itself, the zero plugin must know before it allocates
// them), planned: the plan says which parameters this rank keeps.
void plan_parameters(Session &s) {
  create_simple(s, s.zero, "zero");
  s.plan = tsr_zero_plan{};
  s.plan.struct_size = tsr_zero_plan_STRUCT_SIZE;
  plugin_ok(s.host, s.zero.vt->plan(s.zero.self, &s.plan),
            "[zero] plugin '" + s.zero.name + "' plan");
  if (s.training) {
    create_simple(s, s.offload, "offload");
    param_home_attach(s.home, s.host, s.zero, s.offload);
  }
}

// Initial values, the same on every rank (seeded per parameter name): the
// caller's initializer, else each parameter's declared initialiser or the
// model's file of initial weights (by parameter name). Only the ranges in
// `keep` are written (a rank at a stage that partitions parameters keeps
// slice `rank` of each group): the rest of the buffer stays untouched
// zero pages, so no rank holds a full copy of the model it does not keep.
ZeroedPages<float> initial_weights(Session &s, const ParamInitializer &initializer,
                                   const std::vector<FlatRange> &keep) {
  ZeroedPages<float> initial(s.layout.total);
  if (initializer) {
    initializer(s.layout, initial.data());
    return initial;
  }
  init_params(s.layout, initial.data(), s.host.table()->seed_for(s.host.ctx(), "init", 0), &keep);
  if (auto from = model_weights_file(s.job.plugin("model"), s.model.self)) {
    const ModelCaps &caps = s.job.plugin("model").entry->caps.model;
    std::function<bool(size_t)> may_lack;
    if (caps.init_from_may_lack)
      may_lack = [&](size_t i) { return caps.init_from->may_lack(s.model.self, i) != 0; };
    const std::string msg = init_from_safetensors(*from, s.layout, initial.data(), &keep, may_lack);
    if (s.host.facts().rank == 0) spdlog::info("[model] {}", msg);
  }
  return initial;
}

// Frozen groups: weights only, no gradient or owned state; a zero plugin
// that cannot keep them so is refused rather than given gradients and
// state for every frozen weight.
void mark_frozen(Session &s) {
  const tsr_ext_zero_frozen *ext = s.zero.caps.zero.frozen;
  if (s.layout.frozen_total == 0) return;
  if (!ext)
    throw Error(TSR_ERR_UNSUPPORTED,
                "[model] plugin '" + s.model.name + "' freezes parameters, but [zero] plugin '" +
                    s.zero.name + "' cannot keep them without gradients (no " +
                    TSR_EXT_ZERO_FROZEN + "); use the zero plugins stage0..stage3");
  plugin_ok(s.host,
            ext->frozen(s.zero.self, s.layout.group_frozen.data(), s.layout.group_frozen.size()),
            "[zero] plugin '" + s.zero.name + "' frozen groups");
}

// The zero plugin set up with the initial values in the compute dtype
// (narrowed only where this rank keeps them).
void place_parameters(Session &s, const float *initial, const std::vector<FlatRange> &keep) {
  tsr_zero_setup zs{};
  zs.struct_size = tsr_zero_setup_STRUCT_SIZE;
  zs.num_groups = s.layout.group_offset.size();
  zs.group_offset = s.layout.group_offset.data();
  zs.group_size = s.layout.group_size.data();
  zs.total = s.layout.total;
  zs.device = s.host.facts().device;
  zs.dtype = s.compute_dtype();
  ZeroedPages<uint16_t> initial_narrow;
  if (s.compute_bytes() == 2 && s.home.where == TSR_PARAMS_ON_DEVICE) {
    initial_narrow = ZeroedPages<uint16_t>(s.layout.total);
    const bool bf16 = s.compute_dtype().code == kDLBfloat;
    uint16_t *narrow = initial_narrow.data();
    for (const FlatRange &r : keep)
      for (size_t i = r.begin; i < r.begin + r.count; ++i)
        narrow[i] = bf16 ? sdk::float_to_bf16(initial[i]) : sdk::float_to_f16(initial[i]);
    zs.initial_params = initial_narrow.data();
  } else {
    zs.initial_params = initial;
  }
  zs.training = s.training ? 1 : 0;
  mark_frozen(s);
  plugin_ok(s.host, s.zero.vt->setup(s.zero.self, &zs),
            "[zero] plugin '" + s.zero.name + "' setup");
}

// The optimizer behind the offload backend, the fp32 master copy of what
// this rank owns from the initial values, and which owned ranges each
// group's parameters wait for while an update is in flight.
void attach_update(Session &s, const float *initial) {
  create_simple(s, s.optimizer, "optimizer");
  s.state_count = s.optimizer.vt->state_count(s.optimizer.self);
  tsr_offload_setup os{};
  os.struct_size = tsr_offload_setup_STRUCT_SIZE;
  os.n = s.zero.vt->owned_count(s.zero.self);
  os.optimizer = s.optimizer.vt;
  os.optimizer_self = s.optimizer.self;
  os.state_count = s.state_count;
  os.device = s.host.facts().device;
  os.compute_dtype = s.compute_dtype();
  os.zero_plan = &s.plan;
  plugin_ok(s.host, s.offload.vt->setup(s.offload.self, &os),
            "[offload] plugin '" + s.offload.name + "' setup");
  const std::vector<tsr_owned_range> owned = s.owned_ranges();
  for (const tsr_owned_range &r : owned)
    plugin_ok(s.host,
              s.offload.vt->write_state(s.offload.self, 0, r.owned_offset, r.count,
                                        initial + r.flat_offset),
              "[offload] initial master weights");
  flight_attach(s.flight, s.host, s.offload, s.layout, owned, s.plan.partition_params != 0);
  // The GPU's side of an overlapped update, where the breakdown reports it
  // (observe.cpp's offload part reads the clocks; nothing else would).
  if (s.job.settings.log_breakdown && s.offload.caps.offload.stats &&
      s.offload.caps.offload.wait_params)
    flight_time_gpu(s.flight, s.host.facts().device);
}

}  // namespace

Session::Session(const Job &j, Host::RunFacts facts, bool train, ParamInitializer initializer,
                 const tsr_data_info *model_data)
    : job(j), host(std::move(facts)), training(train) {
  TSR_CHECK(!(model_data && training), TSR_ERR_INTERNAL,
            "a training session needs its datasets (model_data is for frozen models)");
  open_data(*this, model_data);
  build_model(*this);
  plan_parameters(*this);
  const std::vector<FlatRange> keep =
      kept_ranges(layout, plan.partition_params != 0, host.facts().rank);
  const ZeroedPages<float> initial = initial_weights(*this, initializer, keep);
  place_parameters(*this, initial.data(), keep);
  if (training) attach_update(*this, initial.data());
}

std::vector<tsr_owned_range> Session::owned_ranges() {
  return zero_owned_ranges({host, zero.vt, zero.self, zero.name});
}

std::vector<tsr_owned_range> Session::frozen_ranges() {
  std::vector<tsr_owned_range> out;
  const tsr_ext_zero_frozen *ext = zero.caps.zero.frozen;
  if (!ext || layout.frozen_total == 0) return out;
  auto collect = [](void *ctx, const tsr_owned_range *r) -> tsr_status {
    static_cast<std::vector<tsr_owned_range> *>(ctx)->push_back(*r);
    return TSR_OK;
  };
  plugin_ok(host, ext->frozen_ranges(zero.self, collect, &out), "zero", zero.name, "frozen_ranges");
  return out;
}

bool Session::needs_reshare() const {
  return plan.partition_optimizer && !plan.partition_params && host.facts().world_size > 1;
}

Session::~Session() {
  // Plugins that hold host memory go first, in reverse order of creation.
  offload.reset();
  optimizer.reset();
  zero.reset();
  model.reset();
}

DLDataType Session::compute_dtype() const {
  switch (host.facts().precision) {
    case TSR_PRECISION_BF16:
      return DLDataType{kDLBfloat, 16, 1};
    case TSR_PRECISION_FP16:
      return DLDataType{kDLFloat, 16, 1};
    default:
      return DLDataType{kDLFloat, 32, 1};
  }
}

void Session::put_compute(const float *src, size_t n, void *dst) {
  int64_t len = static_cast<int64_t>(n);
  const DLDataType dt = compute_dtype();
  std::vector<uint16_t> narrow;
  const void *from = src;
  if (compute_bytes() == 2) {
    narrow.resize(n);
    const bool bf16 = dt.code == kDLBfloat;
    for (size_t i = 0; i < n; ++i)
      narrow[i] = bf16 ? sdk::float_to_bf16(src[i]) : sdk::float_to_f16(src[i]);
    from = narrow.data();
  }
  DLTensor s{const_cast<void *>(from), DLDevice{kDLCPU, 0}, 1, dt, &len, nullptr, 0};
  DLTensor d{dst, host.facts().device, 1, dt, &len, nullptr, 0};
  // The CPU copy is synchronous; a copy from pageable memory to a GPU
  // completes before returning, so `narrow` may go.
  plugin_ok(host, host.table()->ops->copy(host.ctx(), &s, &d), "copy parameters to the device");
}

void Session::get_compute(const void *src, size_t first, size_t n, float *dst) {
  // Parameters may live on a device: copy through the ops, then widen.
  const DLDataType dt = compute_dtype();
  int64_t len = static_cast<int64_t>(n);
  std::vector<uint16_t> narrow(compute_bytes() == 2 ? n : 0);
  void *host_dst = narrow.empty() ? static_cast<void *>(dst) : static_cast<void *>(narrow.data());
  void *at = const_cast<char *>(static_cast<const char *>(src)) + first * compute_bytes();
  DLTensor from{at, host.facts().device, 1, dt, &len, nullptr, 0};
  DLTensor to{host_dst, DLDevice{kDLCPU, 0}, 1, dt, &len, nullptr, 0};
  plugin_ok(host, host.table()->ops->copy(host.ctx(), &from, &to), "copy parameters");
  if (narrow.empty()) return;
  DLTensor in{narrow.data(), DLDevice{kDLCPU, 0}, 1, dt, &len, nullptr, 0};
  DLTensor out{dst, DLDevice{kDLCPU, 0}, 1, DLDataType{kDLFloat, 32, 1}, &len, nullptr, 0};
  plugin_ok(host, cpu_ops()->cast(host.ctx(), &in, &out), "widen parameters");
}

std::vector<float> Session::gather_params() {
  flight_settle(flight);
  std::vector<float> flat(layout.total, 0.f);
  for (uint32_t g = 0; g < layout.group_offset.size(); ++g) {
    void *base = nullptr;
    plugin_ok(host, zero.vt->params(zero.self, g, 0, &base), "[zero] params");
    get_compute(base, 0, layout.group_size[g], flat.data() + layout.group_offset[g]);
    plugin_ok(host, zero.vt->params_done(zero.self, g), "[zero] params_done");
  }
  plugin_ok(host, zero.vt->end_pass(zero.self), "[zero] end_pass");
  return flat;
}

CheckpointParts Session::checkpoint_parts() {
  return CheckpointParts{
      host,
      layout,
      {zero.vt, zero.self, zero.name},
      {optimizer.vt, optimizer.self, optimizer.name},
      {offload.vt, offload.self, offload.name},
      model.name,
      plan.partition_optimizer != 0,
      needs_reshare(),
      state_count,
      train_info.length,
      [this] { flight_settle(flight); },
      [this](const float *src, size_t n, void *dst) { put_compute(src, n, dst); },
      [this](const void *src, size_t first, size_t n, float *dst) {
        get_compute(src, first, n, dst);
      },
      frozen_ranges(),
      plan.partition_params != 0};
}

}  // namespace tessera
