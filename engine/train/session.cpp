#include "train/session.hpp"

#include <cstring>

#include "util/error.hpp"

namespace tessera {

void plugin_ok(Host &host, tsr_status s, const std::string &what) {
  if (s == TSR_OK) return;
  std::string msg = host.last_error();
  host.clear_error();
  throw Error(s, what + ": " + (msg.empty() ? "failed with status " + std::to_string(s) : msg));
}

namespace {

template <typename VTable>
void create_simple(Session &s, Instance<VTable> &inst, const std::string &section) {
  const PluginChoice &c = s.job.plugin(section);
  inst.vt = static_cast<const VTable *>(c.entry->desc->vtable);
  inst.name = c.entry->desc->name;
  tsr_config *cfg = s.host.make_config(section, inst.name, c.values);
  plugin_ok(s.host, inst.vt->create(s.host.table(), cfg, &inst.self),
            "[" + section + "] plugin '" + inst.name + "' (" + c.entry->file + ")");
}

void create_dataset(Session &s, Instance<tsr_dataset_vtable> &inst, tsr_data_info &info,
                    const std::string &section, const char *split) {
  const PluginChoice &c = s.job.plugin(section);
  inst.vt = static_cast<const tsr_dataset_vtable *>(c.entry->desc->vtable);
  inst.name = c.entry->desc->name;
  tsr_config *cfg = s.host.make_config(section, inst.name, c.values);
  std::string what = "[" + section + "] dataset '" + inst.name + "'";
  plugin_ok(s.host, inst.vt->create(s.host.table(), cfg, split, &inst.self), what);
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  plugin_ok(s.host, inst.vt->info(inst.self, &info), what + " info");
  TSR_CHECK(info.input_ndim >= 0 && info.input_ndim <= 8 && info.target_ndim >= 0 &&
                info.target_ndim <= 8,
            TSR_ERR_INVALID, what + " reports more than 8 dimensions");
}

}  // namespace

Session::Session(const Job &j, Host::RunFacts facts, bool train)
    : job(j), host(std::move(facts)), training(train) {
  const auto &st = job.settings;
  create_dataset(*this, train_data, train_info, "data.train", "train");
  if (job.has("data.eval")) create_dataset(*this, eval_data, eval_info, "data.eval", "eval");
  if (training) create_simple(*this, sampler, "sampler");

  // The model, built for the training data's sample shape.
  {
    const PluginChoice &c = job.plugin("model");
    model.vt = static_cast<const tsr_model_vtable *>(c.entry->desc->vtable);
    model.name = c.entry->desc->name;
    tsr_config *cfg = host.make_config("model", model.name, c.values);
    tsr_model_init init{};
    init.struct_size = sizeof init;
    init.data = &train_info;
    init.max_micro_batch = st.micro_batch;
    plugin_ok(host, model.vt->create(host.table(), cfg, &init, &model.self),
              "[model] plugin '" + model.name + "'");
  }
  layout = make_layout(model.vt, model.self, host.facts().world_size, model.name);
  DLDevice cpu{kDLCPU, 0};
  params = static_cast<float *>(host.alloc(cpu, layout.total * sizeof(float), TSR_MEM_PARAMS));
  init_params(layout, params, host.table()->seed_for(host.ctx(), "init", 0));
  flat_shape = {static_cast<int64_t>(layout.total)};
  shapes_.resize(layout.params.size());
  for (size_t i = 0; i < layout.params.size(); ++i) shapes_[i] = layout.params[i].shape;
  if (!training) return;

  grads = static_cast<float *>(host.alloc(cpu, layout.total * sizeof(float), TSR_MEM_GRADS));
  create_simple(*this, optimizer, "optimizer");
  state_count = optimizer.vt->state_count(optimizer.self);
  create_simple(*this, zero, "zero");
  plan = tsr_zero_plan{};
  plan.struct_size = sizeof plan;
  plugin_ok(host, zero.vt->plan(zero.self, &plan), "[zero] plugin '" + zero.name + "' plan");
  if (plan.partition_optimizer || plan.partition_grads || plan.partition_params)
    throw Error(TSR_ERR_UNSUPPORTED,
                "[zero] plugin '" + zero.name +
                    "' partitions state; this engine build runs ZeRO stage 0 only");
  tsr_zero_setup zs{};
  zs.struct_size = sizeof zs;
  zs.num_groups = layout.group_offset.size();
  zs.group_offset = layout.group_offset.data();
  zs.group_size = layout.group_size.data();
  zs.total = layout.total;
  zs.params = flat_view(params);
  zs.grads = flat_view(grads);
  plugin_ok(host, zero.vt->setup(zero.self, &zs), "[zero] plugin '" + zero.name + "' setup");

  create_simple(*this, offload, "offload");
  tsr_offload_setup os{};
  os.struct_size = sizeof os;
  os.n = layout.total;
  os.optimizer = optimizer.vt;
  os.optimizer_self = optimizer.self;
  os.state_count = state_count;
  os.params = flat_view(params);
  plugin_ok(host, offload.vt->setup(offload.self, &os),
            "[offload] plugin '" + offload.name + "' setup");
}

Session::~Session() {
  // Plugins go first (they may free host memory), then our buffers.
  offload.reset();
  zero.reset();
  optimizer.reset();
  model.reset();
  host.free(params);
  host.free(grads);
}

DLTensor Session::flat_view(float *base) {
  DLTensor t{};
  t.data = base;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = DLDataType{kDLFloat, 32, 1};
  t.shape = flat_shape.data();
  return t;
}

DLTensor Session::param_view(size_t i, bool grad) {
  const ParamSlot &p = layout.params[i];
  DLTensor t{};
  t.data = (grad ? grads : params) + p.offset;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = static_cast<int32_t>(p.shape.size());
  t.dtype = DLDataType{kDLFloat, 32, 1};
  t.shape = shapes_[i].data();
  return t;
}

}  // namespace tessera
