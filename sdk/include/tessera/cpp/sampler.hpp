// A sampler plugin's function table (tsr_sampler_vtable) built from a C++
// class, every entry guarded (entries.hpp):
//
//   struct MySampler {
//     static constexpr const char *kName = "my_sampler";  // for messages
//     const tsr_host *host;
//     int64_t epoch_size(const tsr_sampler_args *args);   // this rank's count
//     void indices(const tsr_sampler_args *args, int64_t *out);
//   };
//   MySampler *build(const tsr_host *, const tsr_config *);
//   const tsr_sampler_vtable kVtable = sdk::sampler_vtable<MySampler, build>();
//
// epoch_size's out is checked here ("<kName>: out is NULL"); indices gets
// the caller's pointer as it is (NULL is fine for an empty epoch).
#pragma once

#include <tessera/sampler.h>

#include <tessera/cpp/entries.hpp>

namespace tessera::sdk {

template <typename S>
struct SamplerEntries {
  static tsr_status epoch_size(void *self, const tsr_sampler_args *args, int64_t *out) {
    return entries::call<S>(self, [&](S &s) {
      int64_t *o = entries::required<S>(out, "out");  // before the args, as ever
      *o = s.epoch_size(args);
    });
  }
};

template <typename S, auto Build>
constexpr tsr_sampler_vtable sampler_vtable() {
  using E = SamplerEntries<S>;
  return tsr_sampler_vtable{tsr_sampler_vtable_STRUCT_SIZE, &entries::create_from<S, Build>,
                            &entries::destroy<S>, &E::epoch_size, entries::member<S, &S::indices>};
}

}  // namespace tessera::sdk
