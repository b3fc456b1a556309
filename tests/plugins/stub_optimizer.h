/* A do-nothing optimizer function table for test plugins whose point is
 * their descriptor, not their math. C99. */
#ifndef TESSERA_TEST_STUB_OPTIMIZER_H
#define TESSERA_TEST_STUB_OPTIMIZER_H

#include <tessera/optimizer.h>

/* create succeeds with a non-NULL self; step changes nothing. */
tsr_status tsr_test_stub_create(const tsr_host *host, const tsr_config *cfg, void **out_self);
void tsr_test_stub_destroy(void *self);
uint32_t tsr_test_stub_state_count(void *self);
const char *tsr_test_stub_state_name(void *self, uint32_t i);
tsr_status tsr_test_stub_step(void *self, const tsr_optimizer_step_args *args);

/* All of the above, struct_size = sizeof(tsr_optimizer_vtable). */
extern const tsr_optimizer_vtable tsr_test_stub_vtable;

#endif /* TESSERA_TEST_STUB_OPTIMIZER_H */
