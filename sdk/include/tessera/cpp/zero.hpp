// A zero plugin's function table (tsr_zero_vtable) built from a C++ class,
// every entry guarded (entries.hpp). The class has the vtable's entries as
// members, less self, with results returned rather than written through an
// out pointer:
//
//   struct MyStage {
//     static constexpr const char *kName = "my_stage";  // for messages
//     const tsr_host *host;                               // or host()
//     void plan(tsr_zero_plan *out) const;
//     void setup(const tsr_zero_setup *setup);
//     size_t owned_count() const;
//     void ranges(tsr_range_fn fn, void *ctx);
//     void *params(uint32_t group, bool backward);
//     void params_done(uint32_t group);
//     void *grads(uint32_t group);
//     void grads_done(uint32_t group, bool last_micro);
//     void end_pass();
//     void finish_grads();
//     double grad_norm_sq();
//     void step(const tsr_zero_step *step);
//     void reshare();      // ABI 1.2: both or neither
//     void clear_grads();
//   };
//   MyStage *build(const tsr_host *, const tsr_config *);
//   const tsr_zero_vtable kVtable = sdk::zero_vtable<MyStage, build>();
#pragma once

#include <tessera/zero.h>

#include <tessera/cpp/entries.hpp>

namespace tessera::sdk {

template <typename Z, auto Build>
struct ZeroEntries {
  static tsr_status create(const tsr_host *host, const tsr_config *cfg, void **out_self) {
    return entries::create<Z>(host, out_self, [&] { return Build(host, cfg); });
  }
  static tsr_status plan(void *self, tsr_zero_plan *out) {
    return entries::call<Z>(self, [&](Z &z) { z.plan(out); });
  }
  static tsr_status setup(void *self, const tsr_zero_setup *setup) {
    return entries::call<Z>(self, [&](Z &z) { z.setup(setup); });
  }
  static size_t owned_count(void *self) {
    return entries::value<Z>(self, size_t{0}, [](Z &z) { return z.owned_count(); });
  }
  static tsr_status ranges(void *self, tsr_range_fn fn, void *ctx) {
    return entries::call<Z>(self, [&](Z &z) { z.ranges(fn, ctx); });
  }
  static tsr_status params(void *self, uint32_t group, int32_t backward, void **out) {
    return entries::call<Z>(self, [&](Z &z) {
      void **o = entries::required<Z>(out, "params out");
      *o = z.params(group, backward != 0);
    });
  }
  static tsr_status params_done(void *self, uint32_t group) {
    return entries::call<Z>(self, [&](Z &z) { z.params_done(group); });
  }
  static tsr_status grads(void *self, uint32_t group, void **out) {
    return entries::call<Z>(self, [&](Z &z) {
      void **o = entries::required<Z>(out, "grads out");
      *o = z.grads(group);
    });
  }
  static tsr_status grads_done(void *self, uint32_t group, int32_t last_micro) {
    return entries::call<Z>(self, [&](Z &z) { z.grads_done(group, last_micro != 0); });
  }
  static tsr_status end_pass(void *self) {
    return entries::call<Z>(self, [](Z &z) { z.end_pass(); });
  }
  static tsr_status finish_grads(void *self) {
    return entries::call<Z>(self, [](Z &z) { z.finish_grads(); });
  }
  static tsr_status grad_norm_sq(void *self, double *out) {
    return entries::call<Z>(self, [&](Z &z) {
      double *o = entries::required<Z>(out, "grad_norm_sq out");
      *o = z.grad_norm_sq();
    });
  }
  static tsr_status step(void *self, const tsr_zero_step *step) {
    return entries::call<Z>(self, [&](Z &z) { z.step(step); });
  }
  static tsr_status reshare(void *self) {
    return entries::call<Z>(self, [](Z &z) { z.reshare(); });
  }
  static tsr_status clear_grads(void *self) {
    return entries::call<Z>(self, [](Z &z) { z.clear_grads(); });
  }
};

// The table for Z: reshare and clear_grads (ABI 1.2) only where Z has them;
// without them the table ends at step and the host calls step() as ABI 1.0
// did.
template <typename Z, auto Build>
constexpr tsr_zero_vtable zero_vtable() {
  using E = ZeroEntries<Z, Build>;
  tsr_zero_vtable t{};
  t.struct_size = TSR_STRUCT_SIZE(tsr_zero_vtable, step);
  t.create = &E::create;
  t.destroy = &entries::destroy<Z>;
  t.plan = &E::plan;
  t.setup = &E::setup;
  t.owned_count = &E::owned_count;
  t.ranges = &E::ranges;
  t.params = &E::params;
  t.params_done = &E::params_done;
  t.grads = &E::grads;
  t.grads_done = &E::grads_done;
  t.end_pass = &E::end_pass;
  t.finish_grads = &E::finish_grads;
  t.grad_norm_sq = &E::grad_norm_sq;
  t.step = &E::step;
  constexpr bool reshare = requires(Z &z) { z.reshare(); };
  static_assert(reshare == requires(Z &z) { z.clear_grads(); },
                "a zero stage of ABI 1.2 has reshare and clear_grads; one of ABI 1.0 neither");
  if constexpr (reshare) {
    t.struct_size = TSR_STRUCT_SIZE(tsr_zero_vtable, clear_grads);
    t.reshare = &E::reshare;
    t.clear_grads = &E::clear_grads;
  }
  return t;
}

}  // namespace tessera::sdk
