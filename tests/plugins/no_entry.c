/* no_entry: a complete plugin whose author forgot TSR_EXPORT on the entry
 * point. Plugins are built with hidden visibility, so the library exports no
 * tessera_plugin_library symbol at all: the host must refuse it (and must not
 * find the hidden definition some other way). */
#include <tessera/optimizer.h>

#include "stub_optimizer.h"

static const tsr_plugin_descriptor hidden_descriptor = {
    sizeof(tsr_plugin_descriptor),
    TSR_KIND_OPTIMIZER,
    "hidden",
    "1.0.0",
    "never seen: the entry point is not exported",
    NULL,
    0,
    TSR_DEVICE_CPU,
    &tsr_test_stub_vtable,
    NULL};
static const tsr_plugin_descriptor *const plugins[] = {&hidden_descriptor};
static const tsr_plugin_library library = {sizeof(tsr_plugin_library), TSR_ABI_MAJOR, TSR_ABI_MINOR,
                                           plugins, 1};

/* No TSR_EXPORT: hidden like every other symbol of the library. */
const tsr_plugin_library *tessera_plugin_library(void);
const tsr_plugin_library *tessera_plugin_library(void) {
  return &library;
}

/* Something is exported, so the library is a normal loadable one. */
TSR_EXPORT int tessera_test_no_entry_marker(void);
TSR_EXPORT int tessera_test_no_entry_marker(void) {
  return 42;
}
