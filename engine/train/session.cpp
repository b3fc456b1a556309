#include "train/session.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <tessera/cpp/optimizer.hpp>

#include "backend/cpu/cpu_ops.hpp"
#include "ckpt/checkpoint.hpp"
#include "host/zero_update.hpp"
#include "plugin/legacy.hpp"
#include "train/init_from.hpp"
#include "util/error.hpp"

namespace tessera {

namespace {

// The model's file of initial weights: what it answers through
// TSR_EXT_MODEL_INIT_FROM (before ABI 1.2: its `init_from` value).
std::optional<std::string> model_weights_file(const PluginChoice &c, void *self) {
  if (predates_extensions(*c.entry)) return legacy_init_from(c.values);
  const auto *ext = c.entry->extension<tsr_ext_model_init_from>(TSR_EXT_MODEL_INIT_FROM);
  if (!ext || !TSR_HAS_FIELD(ext, tsr_ext_model_init_from, weights_file) || !ext->weights_file)
    return std::nullopt;
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

template <typename VTable>
void create_simple(Session &s, Instance<VTable> &inst, const std::string &section) {
  const PluginChoice &c = s.job.plugin(section);
  check_device(s, c, section);
  inst.vt = static_cast<const VTable *>(c.entry->desc->vtable);
  inst.name = c.entry->desc->name;
  tsr_config *cfg = s.host.make_config(section, inst.name, c.values);
  plugin_ok(s.host, inst.vt->create(s.host.table(), cfg, &inst.self),
            "[" + section + "] plugin '" + inst.name + "' (" + c.entry->file + ")");
}

void create_dataset(Session &s, Instance<tsr_dataset_vtable> &inst, tsr_data_info &info,
                    const std::string &section, const char *split) {
  const PluginChoice &c = s.job.plugin(section);
  check_device(s, c, section);
  inst.vt = static_cast<const tsr_dataset_vtable *>(c.entry->desc->vtable);
  inst.name = c.entry->desc->name;
  tsr_config *cfg = s.host.make_config(section, inst.name, c.values);
  std::string what = "[" + section + "] dataset '" + inst.name + "'";
  plugin_ok(s.host, inst.vt->create(s.host.table(), cfg, split, &inst.self), what);
  std::memset(&info, 0, sizeof info);
  info.struct_size = tsr_data_info_STRUCT_SIZE;
  plugin_ok(s.host, inst.vt->info(inst.self, &info), what + " info");
  TSR_CHECK(info.input_ndim >= 0 && info.input_ndim <= 8 && info.target_ndim >= 0 &&
                info.target_ndim <= 8,
            TSR_ERR_INVALID, what + " reports more than 8 dimensions");
}

}  // namespace

Session::Session(const Job &j, Host::RunFacts facts, bool train, ParamInitializer initializer,
                 const tsr_data_info *model_data)
    : job(j), host(std::move(facts)), training(train) {
  const auto &st = job.settings;
  TSR_CHECK(!(model_data && training), TSR_ERR_INTERNAL,
            "a training session needs its datasets (model_data is for frozen models)");
  if (model_data) {
    train_info = *model_data;
  } else {
    create_dataset(*this, train_data, train_info, "data.train", "train");
    if (job.has("data.eval")) create_dataset(*this, eval_data, eval_info, "data.eval", "eval");
  }
  if (training) create_simple(*this, sampler, "sampler");

  // The model, built for the training data's sample shape.
  {
    const PluginChoice &c = job.plugin("model");
    check_device(*this, c, "model");
    model.vt = static_cast<const tsr_model_vtable *>(c.entry->desc->vtable);
    model.name = c.entry->desc->name;
    tsr_config *cfg = host.make_config("model", model.name, c.values);
    tsr_model_init init{};
    init.struct_size = tsr_model_init_STRUCT_SIZE;
    init.data = &train_info;
    init.max_micro_batch = st.micro_batch;
    plugin_ok(host, model.vt->create(host.table(), cfg, &init, &model.self),
              "[model] plugin '" + model.name + "'");
  }
  layout = make_layout(model.vt, model.self, host.facts().world_size, model.name,
                       host.facts().local_world_size);
  shapes_.resize(layout.params.size());
  for (size_t i = 0; i < layout.params.size(); ++i) shapes_[i] = layout.params[i].shape;

  // Initial values, the same on every rank (seeded per parameter name).
  std::vector<float> initial(layout.total, 0.f);
  if (initializer) {
    initializer(layout, initial.data());
  } else {
    init_params(layout, initial.data(), host.table()->seed_for(host.ctx(), "init", 0));
    // A model that names a file of initial weights (by parameter name)
    // starts from them instead.
    if (auto from = model_weights_file(job.plugin("model"), model.self)) {
      const std::string msg = init_from_safetensors(*from, layout, initial.data());
      if (host.facts().rank == 0) spdlog::info("[model] {}", msg);
    }
  }

  create_simple(*this, zero, "zero");
  plan = tsr_zero_plan{};
  plan.struct_size = tsr_zero_plan_STRUCT_SIZE;
  plugin_ok(host, zero.vt->plan(zero.self, &plan), "[zero] plugin '" + zero.name + "' plan");
  // The offload backend comes first when it keeps the parameters itself:
  // the zero plugin must know before it allocates them.
  if (training) {
    create_simple(*this, offload, "offload");
    source_params_from_offload();
  }
  tsr_zero_setup zs{};
  zs.struct_size = tsr_zero_setup_STRUCT_SIZE;
  zs.num_groups = layout.group_offset.size();
  zs.group_offset = layout.group_offset.data();
  zs.group_size = layout.group_size.data();
  zs.total = layout.total;
  zs.device = host.facts().device;
  zs.dtype = compute_dtype();
  // The zero plugin takes the initial values in the compute dtype.
  std::vector<uint16_t> initial_narrow;
  if (compute_bytes() == 2 && params_home == TSR_PARAMS_ON_DEVICE) {
    initial_narrow.resize(initial.size());
    const bool bf16 = compute_dtype().code == kDLBfloat;
    for (size_t i = 0; i < initial.size(); ++i)
      initial_narrow[i] =
          bf16 ? sdk::optim::float_to_bf16(initial[i]) : sdk::optim::float_to_f16(initial[i]);
    zs.initial_params = initial_narrow.data();
  } else {
    zs.initial_params = initial.data();
  }
  zs.training = training ? 1 : 0;
  plugin_ok(host, zero.vt->setup(zero.self, &zs), "[zero] plugin '" + zero.name + "' setup");

  // Views through the zero plugin: it knows where each group lives now.
  auto group_ptr = [this](uint32_t i, bool grad, DLTensor *out) -> tsr_status {
    if (i >= layout.params.size())
      return host.table()->error(
          host.ctx(), TSR_ERR_INVALID,
          ("parameter index " + std::to_string(i) + " out of range").c_str());
    const ParamSlot &p = layout.params[i];
    void *base = nullptr;
    tsr_status s = grad || !any_in_flight_ ? TSR_OK : wait_near(p.group);
    if (s != TSR_OK) return s;
    s = grad ? zero.vt->grads(zero.self, p.group, &base)
             : zero.vt->params(zero.self, p.group, backward ? 1 : 0, &base);
    if (s != TSR_OK) return s;
    std::memset(out, 0, sizeof *out);
    out->data =
        static_cast<char *>(base) + (p.offset - layout.group_offset[p.group]) * compute_bytes();
    out->device = host.facts().device;
    out->ndim = static_cast<int32_t>(p.shape.size());
    out->dtype = compute_dtype();
    out->shape = shapes_[i].data();
    return TSR_OK;
  };
  hooks.param = [group_ptr](uint32_t i, DLTensor *out) { return group_ptr(i, false, out); };
  hooks.grad = [this, group_ptr](uint32_t i, DLTensor *out) {
    if (!training)
      return host.table()->error(host.ctx(), TSR_ERR_INVALID, "no gradients: the model is frozen");
    return group_ptr(i, true, out);
  };
  // Models name groups by their own numbers; the zero plugin by position.
  auto group_at = [this](uint32_t model_group, uint32_t *g) -> tsr_status {
    if (layout.group_index(model_group, g)) return TSR_OK;
    return host.table()->error(
        host.ctx(), TSR_ERR_INVALID,
        ("model '" + model.name + "' named group " + std::to_string(model_group) +
         ", which none of its parameters declares")
            .c_str());
  };
  hooks.grads_done = [this, group_at](uint32_t mg) {
    uint32_t g = 0;
    tsr_status st = group_at(mg, &g);
    if (st == TSR_OK) st = zero.vt->grads_done(zero.self, g, last_micro);
    if (st == TSR_OK && last_micro && grads_final) st = grads_final(g);
    return st;
  };
  hooks.grads_zeroed = [this] { return backward && grads_zero; };
  hooks.params_done = [this, group_at](uint32_t mg) {
    uint32_t g = 0;
    tsr_status st = group_at(mg, &g);
    return st != TSR_OK ? st : zero.vt->params_done(zero.self, g);
  };
  if (!training) return;

  create_simple(*this, optimizer, "optimizer");
  state_count = optimizer.vt->state_count(optimizer.self);
  tsr_offload_setup os{};
  os.struct_size = tsr_offload_setup_STRUCT_SIZE;
  os.n = zero.vt->owned_count(zero.self);
  os.optimizer = optimizer.vt;
  os.optimizer_self = optimizer.self;
  os.state_count = state_count;
  os.device = host.facts().device;
  os.compute_dtype = compute_dtype();
  os.zero_plan = &plan;
  plugin_ok(host, offload.vt->setup(offload.self, &os),
            "[offload] plugin '" + offload.name + "' setup");
  // The fp32 master copy starts from the initial values of what we own.
  struct Init {
    Session *s;
    const float *initial;
  } init{this, initial.data()};
  auto write_master = [](void *ctx, const tsr_owned_range *r) -> tsr_status {
    auto *in = static_cast<Init *>(ctx);
    return in->s->offload.vt->write_state(in->s->offload.self, 0, r->owned_offset, r->count,
                                          in->initial + r->flat_offset);
  };
  plugin_ok(host, zero.vt->ranges(zero.self, write_master, &init),
            "[offload] initial master weights");
  // Which owned ranges touch each group: the param hook waits for those.
  group_owned_.assign(layout.group_offset.size(), {});
  in_flight_.assign(layout.group_offset.size(), 0);
  for (const tsr_owned_range &r : owned_ranges())
    for (size_t g = 0; g < layout.group_offset.size(); ++g) {
      const size_t lo = layout.group_offset[g], hi = lo + layout.group_size[g];
      if (r.flat_offset < hi && r.flat_offset + r.count > lo)
        group_owned_[g].emplace_back(r.owned_offset, r.count);
    }
}

void Session::source_params_from_offload() {
  const PluginChoice &c = job.plugin("offload");
  offload_params = c.entry->extension<tsr_ext_offload_params>(TSR_EXT_OFFLOAD_PARAMS);
  if (!offload_params || !TSR_HAS_FIELD(offload_params, tsr_ext_offload_params, bytes) ||
      !offload_params->home || !offload_params->fetch || !offload_params->ready) {
    offload_params = nullptr;
    return;
  }
  params_home = offload_params->home(offload.self);
  if (params_home == TSR_PARAMS_ON_DEVICE) return;
  const std::string who = "[offload] plugin '" + offload.name + "' keeps the parameters off the " +
                          "device (its config asks so), ";
  const auto *ext =
      job.plugin("zero").entry->extension<tsr_ext_zero_param_source>(TSR_EXT_ZERO_PARAM_SOURCE);
  if (!ext || !TSR_HAS_FIELD(ext, tsr_ext_zero_param_source, use) || !ext->use)
    throw Error(TSR_ERR_UNSUPPORTED, who + "but [zero] plugin '" + zero.name +
                                         "' cannot take them from it (no " +
                                         TSR_EXT_ZERO_PARAM_SOURCE + "); use ZeRO stage 3");
  param_source_.struct_size = tsr_param_source_STRUCT_SIZE;
  param_source_.self = offload.self;
  param_source_.fetch = offload_params->fetch;
  param_source_.ready = offload_params->ready;
  plugin_ok(host, ext->use(zero.self, &param_source_),
            who + "so [zero] plugin '" + zero.name + "'");
  sink_grads_to_offload();
}

// The gradients follow the parameters off the device where the backend can
// hold them and the zero plugin hand them over; otherwise they stay there.
void Session::sink_grads_to_offload() {
  const auto *og =
      job.plugin("offload").entry->extension<tsr_ext_offload_grads>(TSR_EXT_OFFLOAD_GRADS);
  const auto *zg =
      job.plugin("zero").entry->extension<tsr_ext_zero_grad_sink>(TSR_EXT_ZERO_GRAD_SINK);
  if (!og || !TSR_HAS_FIELD(og, tsr_ext_offload_grads, norm_sq) || !og->put || !og->release ||
      !og->norm_sq || !zg || !TSR_HAS_FIELD(zg, tsr_ext_zero_grad_sink, use) || !zg->use)
    return;
  grad_sink_.struct_size = tsr_grad_sink_STRUCT_SIZE;
  grad_sink_.self = offload.self;
  grad_sink_.put = og->put;
  grad_sink_.release = og->release;
  grad_sink_.norm_sq = og->norm_sq;
  plugin_ok(host, zg->use(zero.self, &grad_sink_),
            "[zero] plugin '" + zero.name + "' taking [offload] plugin '" + offload.name +
                "' as its gradients' sink");
  grads_streamed = true;
}

bool Session::host_drives_update() const {
  return engine_walks_ranges(zero.vt);
}

const std::vector<tsr_owned_range> &Session::owned_ranges() {
  ranges_ = zero_owned_ranges({host, zero.vt, zero.self, zero.name});
  return ranges_;
}

void Session::updates_started() {
  if (!(TSR_HAS_FIELD(offload.vt, tsr_offload_vtable, wait_params) && offload.vt->wait_params)) {
    plugin_ok(host, offload.vt->flush(offload.self), "[offload] flush");
    return;
  }
  for (size_t g = 0; g < in_flight_.size(); ++g) in_flight_[g] = !group_owned_[g].empty();
  any_in_flight_ = true;
}

bool Session::needs_reshare() const {
  return plan.partition_optimizer && !plan.partition_params && host.facts().world_size > 1;
}

void Session::settle_update() {
  if (!any_in_flight_) return;
  plugin_ok(host, offload.vt->flush(offload.self), "[offload] flush");
  std::fill(in_flight_.begin(), in_flight_.end(), 0);
  any_in_flight_ = false;
}

void Session::wait_grads_read() {
  if (TSR_HAS_FIELD(offload.vt, tsr_offload_vtable, wait_grads) && offload.vt->wait_grads)
    plugin_ok(host, offload.vt->wait_grads(offload.self), "[offload] wait_grads");
}

tsr_status Session::wait_group(uint32_t g) {
  if (g >= in_flight_.size() || !in_flight_[g]) return TSR_OK;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto &[offset, count] : group_owned_[g])
    if (tsr_status st = offload.vt->wait_params(offload.self, offset, count); st != TSR_OK)
      return st;
  in_flight_[g] = 0;
  update_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return TSR_OK;
}

tsr_status Session::wait_near(uint32_t g) {
  // Under stage 3 asking for group g also starts the gather of the next
  // group in the pass's direction (prefetch), which reads that group's
  // owned slice: its update must have landed too.
  tsr_status st = wait_group(g);
  if (st != TSR_OK || !plan.partition_params) return st;
  if (backward) return g > 0 ? wait_group(g - 1) : TSR_OK;
  return wait_group(g + 1);
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
      narrow[i] = bf16 ? sdk::optim::float_to_bf16(src[i]) : sdk::optim::float_to_f16(src[i]);
    from = narrow.data();
  }
  DLTensor s{const_cast<void *>(from), DLDevice{kDLCPU, 0}, 1, dt, &len, nullptr, 0};
  DLTensor d{dst, host.facts().device, 1, dt, &len, nullptr, 0};
  // The CPU copy is synchronous; a copy from pageable memory to a GPU
  // completes before returning, so `narrow` may go.
  plugin_ok(host, host.table()->ops->copy(host.ctx(), &s, &d), "copy parameters to the device");
}

