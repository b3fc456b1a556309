/* lion: the Lion optimizer (Chen et al. 2023, "Symbolic Discovery of
 * Optimization Algorithms") as a tessera optimizer plugin in plain C99,
 * against the C headers only.
 *
 * Per element, with g the scaled gradient and m the one state array:
 *   c = beta1 * m + (1 - beta1) * g           the update direction
 *   p = p - lr * (sign(c) + weight_decay * p) decoupled decay, where the segment says so
 *   m = beta2 * m + (1 - beta2) * g           the momentum, after the update
 * with sign(0) = 0, as torch.sign and lucidrains/lion-pytorch. Lion moves
 * every weight by exactly lr per step (before decay), so it wants a learning
 * rate 3-10x smaller than AdamW's and a weight decay 3-10x larger.
 *
 * How a C plugin talks to the host: every failure is recorded with
 * host->error (which copies the message and returns the code), config values
 * are read with host->config_* after the host has validated them against
 * the declarations below, and fields of host structs newer than the ones
 * needed are read only when TSR_HAS_FIELD says they are there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tessera/extensions.h>
#include <tessera/optimizer.h>

typedef struct lion {
  const tsr_host *host;
  double lr; /* answered through TSR_EXT_OPTIMIZER_LR */
  float beta1, beta2, weight_decay;
} lion;

static tsr_status fail(const tsr_host *host, tsr_status code, const char *message) {
  return host->error(host->ctx, code, message);
}

static tsr_status lion_create(const tsr_host *host, const tsr_config *cfg, void **out_self) {
  double lr = 0, beta1 = 0, beta2 = 0, weight_decay = 0;
  size_t nbetas = 0;
  tsr_status s;
  lion *self;
  char msg[200];
  if (!out_self) return fail(host, TSR_ERR_INVALID, "lion: out_self is NULL");
  *out_self = NULL;
  /* A failing config read has recorded its own message: pass its status on. */
  if ((s = host->config_float(cfg, "lr", &lr)) != TSR_OK) return s;
  if ((s = host->config_float(cfg, "weight_decay", &weight_decay)) != TSR_OK) return s;
  if ((s = host->config_array_size(cfg, "betas", &nbetas)) != TSR_OK) return s;
  if (nbetas != 2) {
    snprintf(msg, sizeof msg, "lion: betas must have exactly 2 elements, got %zu", nbetas);
    return fail(host, TSR_ERR_CONFIG, msg);
  }
  if ((s = host->config_float_at(cfg, "betas", 0, &beta1)) != TSR_OK) return s;
  if ((s = host->config_float_at(cfg, "betas", 1, &beta2)) != TSR_OK) return s;
  /* The declared range is [0, 1]; a beta of 1 would never let the gradient in. */
  if (!(beta1 < 1.0) || !(beta2 < 1.0)) {
    snprintf(msg, sizeof msg, "lion: betas must be below 1, got [%g, %g]", beta1, beta2);
    return fail(host, TSR_ERR_CONFIG, msg);
  }
  self = (lion *)malloc(sizeof *self);
  if (!self) return fail(host, TSR_ERR_NO_MEMORY, "lion: out of memory");
  self->host = host;
  self->lr = lr;
  self->beta1 = (float)beta1;
  self->beta2 = (float)beta2;
  self->weight_decay = (float)weight_decay;
  *out_self = self;
  return TSR_OK;
}

static void lion_destroy(void *self) {
  free(self);
}

static uint32_t lion_state_count(void *self) {
  (void)self;
  return 1;
}

static const char *lion_state_name(void *self, uint32_t i) {
  (void)self;
  return i == 0 ? "exp_avg" : NULL;
}

/* fp32 -> bf16, round to nearest even; NaN stays NaN. */
static uint16_t to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static float sign_of(float x) {
  return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
}

