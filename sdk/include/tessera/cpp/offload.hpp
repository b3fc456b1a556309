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
struct OffloadEntries {
  static tsr_status create(const tsr_host *host, const tsr_config *cfg, void **out_self) {
    return entries::create<B>(host, out_self, [&] { return Build(host, cfg); });
  }
  static tsr_status setup(void *self, const tsr_offload_setup *setup) {
    return entries::call<B>(self, [&](B &b) { b.setup(setup); });
  }
  static tsr_status step(void *self, const tsr_offload_step *step) {
    return entries::call<B>(self, [&](B &b) { b.step(step); });
  }
  static tsr_status flush(void *self) {
    return entries::call<B>(self, [](B &b) { b.flush(); });
  }
  static tsr_status read_state(void *self, uint32_t slot, size_t offset, size_t count,
                               float *dst) {
    return entries::call<B>(self, [&](B &b) { b.read_state(slot, offset, count, dst); });
  }
  static tsr_status write_state(void *self, uint32_t slot, size_t offset, size_t count,
                                const float *src) {
    return entries::call<B>(self, [&](B &b) { b.write_state(slot, offset, count, src); });
  }
  static tsr_status wait_params(void *self, size_t offset, size_t count) {
    return entries::call<B>(self, [&](B &b) { b.wait_params(offset, count); });
  }
  static tsr_status wait_grads(void *self) {
    return entries::call<B>(self, [](B &b) { b.wait_grads(); });
  }
  static tsr_status stats(void *self, tsr_offload_stats *out) {
    return entries::call<B>(self, [&](B &b) { b.stats(out); });
  }
};

template <typename B, auto Build>
constexpr tsr_offload_vtable offload_vtable() {
  using E = OffloadEntries<B, Build>;
  tsr_offload_vtable t{};
  t.struct_size = TSR_STRUCT_SIZE(tsr_offload_vtable, write_state);
  t.create = &E::create;
  t.destroy = &entries::destroy<B>;
  t.setup = &E::setup;
  t.step = &E::step;
  t.flush = &E::flush;
  t.read_state = &E::read_state;
  t.write_state = &E::write_state;
  constexpr bool wait_params = requires(B &b) { b.wait_params(size_t{0}, size_t{0}); };
  constexpr bool wait_grads = requires(B &b) { b.wait_grads(); };
  constexpr bool stats = requires(B &b) { b.stats(static_cast<tsr_offload_stats *>(nullptr)); };
  static_assert(wait_params == wait_grads && wait_grads == stats,
                "an offload backend of ABI 1.2 has wait_params, wait_grads and stats; one of "
                "ABI 1.1 none of them");
  if constexpr (stats) {
    t.struct_size = TSR_STRUCT_SIZE(tsr_offload_vtable, stats);
    t.wait_params = &E::wait_params;
    t.wait_grads = &E::wait_grads;
    t.stats = &E::stats;
  }
  return t;
}

}  // namespace tessera::sdk
