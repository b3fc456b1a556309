/* Kind tessera.zero/1: what each rank owns, and how gradients and
 * parameters are exchanged.
 *
 * The host lays the model's parameters out in one flat index space, group
 * after group, each group padded to a multiple of the world size; rank r
 * owns slice r of every group (everything, for a stage that partitions
 * nothing). The zero plugin allocates and holds the compute parameters and
 * the gradients, hands the model a group's full parameters and gradient
 * buffer when it asks, reduces gradients as groups finish, and drives the
 * optimizer over the ranges this rank owns. */
#ifndef TESSERA_ZERO_H
#define TESSERA_ZERO_H

#include <tessera/host.h>

/* What a stage partitions across ranks (reported to the user, and held to
 * the memory table of docs/architecture.md by the tests). */
typedef struct tsr_zero_plan {
  size_t struct_size;
  int32_t partition_optimizer; /* stages 1-3 */
  int32_t partition_grads;     /* stages 2-3 */
  int32_t partition_params;    /* stage 3 */
} tsr_zero_plan;
#define tsr_zero_plan_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_zero_plan, partition_params)

/* The layout, fixed for the run. */
typedef struct tsr_zero_setup {
  size_t struct_size;
  size_t num_groups;
  const size_t *group_offset; /* element offset of each group in the flat space */
  const size_t *group_size;   /* padded element count of each group */
  size_t total;               /* elements in the flat space */
  DLDevice device;            /* where compute runs */
  DLDataType dtype;           /* compute dtype of parameters and gradients */
  /* The initial parameters of the whole flat space in `dtype`, in host
   * memory, valid only during setup: the plugin copies what it keeps.
   * Where the plan partitions parameters, only slice `rank` of each group
   * holds them (the host reads and converts no more; the rest is zeros). */
  const void *initial_params;
  /* 0 for a frozen model (evaluation): no gradient buffers. */
  int32_t training;
} tsr_zero_setup;
#define tsr_zero_setup_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_zero_setup, training)

/* A run of elements this rank owns and updates. */
typedef struct tsr_owned_range {
  size_t struct_size;
  size_t owned_offset; /* offset among the rank's owned elements (optimizer state index) */
  size_t flat_offset;  /* offset in the flat space (decay flags, names) */
  size_t count;
  const void *grads; /* the averaged gradients of the range (compute dtype, device) */
  void *params;      /* where the updated compute parameters go (compute dtype, device);
                      * NULL when they come from a tsr_param_source (extensions.h) */
} tsr_owned_range;
#define tsr_owned_range_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_owned_range, params)

typedef tsr_status (*tsr_range_fn)(void *ctx, const tsr_owned_range *range);

/* Passed to step: the host's optimizer update of one owned range, and a
 * flush that completes every update started (offload may pipeline them). */
typedef struct tsr_zero_step {
  size_t struct_size;
  tsr_range_fn update;
  tsr_status (*flush)(void *ctx);
  void *ctx;
} tsr_zero_step;
#define tsr_zero_step_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_zero_step, ctx)

typedef struct tsr_zero_vtable {
  size_t struct_size;
  tsr_status (*create)(const tsr_host *host, const tsr_config *cfg, void **out_self);
  void (*destroy)(void *self);
  tsr_status (*plan)(void *self, tsr_zero_plan *out);
  tsr_status (*setup)(void *self, const tsr_zero_setup *setup);
  /* Elements this rank owns (the optimizer state it holds). */
  size_t (*owned_count)(void *self);
  /* Calls fn for each owned range, in owned_offset order. */
  tsr_status (*ranges)(void *self, tsr_range_fn fn, void *ctx);

  /* The full parameters of group g (group_size elements), valid until
   * params_done(g), grads_done(g) or the end of the forward or backward
   * pass. `backward` is 1 when asked during backward (stage 3 gathers
   * again, and prefetches in the pass's direction). */
  tsr_status (*params)(void *self, uint32_t group, int32_t backward, void **out);
  tsr_status (*params_done)(void *self, uint32_t group);
  /* The gradient buffer of group g (group_size elements) the model adds
   * into during this micro-batch. */
  tsr_status (*grads)(void *self, uint32_t group, void **out);
  /* Group g's gradients for this micro-batch are final. `last_micro` is 1
   * on the last micro-batch of an optimizer step. */
  tsr_status (*grads_done)(void *self, uint32_t group, int32_t last_micro);
  /* A forward or backward pass ended: release what it held. */
  tsr_status (*end_pass)(void *self);
  /* Complete every reduction: afterwards the owned gradients hold the mean
   * over ranks. */
  tsr_status (*finish_grads)(void *self);
  /* The squared L2 norm of the whole (averaged) gradient, over all ranks. */
  tsr_status (*grad_norm_sq)(void *self, double *out);
  /* Update every owned range through step->update, flush, then re-share
   * parameters as the stage requires. */
  tsr_status (*step)(void *self, const tsr_zero_step *step);

  /* ---- ABI 1.2 (check TSR_HAS_FIELD(vt, tsr_zero_vtable, clear_grads)) ----
   * The update split into the calls the host makes itself, so the host
   * drives the step instead of being called back: it walks ranges(),
   * hands each range to the offload backend, and then calls reshare() once
   * every update has landed (stages 1-2 at several ranks all-gather the
   * updated slices; the others have nothing to do) and clear_grads()
   * before the next backward pass, once the backend has read the
   * gradients. A zero plugin must set both: tessera serves zero plugins
   * from ABI 1.2 on and refuses one without them at load (zero plugins
   * ship with it; docs/abi.md, "Version policy"), so it no longer calls
   * step(), which stays in the table as 1.0 placed it. */
  tsr_status (*reshare)(void *self);
  tsr_status (*clear_grads)(void *self);
} tsr_zero_vtable;
#define tsr_zero_vtable_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_zero_vtable, clear_grads)

#endif /* TESSERA_ZERO_H */
