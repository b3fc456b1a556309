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

template <typename Z>
struct ZeroEntries {
  static size_t owned_count(void *self) {
    return entries::value<Z>(self, size_t{0}, [](Z &z) { return z.owned_count(); });
  }
  static tsr_status params(void *self, uint32_t group, int32_t backward, void **out) {
    return entries::call<Z>(self, [&](Z &z) {
      void **o = entries::required<Z>(out, "params out");
      *o = z.params(group, backward != 0);
    });
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
  static tsr_status grad_norm_sq(void *self, double *out) {
    return entries::call<Z>(self, [&](Z &z) {
      double *o = entries::required<Z>(out, "grad_norm_sq out");
      *o = z.grad_norm_sq();
    });
  }
};

// The table for Z: reshare and clear_grads (ABI 1.2) only where Z has them;
// without them the table ends at step, and this tessera refuses the plugin
// at load (docs/abi.md, "Version policy": zero plugins from 1.2 on).
template <typename Z, auto Build>
constexpr tsr_zero_vtable zero_vtable() {
  using E = ZeroEntries<Z>;
  using entries::member;
  tsr_zero_vtable t{TSR_STRUCT_SIZE(tsr_zero_vtable, step),
                    &entries::create_from<Z, Build>,
                    &entries::destroy<Z>,
                    member<Z, &Z::plan>,
                    member<Z, &Z::setup>,
                    &E::owned_count,
                    member<Z, &Z::ranges>,
                    &E::params,
                    member<Z, &Z::params_done>,
                    &E::grads,
                    &E::grads_done,
                    member<Z, &Z::end_pass>,
                    member<Z, &Z::finish_grads>,
                    &E::grad_norm_sq,
                    member<Z, &Z::step>,
                    nullptr,
                    nullptr};
  constexpr bool reshare = requires(Z & z) {
    z.reshare();
  };
  static_assert(
      reshare == requires(Z & z) { z.clear_grads(); },
      "a zero stage of ABI 1.2 has reshare and clear_grads; one of ABI 1.0 neither");
  if constexpr (reshare) {
    t.struct_size = TSR_STRUCT_SIZE(tsr_zero_vtable, clear_grads);
    t.reshare = member<Z, &Z::reshare>;
    t.clear_grads = member<Z, &Z::clear_grads>;
  }
  return t;
}

}  // namespace tessera::sdk
