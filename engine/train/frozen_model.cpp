// A checkpoint's model on its own (frozen_model.hpp).
#include "train/frozen_model.hpp"

#include <filesystem>

#include "host/plugin_call.hpp"
#include "plugin/legacy.hpp"
#include "util/error.hpp"

namespace fs = std::filesystem;

namespace tessera {

tsr_data_info model_data_info(const Job &job, const std::string &where,
                              const std::string &purpose) {
  const PluginChoice &c = job.plugin("data.train");
  const std::string who = "[data.train] plugin '" + std::string(c.entry->desc->name) + "'";
  const std::string needs =
      ": " + purpose + " needs a language model trained on token windows (the tokens dataset)";
  if (predates_extensions(*c.entry)) {
    const auto shape = legacy_window_shape(c.values);
    if (!shape) throw Error(TSR_ERR_UNSUPPORTED, where + ": " + who + " has no 'context'" + needs);
    tsr_data_info info{};
    info.struct_size = tsr_data_info_STRUCT_SIZE;
    info.input_dtype = DLDataType{kDLInt, 32, 1};
    info.input_ndim = 1;
    info.input_shape[0] = shape->first;
    info.target_dtype = info.input_dtype;
    info.target_ndim = 1;
    info.target_shape[0] = shape->first;
    info.num_classes = shape->second;
    info.length = 1;
    return info;
  }
  const tsr_ext_dataset_shape *ext = c.entry->caps.dataset.shape;
  if (!ext)
    throw Error(TSR_ERR_UNSUPPORTED, where + ": " + who + " offers no sample shape (extension " +
                                         TSR_EXT_DATASET_SHAPE + ")" + needs);
  // The plugin reads its config through a host: a CPU one for the query.
  Host probe{Host::RunFacts{}};
  tsr_config *cfg = probe.make_config("data.train", c.entry->desc->name, c.values);
  tsr_data_info info{};
  info.struct_size = tsr_data_info_STRUCT_SIZE;
  plugin_ok(probe, ext->shape(probe.table(), cfg, &info), who + " shape");
  if (info.input_ndim != 1 || info.input_dtype.code != kDLInt || info.input_shape[0] < 1)
    throw Error(TSR_ERR_UNSUPPORTED,
                where + ": " + who + " gives samples that are no token window" + needs);
  info.length = 1;
  return info;
}

Job checkpoint_job(const std::string &manifest_path, const std::string &config_text,
                   const std::vector<std::string> &plugin_paths) {
  JobOptions jo;
  jo.config_path = manifest_path;
  jo.config_text = config_text;
  // One process, one sample, on the CPU: the run's batch sizes (fitted to
  // its world size), device and DeepSpeed file (already folded into the
  // config) go.
  jo.sets = {"batch.global=1",   "batch.micro=1",    "batch.accumulation=1",
             "run.deepspeed=''", "run.device='cpu'", "run.precision='fp32'"};
  jo.plugin_paths = plugin_paths;
  return load_job(jo, 1, false);
}

FrozenModel::FrozenModel(Job job, const std::string &ckpt_dir)
    : job_(std::move(job)), host_(std::make_unique<Host>(Host::RunFacts{})) {
  const PluginChoice &c = job_.plugin("model");
  vt = static_cast<const tsr_model_vtable *>(c.entry->desc->vtable);
  name = c.entry->desc->name;
  const tsr_data_info info =
      model_data_info(job_, (fs::path(ckpt_dir) / "manifest.json").string(), "the export");
  std::error_code ec;
  const fs::path here = fs::current_path(ec);
  try {
    create(info);
    return;
  } catch (const Error &e) {
    if (e.code() != TSR_ERR_IO || ec) throw;
    // Try the directories above the checkpoint, nearest first.
    for (fs::path d = fs::absolute(ckpt_dir, ec).parent_path(); !d.empty() && !ec;
         d = d.parent_path()) {
      fs::current_path(d, ec);
      try {
        if (!ec) create(info);
      } catch (const Error &) {
      }
      fs::current_path(here, ec);
      if (self) return;
      if (d == d.parent_path()) break;
    }
    throw Error(e.code(), std::string(e.what()) +
                              "; the model was built from the run's config in the current "
                              "directory and each one above the checkpoint: run the export "
                              "from the run's working directory");
  }
}

void FrozenModel::create(const tsr_data_info &info) {
  tsr_config *cfg = host_->make_config("model", name, job_.plugin("model").values);
  tsr_model_init init{};
  init.struct_size = tsr_model_init_STRUCT_SIZE;
  init.data = &info;
  init.max_micro_batch = 1;
  plugin_ok(*host_, vt->create(host_->table(), cfg, &init, &self), "[model] plugin '" + name + "'");
}

FrozenModel::~FrozenModel() {
  if (vt && self) vt->destroy(self);
}

}  // namespace tessera
