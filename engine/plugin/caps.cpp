// Each plugin's optional entries and extensions, resolved once (caps.hpp).
// The one place, beside plugin/legacy.cpp, that reads struct sizes of a
// plugin's tables (tools/check-layers refuses TSR_HAS_FIELD elsewhere in
// the engine).
#include "plugin/caps.hpp"

namespace tessera {

namespace {

// The table of extension `id` when it holds `field`, else nullptr.
template <typename T>
const T *table_with(const tsr_plugin_descriptor *desc, const char *id, size_t field_end) {
  if (!caps_has_extensions(desc)) return nullptr;
  const auto *t = static_cast<const T *>(desc->get_extension(id));
  return t && t->struct_size >= field_end ? t : nullptr;
}

// Extension `id`'s table when it holds `field` and that function is set.
#define CAPS_EXT(desc, type, id, field)                                                      \
  [&]() -> const type * {                                                                    \
    const type *t = table_with<type>(desc, id, offsetof(type, field) + sizeof(type::field)); \
    return t && t->field ? t : nullptr;                                                      \
  }()

ModelCaps model_caps(const tsr_plugin_descriptor *d) {
  ModelCaps c;
  const auto *vt = static_cast<const tsr_model_vtable *>(d->vtable);
  c.predict = TSR_HAS_FIELD(vt, tsr_model_vtable, predict) && vt->predict;
  c.init_from = CAPS_EXT(d, tsr_ext_model_init_from, TSR_EXT_MODEL_INIT_FROM, weights_file);
  c.init_from_may_lack =
      CAPS_EXT(d, tsr_ext_model_init_from, TSR_EXT_MODEL_INIT_FROM, may_lack) != nullptr;
  c.export_hf = CAPS_EXT(d, tsr_ext_model_export_hf, TSR_EXT_MODEL_EXPORT_HF, write);
  return c;
}

ZeroCaps zero_caps(const tsr_plugin_descriptor *d) {
  ZeroCaps c;
  const auto *vt = static_cast<const tsr_zero_vtable *>(d->vtable);
  c.split_step = TSR_HAS_FIELD(vt, tsr_zero_vtable, clear_grads) && vt->reshare && vt->clear_grads;
  c.param_source = CAPS_EXT(d, tsr_ext_zero_param_source, TSR_EXT_ZERO_PARAM_SOURCE, use);
  c.grad_sink = CAPS_EXT(d, tsr_ext_zero_grad_sink, TSR_EXT_ZERO_GRAD_SINK, use);
  c.frozen = CAPS_EXT(d, tsr_ext_zero_frozen, TSR_EXT_ZERO_FROZEN, frozen_ranges);
  c.final_groups = CAPS_EXT(d, tsr_ext_zero_final_groups, TSR_EXT_ZERO_FINAL_GROUPS, take_final);
  return c;
}

OffloadCaps offload_caps(const tsr_plugin_descriptor *d) {
  OffloadCaps c;
  const auto *vt = static_cast<const tsr_offload_vtable *>(d->vtable);
  c.wait_params = TSR_HAS_FIELD(vt, tsr_offload_vtable, wait_params) && vt->wait_params;
  c.wait_grads = TSR_HAS_FIELD(vt, tsr_offload_vtable, wait_grads) && vt->wait_grads;
  c.stats = TSR_HAS_FIELD(vt, tsr_offload_vtable, stats) && vt->stats;
  // bytes is the last field (the start-up report calls it); the other
  // three must be set too.
  c.params = CAPS_EXT(d, tsr_ext_offload_params, TSR_EXT_OFFLOAD_PARAMS, bytes);
  if (c.params && !(c.params->home && c.params->fetch && c.params->ready)) c.params = nullptr;
  c.grads = CAPS_EXT(d, tsr_ext_offload_grads, TSR_EXT_OFFLOAD_GRADS, norm_sq);
  if (c.grads && !(c.grads->put && c.grads->release)) c.grads = nullptr;
  c.speculate = CAPS_EXT(d, tsr_ext_offload_speculate, TSR_EXT_OFFLOAD_SPECULATE, stats);
  if (c.speculate && !(c.speculate->begin && c.speculate->resolve)) c.speculate = nullptr;
  return c;
}

}  // namespace

bool caps_has_extensions(const tsr_plugin_descriptor *desc) {
  return desc && TSR_HAS_FIELD(desc, tsr_plugin_descriptor, get_extension) && desc->get_extension;
}

PluginCaps caps_resolve(const std::string &kind, const tsr_plugin_descriptor *desc) {
  PluginCaps c;
  if (!desc || !desc->vtable) return c;
  c.extensions = caps_has_extensions(desc);
  if (kind == "model") {
    c.model = model_caps(desc);
  } else if (kind == "dataset") {
    c.dataset.shape = CAPS_EXT(desc, tsr_ext_dataset_shape, TSR_EXT_DATASET_SHAPE, shape);
  } else if (kind == "optimizer") {
    c.optimizer.lr = CAPS_EXT(desc, tsr_ext_optimizer_lr, TSR_EXT_OPTIMIZER_LR, base_lr);
  } else if (kind == "zero") {
    c.zero = zero_caps(desc);
  } else if (kind == "offload") {
    c.offload = offload_caps(desc);
  }
  return c;
}

#undef CAPS_EXT

std::string caps_zero_refusal(const tsr_plugin_descriptor *desc) {
  if (zero_caps(desc).split_step) return "";
  const size_t have = *static_cast<const size_t *>(desc->vtable);
  return "a zero plugin built before ABI 1.2 (its function table is " + std::to_string(have) +
         " bytes, without reshare and clear_grads set; 1.2's is " +
         std::to_string(tsr_zero_vtable_STRUCT_SIZE) +
         "): zero plugins ship with tessera, which serves them from ABI 1.2 on (docs/abi.md, "
         "\"Version policy\"); rebuild it against this SDK, or use the zero plugins of "
         "this tessera";
}

}  // namespace tessera
