// The walk over the zero plugin's owned ranges that changes their
// parameters: an optimizer update (train/step.cpp) and a checkpoint load
// (ckpt/checkpoint.cpp). A zero plugin of ABI 1.2 (reshare, clear_grads)
// lets the engine walk its ranges; an older one walks them itself and calls
// the engine back through tsr_zero_step. Both ways are written here once, so
// the step and the load make the same calls in the same order whatever the
// plugin's ABI, and neither caller knows which way ran.
#pragma once

#include <tessera/tessera.h>

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "host/host.hpp"

namespace tessera {

// The zero plugin as a walk calls it: valid while the walk runs.
struct ZeroCalls {
  Host &host;
  const tsr_zero_vtable *vt;
  void *self;
  const std::string &name;
};

// Whether the engine walks the ranges itself: ABI 1.2 split the zero
// plugin's step into reshare and clear_grads, which an older plugin lacks.
bool engine_walks_ranges(const tsr_zero_vtable *vt);

// The ranges this rank owns, in owned order (the zero plugin's ranges()).
std::vector<tsr_owned_range> zero_owned_ranges(const ZeroCalls &zero);

// What one walk does. Each callback returns a status rather than throwing
// so an older zero plugin gets it back unchanged through its callback.
struct RangeWalk {
  // Range i's change (the i-th in owned order).
  std::function<tsr_status(size_t i, const tsr_owned_range &)> each;
  // Names `each` in the error of a walk the engine drives.
  std::string each_what;
  // After the last range: every change has been handed over (an offload
  // backend may still be running them) and then has landed. An older zero
  // plugin calls both as its flush.
  std::function<void()> handed_over, settle;
  // Stages 1-2 at several ranks: each rank changed only its slices of the
  // full parameters, so they are all-gathered (the zero plugin's reshare).
  bool reshare = false;
};

// Under ABI 1.2: `each` over `ranges` (zero_owned_ranges, collected by the
// caller, which may keep them to hand some over early), `handed_over`, then
// with `reshare` `settle` and the zero plugin's reshare; the caller clears
// the gradients when it needs them cleared. Before 1.2: the zero plugin's
// step with `walk` as its callbacks (`ranges` unused); it re-shares as its
// stage needs and clears the gradients itself. `step_what` names that step
// in its error.
void walk_owned_ranges(const ZeroCalls &zero, std::span<const tsr_owned_range> ranges,
                       const RangeWalk &walk, const std::string &step_what);

}  // namespace tessera
