/* duplicate: built twice (TWIN_VERSION "1.0.0-a" and "1.0.0-b") into one
 * folder; both libraries declare an optimizer named "twin". The first one
 * loaded wins; the second is refused with a message naming both files. */
#include <tessera/optimizer.h>

#include "stub_optimizer.h"

#ifndef TWIN_VERSION
#error "define TWIN_VERSION"
#endif

static const tsr_plugin_descriptor twin_descriptor = {sizeof(tsr_plugin_descriptor),
                                                      TSR_KIND_OPTIMIZER,
                                                      "twin",
                                                      TWIN_VERSION,
                                                      "one of two optimizers with the same name",
                                                      NULL,
                                                      0,
                                                      TSR_DEVICE_CPU,
                                                      &tsr_test_stub_vtable,
                                                      NULL};
static const tsr_plugin_descriptor *const plugins[] = {&twin_descriptor};
static const tsr_plugin_library library = {sizeof(tsr_plugin_library), TSR_ABI_MAJOR, TSR_ABI_MINOR,
                                           plugins, 1};

TSR_PLUGIN_ENTRY {
  return &library;
}
