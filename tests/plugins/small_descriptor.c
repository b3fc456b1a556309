/* small_descriptor: a plugin descriptor whose struct_size ends before its
 * last ABI 1.0 field (the function table). The field is filled in, so a host
 * that ignored struct_size would accept it. */
#include <tessera/optimizer.h>

#include "stub_optimizer.h"

static const tsr_plugin_descriptor stubby_descriptor = {offsetof(tsr_plugin_descriptor, vtable),
                                                        TSR_KIND_OPTIMIZER,
                                                        "stubby",
                                                        "1.0.0",
                                                        "descriptor struct_size too small",
                                                        NULL,
                                                        0,
                                                        TSR_DEVICE_CPU,
                                                        &tsr_test_stub_vtable,
                                                        NULL};
static const tsr_plugin_descriptor *const plugins[] = {&stubby_descriptor};
static const tsr_plugin_library library = {sizeof(tsr_plugin_library), TSR_ABI_MAJOR, TSR_ABI_MINOR,
                                           plugins, 1};

TSR_PLUGIN_ENTRY {
  return &library;
}
