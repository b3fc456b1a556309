// An offload plugin's function table (tsr_offload_vtable) built from a C++
// class, every entry guarded (entries.hpp):
//
//   struct MyBackend {
//     static constexpr const char *kName = "offload mine";  // for messages
//     const tsr_host *host;
//     void setup(const tsr_offload_setup *setup);
//     void step(const tsr_offload_step *step);
//     void flush();
//     void read_state(uint32_t slot, size_t offset, size_t count, float *dst);
//     void write_state(uint32_t slot, size_t offset, size_t count, const float *src);
//     // ABI 1.2, the overlapped step: all three or none
//     void wait_params(size_t offset, size_t count);
//     void wait_grads();
//     void stats(tsr_offload_stats *out);
//   };
//   MyBackend *build(const tsr_host *, const tsr_config *);
//   const tsr_offload_vtable kVtable = sdk::offload_vtable<MyBackend, build>();
//
// A class without the 1.2 members gets a table that ends at write_state
// (struct_size says so): a synchronous backend, which the host flushes.
#pragma once

#include <tessera/offload.h>

#include <tessera/cpp/entries.hpp>

namespace tessera::sdk {

template <typename B, auto Build>
constexpr tsr_offload_vtable offload_vtable() {
  // Every entry is one of B's members as it stands.
  using entries::member;
  tsr_offload_vtable t{TSR_STRUCT_SIZE(tsr_offload_vtable, write_state),
                       &entries::create_from<B, Build>,
                       &entries::destroy<B>,
                       member<B, &B::setup>,
                       member<B, &B::step>,
                       member<B, &B::flush>,
                       member<B, &B::read_state>,
                       member<B, &B::write_state>,
                       nullptr,
                       nullptr,
                       nullptr};
  constexpr bool wait_params = requires(B & b) {
    b.wait_params(size_t{0}, size_t{0});
  };
  constexpr bool wait_grads = requires(B & b) {
    b.wait_grads();
  };
  constexpr bool stats = requires(B & b) {
    b.stats(static_cast<tsr_offload_stats *>(nullptr));
  };
  static_assert(wait_params == wait_grads && wait_grads == stats,
                "an offload backend of ABI 1.2 has wait_params, wait_grads and stats; one of "
                "ABI 1.1 none of them");
  if constexpr (stats) {
    t.struct_size = TSR_STRUCT_SIZE(tsr_offload_vtable, stats);
    t.wait_params = member<B, &B::wait_params>;
    t.wait_grads = member<B, &B::wait_grads>;
    t.stats = member<B, &B::stats>;
  }
  return t;
}

}  // namespace tessera::sdk
