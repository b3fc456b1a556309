// The walk over the zero plugin's owned ranges that changes their
// parameters: an optimizer update (train/step.cpp) and a checkpoint load
// (ckpt/checkpoint.cpp). The engine walks the ranges itself and then asks
// the zero plugin to re-share (ABI 1.2 reshare; a zero plugin before 1.2,
// which walked its own ranges through tsr_zero_step, is refused at load:
// plugin/caps.hpp). Written here once, so the step and the load make the
// same calls in the same order.
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

// The ranges this rank owns, in owned order (the zero plugin's ranges()).
std::vector<tsr_owned_range> zero_owned_ranges(const ZeroCalls &zero);

// What one walk does. `each` returns a status (its errors are a plugin's,
// set through the host table) that the walk reports naming `each_what`.
struct RangeWalk {
  // Range i's change (the i-th in owned order).
  std::function<tsr_status(size_t i, const tsr_owned_range &)> each;
  // Names `each` in the walk's error.
  std::string each_what;
  // After the last range: every change has been handed over (an offload
  // backend may still be running them) and then has landed.
  std::function<void()> handed_over, settle;
  // Stages 1-2 at several ranks: each rank changed only its slices of the
  // full parameters, so they are all-gathered (the zero plugin's reshare).
  bool reshare = false;
};

// `each` over `ranges` (zero_owned_ranges, collected by the caller, which
// may keep them to hand some over early), `handed_over`, then with
// `reshare` `settle` and the zero plugin's reshare; the caller clears the
// gradients when it needs them cleared.
void walk_owned_ranges(const ZeroCalls &zero, std::span<const tsr_owned_range> ranges,
                       const RangeWalk &walk);

}  // namespace tessera
