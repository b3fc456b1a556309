/* unknown_kind: a descriptor of kind "tessera.widget/1", which this host
 * does not know. Its table is a valid optimizer table, so only the kind check
 * can refuse it. */
#include <tessera/optimizer.h>

#include "stub_optimizer.h"

static const tsr_plugin_descriptor gizmo_descriptor = {sizeof(tsr_plugin_descriptor),
                                                       "tessera.widget/1",
                                                       "gizmo",
                                                       "1.0.0",
                                                       "a kind nobody knows",
                                                       NULL,
                                                       0,
                                                       TSR_DEVICE_CPU,
                                                       &tsr_test_stub_vtable,
                                                       NULL};
static const tsr_plugin_descriptor *const plugins[] = {&gizmo_descriptor};
static const tsr_plugin_library library = {sizeof(tsr_plugin_library), TSR_ABI_MAJOR, TSR_ABI_MINOR,
                                           plugins, 1};

TSR_PLUGIN_ENTRY {
  return &library;
}