std::vector<float> Session::gather_params() {
  settle_update();
  std::vector<float> flat(layout.total, 0.f);
  const DLDataType dt = compute_dtype();
  for (uint32_t g = 0; g < layout.group_offset.size(); ++g) {
    void *base = nullptr;
    plugin_ok(host, zero.vt->params(zero.self, g, 0, &base), "[zero] params");
    // Parameters may live on a device: copy through the ops, then widen.
    int64_t n = static_cast<int64_t>(layout.group_size[g]);
    std::vector<uint16_t> narrow(compute_bytes() == 2 ? static_cast<size_t>(n) : 0);
    void *host_dst = narrow.empty() ? static_cast<void *>(flat.data() + layout.group_offset[g])
                                    : static_cast<void *>(narrow.data());
    DLTensor src{base, host.facts().device, 1, dt, &n, nullptr, 0};
    DLTensor dst{host_dst, DLDevice{kDLCPU, 0}, 1, dt, &n, nullptr, 0};
    plugin_ok(host, host.table()->ops->copy(host.ctx(), &src, &dst), "copy parameters");
    if (!narrow.empty()) {
      int64_t len = n;
      DLTensor in{narrow.data(), DLDevice{kDLCPU, 0}, 1, dt, &len, nullptr, 0};
      DLTensor out{flat.data() + layout.group_offset[g],
                   DLDevice{kDLCPU, 0},
                   1,
                   DLDataType{kDLFloat, 32, 1},
                   &len,
                   nullptr,
                   0};
      plugin_ok(host, cpu_ops()->cast(host.ctx(), &in, &out), "widen parameters");
    }
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
      [this] { settle_update(); },
      [this](const float *src, size_t n, void *dst) { put_compute(src, n, dst); }};
}

}  // namespace tessera
