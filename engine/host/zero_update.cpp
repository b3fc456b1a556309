// The walk over the zero plugin's owned ranges (see zero_update.hpp).
#include "host/zero_update.hpp"

#include "host/plugin_call.hpp"
#include "util/error.hpp"

namespace tessera {

std::vector<tsr_owned_range> zero_owned_ranges(const ZeroCalls &zero) {
  std::vector<tsr_owned_range> out;
  auto collect = [](void *ctx, const tsr_owned_range *r) -> tsr_status {
    static_cast<std::vector<tsr_owned_range> *>(ctx)->push_back(*r);
    return TSR_OK;
  };
  plugin_ok(zero.host, zero.vt->ranges(zero.self, collect, &out), "zero", zero.name, "ranges");
  return out;
}

void walk_owned_ranges(const ZeroCalls &zero, std::span<const tsr_owned_range> ranges,
                       const RangeWalk &walk) {
  for (size_t i = 0; i < ranges.size(); ++i)
    plugin_ok(zero.host, walk.each(i, ranges[i]), walk.each_what);
  walk.handed_over();
  if (!walk.reshare) return;
  walk.settle();  // the re-share sends the updated slices: every update must have landed
  plugin_ok(zero.host, zero.vt->reshare(zero.self), "zero", zero.name, "reshare");
}

}  // namespace tessera
