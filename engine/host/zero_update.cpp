// The walk over the zero plugin's owned ranges (see zero_update.hpp).
#include "host/zero_update.hpp"

#include "host/plugin_call.hpp"
#include "util/error.hpp"

namespace tessera {

namespace {

// An older zero plugin walks its own ranges: it calls `update` for each and
// `flush` after the last, and the walk's callbacks answer through these.
struct Callbacks {
  const ZeroCalls *zero;
  const RangeWalk *walk;
  size_t next = 0;  // the index of the range the plugin hands over next
};

tsr_status update_cb(void *ctx, const tsr_owned_range *r) {
  auto *c = static_cast<Callbacks *>(ctx);
  return c->walk->each(c->next++, *r);
}

// The plugin's flush means every update has landed: handed over, then
// settled, as the engine's own walk does before a re-share.
tsr_status flush_cb(void *ctx) {
  auto *c = static_cast<Callbacks *>(ctx);
  return guarded(c->zero->host.ctx(), [c] {
    c->walk->handed_over();
    c->walk->settle();
  });
}

}  // namespace

bool engine_walks_ranges(const tsr_zero_vtable *vt) {
  return TSR_HAS_FIELD(vt, tsr_zero_vtable, clear_grads) && vt->reshare && vt->clear_grads;
}

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
                       const RangeWalk &walk, const std::string &step_what) {
  if (!engine_walks_ranges(zero.vt)) {
    Callbacks c{&zero, &walk};
    const tsr_zero_step zs{tsr_zero_step_STRUCT_SIZE, update_cb, flush_cb, &c};
    plugin_ok(zero.host, zero.vt->step(zero.self, &zs), step_what);
    return;
  }
  for (size_t i = 0; i < ranges.size(); ++i)
    plugin_ok(zero.host, walk.each(i, ranges[i]), walk.each_what);
  walk.handed_over();
  if (!walk.reshare) return;
  walk.settle();  // the re-share sends the updated slices: every update must have landed
  plugin_ok(zero.host, zero.vt->reshare(zero.self), "zero", zero.name, "reshare");
}

}  // namespace tessera