static tsr_status lion_step(void *self_, const tsr_optimizer_step_args *args) {
  const lion *self = (const lion *)self_;
  const tsr_host *host = self->host;
  float *copy32 = NULL;
  uint16_t *copy16 = NULL;
  float lr, scale;
  size_t k, i;
  char msg[200];

  /* Fields up to `step` are needed; the compute copy is optional. */
  if (!TSR_HAS_FIELD(args, tsr_optimizer_step_args, step))
    return fail(host, TSR_ERR_INVALID, "lion: step args missing or too small (struct_size)");
  if (args->device.device_type != kDLCPU) {
    snprintf(msg, sizeof msg,
             "lion: runs on the CPU only (device type %d given); use an offload backend that "
             "runs the optimizer in host memory",
             (int)args->device.device_type);
    return fail(host, TSR_ERR_UNSUPPORTED, msg);
  }
  if (args->step < 1) return fail(host, TSR_ERR_INVALID, "lion: step counts from 1");
  if (TSR_HAS_FIELD(args, tsr_optimizer_step_args, compute_dtype) && args->compute_params) {
    const DLDataType t = args->compute_dtype;
    if (t.code == kDLFloat && t.bits == 32 && t.lanes == 1)
      copy32 = (float *)args->compute_params;
    else if (t.code == kDLBfloat && t.bits == 16 && t.lanes == 1)
      copy16 = (uint16_t *)args->compute_params;
    else
      return fail(host, TSR_ERR_UNSUPPORTED, "lion: the compute copy must be float32 or bfloat16");
  }
  if (args->n == 0) return TSR_OK;
  if (!args->params || !args->grads || !args->state || !args->state[0])
    return fail(host, TSR_ERR_INVALID, "lion: params, grads and the state array must be set");
  if (args->num_segments > 0 && !args->segments)
    return fail(host, TSR_ERR_INVALID, "lion: segments must not be NULL");
  for (k = 0; k < args->num_segments; ++k) {
    const tsr_segment *seg = &args->segments[k];
    if (seg->offset > args->n || seg->count > args->n - seg->offset) {
      snprintf(msg, sizeof msg, "lion: segment %zu [%zu, %zu + %zu) lies outside [0, %zu)", k,
               seg->offset, seg->offset, seg->count, args->n);
      return fail(host, TSR_ERR_INVALID, msg);
    }
  }

  lr = (float)args->lr;
  scale = (float)args->grad_scale;
  for (k = 0; k < args->num_segments; ++k) {
    const tsr_segment *seg = &args->segments[k];
    const float decay = seg->decay ? 1.0f - lr * self->weight_decay : 1.0f;
    float *p = args->params + seg->offset;
    const float *g = args->grads + seg->offset;
    float *m = args->state[0] + seg->offset;
    for (i = 0; i < seg->count; ++i) {
      const float gi = g[i] * scale;
      const float c = self->beta1 * m[i] + (1.0f - self->beta1) * gi;
      p[i] = p[i] * decay - lr * sign_of(c);
      m[i] = self->beta2 * m[i] + (1.0f - self->beta2) * gi;
      if (copy32) copy32[seg->offset + i] = p[i];
      if (copy16) copy16[seg->offset + i] = to_bf16(p[i]);
    }
  }
  return TSR_OK;
}

static const tsr_param_decl lion_params[] = {
    {sizeof(tsr_param_decl), "lr", TSR_PARAM_FLOAT, "1e-4",
     "base learning rate (the schedule scales it); 3-10x below AdamW's", 1, 0.0, 0, 0.0, NULL},
    {sizeof(tsr_param_decl), "betas", TSR_PARAM_FLOAT_ARRAY, "[0.9, 0.99]",
     "[beta1, beta2]: interpolation of the update direction, decay of the momentum", 1, 0.0, 1, 1.0,
     NULL},
    {sizeof(tsr_param_decl), "weight_decay", TSR_PARAM_FLOAT, "0.0",
     "decoupled weight decay (decaying parameters only); 3-10x above AdamW's", 1, 0.0, 0, 0.0,
     NULL},
};

static const tsr_optimizer_vtable lion_vtable = {tsr_optimizer_vtable_STRUCT_SIZE,
                                                 lion_create,
                                                 lion_destroy,
                                                 lion_state_count,
                                                 lion_state_name,
                                                 lion_step};

/* The configured rate, the peak the engine's schedule scales: the lr
 * extension (ABI 1.2) answers it. */
static double lion_base_lr(void *self) {
  return ((lion *)self)->lr;
}

static const tsr_ext_optimizer_lr lion_lr_extension = {tsr_ext_optimizer_lr_STRUCT_SIZE,
                                                       lion_base_lr};

static const void *lion_extension(const char *id) {
  return strcmp(id, TSR_EXT_OPTIMIZER_LR) == 0 ? (const void *)&lion_lr_extension : NULL;
}

static const tsr_plugin_descriptor lion_descriptor = {
    tsr_plugin_descriptor_STRUCT_SIZE,
    TSR_KIND_OPTIMIZER,
    "lion",
    "1.0.0",
    "Lion (EvoLved Sign Momentum, Chen et al. 2023), in C99",
    lion_params,
    sizeof(lion_params) / sizeof(lion_params[0]),
    TSR_DEVICE_CPU,
    &lion_vtable,
    lion_extension};

static const tsr_plugin_descriptor *const plugins[] = {&lion_descriptor};

static const tsr_plugin_library library = {tsr_plugin_library_STRUCT_SIZE, TSR_ABI_MAJOR,
                                           TSR_ABI_MINOR, plugins,
                                           sizeof(plugins) / sizeof(plugins[0])};

TSR_PLUGIN_ENTRY {
  return &library;
}
