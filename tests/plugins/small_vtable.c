/* small_vtable: an optimizer whose function table's struct_size ends before
 * `step`, as if built against an older, shorter table. */
#include <tessera/optimizer.h>

#include "stub_optimizer.h"

static const tsr_optimizer_vtable short_vtable = {offsetof(tsr_optimizer_vtable, step),
                                                  tsr_test_stub_create,
                                                  tsr_test_stub_destroy,
                                                  tsr_test_stub_state_count,
                                                  tsr_test_stub_state_name,
                                                  NULL};

static const tsr_plugin_descriptor shorty_descriptor = {sizeof(tsr_plugin_descriptor),
                                                        TSR_KIND_OPTIMIZER,
                                                        "shorty",
                                                        "1.0.0",
                                                        "optimizer function table too small",
                                                        NULL,
                                                        0,
                                                        TSR_DEVICE_CPU,
                                                        &short_vtable,
                                                        NULL};
static const tsr_plugin_descriptor *const plugins[] = {&shorty_descriptor};
static const tsr_plugin_library library = {sizeof(tsr_plugin_library), TSR_ABI_MAJOR, TSR_ABI_MINOR,
                                           plugins, 1};

TSR_PLUGIN_ENTRY {
  return &library;
}
