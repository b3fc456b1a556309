/* ctor_hang: a library whose static constructor never returns, as an
 * initialiser waiting on a lock or a network service would. The registry
 * probes it in a child process and gives up after its deadline; probes of
 * several such libraries run side by side, once per launch (issue 53). */
#define _POSIX_C_SOURCE 200809L
#include <tessera/abi.h>
#include <unistd.h>

static void hang_on_load(void) __attribute__((constructor));
static void hang_on_load(void) {
  for (;;) pause();
}

TSR_PLUGIN_ENTRY {
  return NULL;
}
