/* Kind tessera.offload/1: where the owned fp32 master weights and optimizer
 * state live, and where the optimizer step runs. */
#ifndef TESSERA_OFFLOAD_H
#define TESSERA_OFFLOAD_H

#include <tessera/optimizer.h>
#include <tessera/zero.h>

typedef struct tsr_offload_setup {
  size_t struct_size;
  size_t n; /* owned elements */
  const tsr_optimizer_vtable *optimizer;
  void *optimizer_self;
  uint32_t state_count; /* optimizer state arrays per element */
  DLDevice device;      /* where compute parameters and gradients live */
  DLDataType compute_dtype;
  /* ---- ABI 1.1 (check TSR_HAS_FIELD(setup, tsr_offload_setup, zero_plan)) ----
   * What the run's ZeRO stage partitions across host->run->world_size
   * ranks, valid during setup: partition_optimizer is 0 under stage 0,
   * where every rank owns (and updates) every element. */
  const tsr_zero_plan *zero_plan;
} tsr_offload_setup;

/* One update of owned elements [offset, offset + count). */
typedef struct tsr_offload_step {
  size_t struct_size;
  size_t offset;
  size_t count;
  const void *grads;           /* count gradients, compute dtype, on the compute device */
  void *params;                /* count updated compute parameters are written here */
  const tsr_segment *segments; /* relative to offset; cover [0, count) */
  size_t num_segments;
  double lr;
  double grad_scale;
  int64_t step;
} tsr_offload_step;

typedef struct tsr_offload_vtable {
  size_t struct_size;
  tsr_status (*create)(const tsr_host *host, const tsr_config *cfg, void **out_self);
  void (*destroy)(void *self);
  tsr_status (*setup)(void *self, const tsr_offload_setup *setup);
  /* May return before the update is complete (pipelining); flush waits. */
  tsr_status (*step)(void *self, const tsr_offload_step *step);
  tsr_status (*flush)(void *self);
  /* Copy owned state to or from host memory (initial master weights,
   * checkpoints). slot 0 is the fp32 master copy, slot 1 + i the
   * optimizer's state array i. */
  tsr_status (*read_state)(void *self, uint32_t slot, size_t offset, size_t count, float *dst);
  tsr_status (*write_state)(void *self, uint32_t slot, size_t offset, size_t count,
                            const float *src);
} tsr_offload_vtable;

#endif /* TESSERA_OFFLOAD_H */
