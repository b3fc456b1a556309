/* ctor_crash: a library whose static constructor crashes, as a broken
 * dependency's initialiser would. Loading it in the host process would kill
 * every run (rc 139, no message), whatever the config names: the registry
 * must load it in a child process first and refuse it, naming the file. */
#include <signal.h>
#include <tessera/abi.h>

static void crash_on_load(void) __attribute__((constructor));
static void crash_on_load(void) {
  raise(SIGSEGV);
}

TSR_PLUGIN_ENTRY {
  return NULL;
}
