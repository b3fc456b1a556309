// A dataset plugin's function table (tsr_dataset_vtable) built from a C++
// class, every entry guarded (entries.hpp), so a plugin writes its dataset
// and not the glue:
//
//   struct MyData {
//     static constexpr const char *kName = "my_data";  // for messages
//     const tsr_host *host;
//     void info(tsr_data_info *out);                    // the sample shape
//     void read(const int64_t *indices, tsr_batch *out);  // concurrent calls
//   };
//   MyData *build(const tsr_host *, const tsr_config *, const char *split);
//   const tsr_dataset_vtable kVtable = sdk::dataset_vtable<MyData, build>();
#pragma once

#include <tessera/dataset.h>

#include <tessera/cpp/entries.hpp>

namespace tessera::sdk {

template <typename D, auto Build>
constexpr tsr_dataset_vtable dataset_vtable() {
  return tsr_dataset_vtable{tsr_dataset_vtable_STRUCT_SIZE,
                            &entries::create_from<D, Build, const char *>, &entries::destroy<D>,
                            entries::member<D, &D::info>, entries::member<D, &D::read>};
}

}  // namespace tessera::sdk
