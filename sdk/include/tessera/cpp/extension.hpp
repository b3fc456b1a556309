// A plugin's get_extension (ABI 1.2) from a list of (id, table) pairs:
//
//   const tsr_ext_optimizer_lr kLr = {tsr_ext_optimizer_lr_STRUCT_SIZE, base_lr};
//   const sdk::Extension kExtensions[] = {{TSR_EXT_OPTIMIZER_LR, &kLr}};
//   const void *get_extension(const char *id) { return sdk::find_extension(kExtensions, id); }
#pragma once

#include <tessera/tessera.h>

#include <cstddef>
#include <cstring>

namespace tessera::sdk {

struct Extension {
  const char *id;     // TSR_EXT_*
  const void *table;  // static storage
};

template <size_t N>
const void *find_extension(const Extension (&list)[N], const char *id) {
  if (!id) return nullptr;
  for (const Extension &e : list)
    if (std::strcmp(e.id, id) == 0) return e.table;
  return nullptr;
}

}  // namespace tessera::sdk
