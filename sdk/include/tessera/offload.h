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
#define tsr_offload_setup_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_offload_setup, zero_plan)

/* One update of owned elements [offset, offset + count). */
typedef struct tsr_offload_step {
  size_t struct_size;
  size_t offset;
  size_t count;
  const void *grads;           /* count gradients, compute dtype, on the compute device */
  void *params;                /* count updated compute parameters are written here; NULL
                                * when the backend keeps them (TSR_EXT_OFFLOAD_PARAMS) */
  const tsr_segment *segments; /* relative to offset; cover [0, count) */
  size_t num_segments;
  double lr;
  double grad_scale;
  int64_t step;
} tsr_offload_step;
#define tsr_offload_step_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_offload_step, step)

/* ABI 1.2: cumulative seconds of an offloaded update's parts. */
typedef struct tsr_offload_stats {
  size_t struct_size;
  double d2h_s;      /* gradients moving device -> host (copy engine busy) */
  double host_s;     /* the optimizer step on host threads */
  double h2d_s;      /* updated parameters moving host -> device */
  double device_s;   /* the share of the state stepped on the device, if any */
  uint64_t elements; /* elements updated on the host */
} tsr_offload_stats;
#define tsr_offload_stats_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_offload_stats, elements)

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

  /* ---- ABI 1.2 (check TSR_HAS_FIELD(vt, tsr_offload_vtable, stats)) ----
   * The overlapped step. A 1.2 backend's step() may return before it has
   * read the gradients or written the parameters; the host then does not
   * call flush() before the next forward pass but asks for what it needs:
   *
   * wait_params: the updated compute parameters of owned elements
   *   [offset, offset + count) are in place for work queued on the host's
   *   compute stream from now on (a stream wait on CUDA, no host block when
   *   the copy is queued already; on the CPU it returns once they are
   *   written). The next forward calls it group by group, just before use.
   * wait_grads: every gradient handed to step() so far has been read, for
   *   work on the compute stream from now on: the host then clears them.
   * flush() still completes everything (checkpoints, evaluation, the end).
   * stats: where the time went so far (cumulative seconds), for the
   *   breakdown; any field may stay 0. */
  tsr_status (*wait_params)(void *self, size_t offset, size_t count);
  tsr_status (*wait_grads)(void *self);
  tsr_status (*stats)(void *self, tsr_offload_stats *out);
} tsr_offload_vtable;
#define tsr_offload_vtable_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_offload_vtable, stats)

#endif /* TESSERA_OFFLOAD_H */
