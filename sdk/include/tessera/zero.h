/* Kind tessera.zero/1: what each rank owns, and how gradients and
 * parameters are exchanged. The host lays parameters out group after group,
 * each group padded to a multiple of the world size; rank r owns slice r of
 * every group (all of it when nothing is partitioned). */
#ifndef TESSERA_ZERO_H
#define TESSERA_ZERO_H

#include <tessera/host.h>

/* What a stage partitions; the host sizes its buffers from this. */
typedef struct tsr_zero_plan {
  size_t struct_size;
  int32_t partition_optimizer; /* stages 1-3 */
  int32_t partition_grads;     /* stages 2-3 */
  int32_t partition_params;    /* stage 3 */
} tsr_zero_plan;

/* The flat layout and the buffers the host allocated. */
typedef struct tsr_zero_setup {
  size_t struct_size;
  size_t num_groups;
  const size_t *group_offset; /* element offset of each group in the full flat buffer */
  const size_t *group_size;   /* padded element count of each group */
  size_t total;               /* elements in the full flat buffer */
  DLTensor params;            /* full flat compute parameters [total] */
  DLTensor grads;             /* full flat gradients [total] */
} tsr_zero_setup;

/* Runs the optimizer over owned elements [offset, offset + count) of the full
 * flat layout (offset and count within one owned slice), writing the updated
 * compute parameters there. Provided by the host in tsr_zero_step. */
typedef tsr_status (*tsr_update_fn)(void *update_ctx, size_t offset, size_t count);

typedef struct tsr_zero_step {
  size_t struct_size;
  tsr_update_fn update;
  void *update_ctx;
} tsr_zero_step;

typedef struct tsr_zero_vtable {
  size_t struct_size;
  tsr_status (*create)(const tsr_host *host, const tsr_config *cfg, void **out_self);
  void (*destroy)(void *self);
  tsr_status (*plan)(void *self, tsr_zero_plan *out);
  tsr_status (*setup)(void *self, const tsr_zero_setup *setup);
  /* Group g's gradients for this micro-batch are final. `last_micro` is 1 on
   * the last micro-batch of an optimizer step. */
  tsr_status (*grads_done)(void *self, uint32_t group, int32_t last_micro);
  /* Complete every reduction: afterwards the owned gradients hold the mean
   * over ranks. */
  tsr_status (*finish_grads)(void *self);
  /* Update owned elements through step->update, then re-share parameters as
   * the stage requires. */
  tsr_status (*step)(void *self, const tsr_zero_step *step);
} tsr_zero_vtable;

#endif /* TESSERA_ZERO_H */
