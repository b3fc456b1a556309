// Where the owned compute parameters live (see param_home.hpp).
#include "train/param_home.hpp"

#include <string>
#include <type_traits>

#include "host/plugin_call.hpp"
#include "util/error.hpp"

namespace tessera {

namespace {

// The gradients follow the parameters off the device where the backend can
// hold them and the zero plugin hand them over; otherwise they stay there.
void sink_grads(ParamHome &home, Host &host, const Instance<tsr_zero_vtable> &zero,
                const Instance<tsr_offload_vtable> &offload) {
  const tsr_ext_offload_grads *og = offload.caps.offload.grads;
  const tsr_ext_zero_grad_sink *zg = zero.caps.zero.grad_sink;
  if (!og || !zg) return;
  home.sink.struct_size = tsr_grad_sink_STRUCT_SIZE;
  home.sink.self = offload.self;
  home.sink.put = og->put;
  home.sink.release = og->release;
  home.sink.norm_sq = og->norm_sq;
  plugin_ok(host, zg->use(zero.self, &home.sink),
            "[zero] plugin '" + zero.name + "' taking [offload] plugin '" + offload.name +
                "' as its gradients' sink");
  home.grads_streamed = true;
}

}  // namespace

void param_home_attach(ParamHome &home, Host &host, const Instance<tsr_zero_vtable> &zero,
                       const Instance<tsr_offload_vtable> &offload) {
  const tsr_ext_offload_params *op = offload.caps.offload.params;
  if (!op) return;
  home.where = op->home(offload.self);
  if (home.where == TSR_PARAMS_ON_DEVICE) return;
  const std::string who = "[offload] plugin '" + offload.name + "' keeps the parameters off the " +
                          "device (its config asks so), ";
  const tsr_ext_zero_param_source *ext = zero.caps.zero.param_source;
  if (!ext)
    throw Error(TSR_ERR_UNSUPPORTED, who + "but [zero] plugin '" + zero.name +
                                         "' cannot take them from it (no " +
                                         TSR_EXT_ZERO_PARAM_SOURCE + "); use ZeRO stage 3");
  home.source.struct_size = tsr_param_source_STRUCT_SIZE;
  home.source.self = offload.self;
  home.source.fetch = op->fetch;
  home.source.ready = op->ready;
  plugin_ok(host, ext->use(zero.self, &home.source), who + "so [zero] plugin '" + zero.name + "'");
  sink_grads(home, host, zero, offload);
}

void param_home_check(const Job &job) {
  if (!job.has("zero") || !job.has("offload")) return;
  Host host{Host::RunFacts{}};
  Instance<tsr_zero_vtable> zero;
  Instance<tsr_offload_vtable> offload;
  auto create = [&](auto &inst, const std::string &section) {
    const PluginChoice &c = job.plugin(section);
    inst.vt = static_cast<std::remove_reference_t<decltype(*inst.vt)> *>(c.entry->desc->vtable);
    inst.name = c.entry->desc->name;
    inst.caps = c.entry->caps;
    tsr_config *cfg = host.make_config(section, inst.name, c.values);
    plugin_ok(host, inst.vt->create(host.table(), cfg, &inst.self),
              "[" + section + "] plugin '" + inst.name + "' (" + c.entry->file + ")");
  };
  create(zero, "zero");
  create(offload, "offload");
  ParamHome home;
  param_home_attach(home, host, zero, offload);
  offload.reset();  // the backend first, as the session lets them go
  zero.reset();
}

}  // namespace tessera
