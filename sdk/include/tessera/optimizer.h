/* Kind tessera.optimizer/1: the update math, per device. */
#ifndef TESSERA_OPTIMIZER_H
#define TESSERA_OPTIMIZER_H

#include <tessera/host.h>

/* A run of elements sharing a weight-decay flag. */
typedef struct tsr_segment {
  size_t offset;
  size_t count;
  int32_t decay;
} tsr_segment;

/* One update of `n` contiguous fp32 elements, all on `device`. */
typedef struct tsr_optimizer_step_args {
  size_t struct_size;
  DLDevice device;
  float *params;       /* fp32 master weights */
  const float *grads;  /* fp32 gradients, before grad_scale */
  float *const *state; /* state_count arrays of n elements, zero before step 1 */
  size_t n;
  const tsr_segment *segments; /* cover [0, n); decay applies where decay != 0;
                                  host memory, whatever the device */
  size_t num_segments;
  double lr;         /* learning rate for this step (schedule applied) */
  double grad_scale; /* multiply each gradient by this first (clipping, unscaling) */
  int64_t step;      /* 1 for the first update of these elements */
  void *stream;      /* device stream, or NULL */
  /* Optional low-precision compute copy written in the same pass (NULL: none). */
  void *compute_params;
  DLDataType compute_dtype;
  /* ---- ABI 1.1 ----
   * `reserved_1_1` fills the 4 bytes of tail padding 1.0's struct had after
   * compute_dtype, so that grads_dtype lies past 1.0's sizeof and
   * TSR_HAS_FIELD tells a 1.0 caller (struct_size 112 on x86-64) from a 1.1
   * one (120). Writers set it to 0; readers ignore it. */
  uint32_t reserved_1_1;
  /* The dtype `grads` points at: float32 when this field is absent (or all
   * zero); bfloat16 or float16 gradients are read as such and widened in
   * the update. */
  DLDataType grads_dtype;
} tsr_optimizer_step_args;
#define tsr_optimizer_step_args_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_optimizer_step_args, grads_dtype)

typedef struct tsr_optimizer_vtable {
  size_t struct_size;
  tsr_status (*create)(const tsr_host *host, const tsr_config *cfg, void **out_self);
  void (*destroy)(void *self);
  /* Number of fp32 state arrays per element (sgd with momentum: 1; adam: 2). */
  uint32_t (*state_count)(void *self);
  /* Name of state array i, used in checkpoints ("exp_avg"). */
  const char *(*state_name)(void *self, uint32_t i);
  tsr_status (*step)(void *self, const tsr_optimizer_step_args *args);
} tsr_optimizer_vtable;
#define tsr_optimizer_vtable_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_optimizer_vtable, step)

#endif /* TESSERA_OPTIMIZER_H */
