/* zero_before_1_2: a zero plugin as ABI 1.0 and 1.1 built it: its function
 * table ends before reshare and clear_grads, so it would walk its own
 * ranges through step(). tessera serves zero plugins from ABI 1.2 on
 * (docs/abi.md, "Version policy"): the host refuses it at load, naming it
 * and its file. Its functions are never called, so none is set. */
#include <tessera/zero.h>

static const tsr_zero_vtable old_vtable = {offsetof(tsr_zero_vtable, reshare),
                                           NULL,
                                           NULL,
                                           NULL,
                                           NULL,
                                           NULL,
                                           NULL,
                                           NULL,
                                           NULL,
                                           NULL,
                                           NULL,
                                           NULL,
                                           NULL,
                                           NULL,
                                           NULL,
                                           NULL,
                                           NULL};

static const tsr_plugin_descriptor old_zero_descriptor = {sizeof(tsr_plugin_descriptor),
                                                          TSR_KIND_ZERO,
                                                          "old_zero",
                                                          "1.0.0",
                                                          "a zero plugin built before ABI 1.2",
                                                          NULL,
                                                          0,
                                                          TSR_DEVICE_CPU,
                                                          &old_vtable,
                                                          NULL};
static const tsr_plugin_descriptor *const plugins[] = {&old_zero_descriptor};
static const tsr_plugin_library library = {sizeof(tsr_plugin_library), TSR_ABI_MAJOR, 1, plugins,
                                           1};

TSR_PLUGIN_ENTRY {
  return &library;
}
