/* abi_major: a library built for a future ABI 2.3. Its plugin list is
 * garbage to a 1.0 reader (NULL with a count), so a host that skipped the
 * major check would refuse it for a different reason, or crash. */
#include <tessera/abi.h>

static const tsr_plugin_library library = {sizeof(tsr_plugin_library), 2, 3, NULL, 5};

TSR_PLUGIN_ENTRY {
  return &library;
}
