/* signsgd: a real optimizer plugin in plain C99, written against the C
 * headers only (no C++ helpers), to prove the ABI is usable from C.
 *
 * Sign SGD with optional momentum (signum, Bernstein et al. 2018). Per
 * element, in order:
 *   g = grad * grad_scale + weight_decay * p    (decay only where the segment says so)
 *   m = momentum * m + (1 - momentum) * g       (only when momentum != 0; m is 0 before step 1)
 *   d = momentum != 0 ? m : g
 *   p = p - lr * sign(d)                        (sign(0) = 0)
 *
 * Failures go through host->error with a status code; config is read with
 * host->config_float. Step args fields newer than the ones it needs are read
 * only when TSR_HAS_FIELD says they are there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tessera/extensions.h>
#include <tessera/optimizer.h>

typedef struct signsgd {
  const tsr_host *host;
  double lr; /* answered through TSR_EXT_OPTIMIZER_LR */
  float momentum;
  float weight_decay;
} signsgd;

/* Records `message` with the host and returns `code`. */
static tsr_status fail(const tsr_host *host, tsr_status code, const char *message) {
  return host->error(host->ctx, code, message);
}

static tsr_status signsgd_create(const tsr_host *host, const tsr_config *cfg, void **out_self) {
  double lr = 0, momentum = 0, weight_decay = 0;
  tsr_status s;
  signsgd *self;
  char msg[160];
  if (!out_self) return fail(host, TSR_ERR_INVALID, "signsgd: out_self is NULL");
  *out_self = NULL;
  /* A failing config read has already recorded its message: pass it on. */
  if ((s = host->config_float(cfg, "lr", &lr)) != TSR_OK) return s;
  if ((s = host->config_float(cfg, "momentum", &momentum)) != TSR_OK) return s;
  if ((s = host->config_float(cfg, "weight_decay", &weight_decay)) != TSR_OK) return s;
  /* The declared range allows lr = 0 (min 0); sign SGD would never move. */
  if (!(lr > 0)) {
    snprintf(msg, sizeof msg, "signsgd: lr must be positive, got %g (sign SGD would never move)",
             lr);
    return fail(host, TSR_ERR_CONFIG, msg);
  }
  self = (signsgd *)malloc(sizeof *self);
  if (!self) return fail(host, TSR_ERR_NO_MEMORY, "signsgd: out of memory");
  self->host = host;
  self->lr = lr;
  self->momentum = (float)momentum;
  self->weight_decay = (float)weight_decay;
  *out_self = self;
  return TSR_OK;
}

static void signsgd_destroy(void *self) {
  free(self);
}

static uint32_t signsgd_state_count(void *self) {
  return ((const signsgd *)self)->momentum != 0.0f ? 1u : 0u;
}

static const char *signsgd_state_name(void *self, uint32_t i) {
  return (((const signsgd *)self)->momentum != 0.0f && i == 0) ? "momentum" : NULL;
}

static float sign_of(float x) {
  return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
}

