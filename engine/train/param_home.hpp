// Where the owned compute parameters live and where the reduced gradients
// go: with the zero plugin on the device (the default), or with the
// offload backend in host memory or on disk (TSR_EXT_OFFLOAD_PARAMS, handed
// to the zero plugin as a parameter source), the gradients then following
// them as each bucket completes (TSR_EXT_OFFLOAD_GRADS) where both plugins
// can.
#pragma once

#include <tessera/tessera.h>

#include "host/host.hpp"
#include "train/instance.hpp"
#include "train/job.hpp"

namespace tessera {

struct ParamHome {
  // TSR_PARAMS_ON_DEVICE, _ON_HOST or _ON_DISK: the offload backend's answer.
  int32_t where = TSR_PARAMS_ON_DEVICE;
  // The reduced gradients go to the offload backend, not the device.
  bool grads_streamed = false;
  // What the zero plugin was handed: they must live as long as it.
  tsr_param_source source{};
  tsr_grad_sink sink{};
};

// Asks the offload backend where it keeps the parameters and, when not on
// the device, hands them (and the gradients, where both plugins can) to the
// zero plugin. Both are created; the zero plugin is not set up yet.
void param_home_attach(ParamHome &home, Host &host, const Instance<tsr_zero_vtable> &zero,
                       const Instance<tsr_offload_vtable> &offload);

// `tessera config check`: the job's zero and offload plugins created as a
// run creates them (on the CPU, one rank; creation reads their config and
// allocates nothing) and joined by param_home_attach, so that a pair the run
// refuses at start-up (parameter offload below ZeRO stage 3) is refused
// here, in the plugins' own words.
void param_home_check(const Job &job);

}  // namespace tessera
