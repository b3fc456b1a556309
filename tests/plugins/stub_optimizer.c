/* See stub_optimizer.h. */
#include "stub_optimizer.h"

static int stub_instance;

tsr_status tsr_test_stub_create(const tsr_host *host, const tsr_config *cfg, void **out_self) {
  (void)host;
  (void)cfg;
  if (!out_self) return TSR_ERR_INVALID;
  *out_self = &stub_instance;
  return TSR_OK;
}

void tsr_test_stub_destroy(void *self) {
  (void)self;
}

uint32_t tsr_test_stub_state_count(void *self) {
  (void)self;
  return 0;
}

const char *tsr_test_stub_state_name(void *self, uint32_t i) {
  (void)self;
  (void)i;
  return NULL;
}

tsr_status tsr_test_stub_step(void *self, const tsr_optimizer_step_args *args) {
  (void)self;
  (void)args;
  return TSR_OK;
}

const tsr_optimizer_vtable tsr_test_stub_vtable = {
    sizeof(tsr_optimizer_vtable), tsr_test_stub_create,     tsr_test_stub_destroy,
    tsr_test_stub_state_count,    tsr_test_stub_state_name, tsr_test_stub_step};