static tsr_status signsgd_step(void *self_, const tsr_optimizer_step_args *args) {
  const signsgd *self = (const signsgd *)self_;
  const tsr_host *host = self->host;
  const int has_momentum = self->momentum != 0.0f;
  float *copy = NULL;
  float lr, scale;
  size_t k, i;
  char msg[200];
  /* Everything up to `step` is needed; stream and the compute copy are not. */
  if (!TSR_HAS_FIELD(args, tsr_optimizer_step_args, step))
    return fail(host, TSR_ERR_INVALID, "signsgd: step args missing or too small (struct_size)");
  if (args->device.device_type != kDLCPU)
    return fail(host, TSR_ERR_UNSUPPORTED, "signsgd: only runs on the CPU");
  if (args->step < 1) return fail(host, TSR_ERR_INVALID, "signsgd: step counts from 1");
  if (TSR_HAS_FIELD(args, tsr_optimizer_step_args, compute_dtype) && args->compute_params) {
    DLDataType t = args->compute_dtype;
    if (t.code != kDLFloat || t.bits != 32 || t.lanes != 1)
      return fail(host, TSR_ERR_UNSUPPORTED, "signsgd: the compute copy must be float32");
    copy = (float *)args->compute_params;
  }
  if (args->n == 0) return TSR_OK;
  if (!args->params || !args->grads)
    return fail(host, TSR_ERR_INVALID, "signsgd: params and grads must not be NULL");
  if (has_momentum && (!args->state || !args->state[0]))
    return fail(host, TSR_ERR_INVALID, "signsgd: the momentum array must not be NULL");
  if (args->num_segments > 0 && !args->segments)
    return fail(host, TSR_ERR_INVALID, "signsgd: segments must not be NULL");
  for (k = 0; k < args->num_segments; ++k) {
    const tsr_segment *seg = &args->segments[k];
    if (seg->offset > args->n || seg->count > args->n - seg->offset) {
      snprintf(msg, sizeof msg, "signsgd: segment %zu [%zu, %zu + %zu) lies outside [0, %zu)", k,
               seg->offset, seg->offset, seg->count, args->n);
      return fail(host, TSR_ERR_INVALID, msg);
    }
  }
  lr = (float)args->lr;
  scale = (float)args->grad_scale;
  for (k = 0; k < args->num_segments; ++k) {
    const tsr_segment *seg = &args->segments[k];
    const float wd = seg->decay ? self->weight_decay : 0.0f;
    for (i = seg->offset; i < seg->offset + seg->count; ++i) {
      float g = args->grads[i] * scale + wd * args->params[i];
      float d = g;
      if (has_momentum) {
        float *m = &args->state[0][i];
        *m = self->momentum * *m + (1.0f - self->momentum) * g;
        d = *m;
      }
      args->params[i] -= lr * sign_of(d);
      if (copy) copy[i] = args->params[i];
    }
  }
  return TSR_OK;
}

static const tsr_param_decl signsgd_params[] = {
    {sizeof(tsr_param_decl), "lr", TSR_PARAM_FLOAT, "0.01",
     "base learning rate (the engine's schedule scales it); must be positive", 1, 0.0, 0, 0.0,
     NULL},
    {sizeof(tsr_param_decl), "momentum", TSR_PARAM_FLOAT, "0.0",
     "momentum of the averaged gradient whose sign is taken; 0 keeps no state", 1, 0.0, 1, 1.0,
     NULL},
    {sizeof(tsr_param_decl), "weight_decay", TSR_PARAM_FLOAT, "0.0",
     "L2 penalty added to the gradient (decaying segments only)", 1, 0.0, 0, 0.0, NULL},
};

static const tsr_optimizer_vtable signsgd_vtable = {
    sizeof(tsr_optimizer_vtable), signsgd_create,     signsgd_destroy,
    signsgd_state_count,          signsgd_state_name, signsgd_step};

/* The configured rate, the peak the engine's schedule scales: the lr
 * extension (ABI 1.2) answers it. */
static double signsgd_base_lr(void *self) {
  return ((signsgd *)self)->lr;
}

static const tsr_ext_optimizer_lr signsgd_lr_extension = {tsr_ext_optimizer_lr_STRUCT_SIZE,
                                                          signsgd_base_lr};

static const void *signsgd_extension(const char *id) {
  return strcmp(id, TSR_EXT_OPTIMIZER_LR) == 0 ? (const void *)&signsgd_lr_extension : NULL;
}

static const tsr_plugin_descriptor signsgd_descriptor = {
    sizeof(tsr_plugin_descriptor),
    TSR_KIND_OPTIMIZER,
    "signsgd",
    "1.0.0",
    "sign SGD with optional momentum (signum), written in C99",
    signsgd_params,
    sizeof(signsgd_params) / sizeof(signsgd_params[0]),
    TSR_DEVICE_CPU,
    &signsgd_vtable,
    signsgd_extension};

static const tsr_plugin_descriptor *const plugins[] = {&signsgd_descriptor};

static const tsr_plugin_library library = {sizeof(tsr_plugin_library), TSR_ABI_MAJOR, TSR_ABI_MINOR,
                                           plugins, sizeof(plugins) / sizeof(plugins[0])};

TSR_PLUGIN_ENTRY {
  return &library;
}
