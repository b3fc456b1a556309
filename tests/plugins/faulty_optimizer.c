/* faulty_optimizer: optimizer "faulty-sgd", plain SGD (p -= lr * g *
 * grad_scale, no state) that fails on purpose on one rank at one step, for
 * the multi-process fault tests (tests/integration/test_distributed.cpp).
 *
 * On rank `fail_rank` (host->run->rank), at optimizer step `fail_step`:
 *   mode = "error"  returns TSR_ERR_INTERNAL with the message
 *                   "faulty-sgd: injected failure on rank R at step S"
 *   mode = "exit"   prints that message to stderr and _exit(3)s
 *   mode = "abort"  prints it and raises SIGABRT
 * Every other rank, and every other step, is a plain SGD update through
 * the host's ops, on the CPU or a GPU. C99. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tessera/extensions.h>
#include <tessera/optimizer.h>
#include <unistd.h>

typedef struct faulty {
  const tsr_host *host;
  double lr; /* the configured rate, answered through TSR_EXT_OPTIMIZER_LR */
  int64_t fail_rank, fail_step;
  int mode; /* 0 error, 1 exit, 2 abort */
} faulty;

static tsr_status faulty_create(const tsr_host *host, const tsr_config *cfg, void **out_self) {
  faulty *f;
  const char *mode = NULL;
  tsr_status s;
  if (!out_self) return host->error(host->ctx, TSR_ERR_INVALID, "faulty-sgd: out_self is NULL");
  *out_self = NULL;
  f = (faulty *)calloc(1, sizeof *f);
  if (!f) return host->error(host->ctx, TSR_ERR_NO_MEMORY, "faulty-sgd: out of memory");
  f->host = host;
  if ((s = host->config_float(cfg, "lr", &f->lr)) != TSR_OK ||
      (s = host->config_int(cfg, "fail_rank", &f->fail_rank)) != TSR_OK ||
      (s = host->config_int(cfg, "fail_step", &f->fail_step)) != TSR_OK ||
      (s = host->config_string(cfg, "mode", &mode)) != TSR_OK) {
    free(f);
    return s;
  }
  f->mode = strcmp(mode, "exit") == 0 ? 1 : strcmp(mode, "abort") == 0 ? 2 : 0;
  *out_self = f;
  return TSR_OK;
}

static void faulty_destroy(void *self) {
  free(self);
}

static uint32_t faulty_state_count(void *self) {
  (void)self;
  return 0;
}

static const char *faulty_state_name(void *self, uint32_t i) {
  (void)self;
  (void)i;
  return NULL;
}

/* p -= lr * grad_scale * g through the host's ops, so the same code runs on
 * the CPU and on a GPU (ops pick the device from the tensors' own), then
 * the compute copy from p. fp32 gradients only. */
static tsr_status update(faulty *f, const tsr_optimizer_step_args *args) {
  const tsr_host *host = f->host;
  const tsr_ops *ops = host->ops;
  int64_t shape[1];
  DLTensor p, g, c;
  tsr_status s;
  if (TSR_HAS_FIELD(args, tsr_optimizer_step_args, grads_dtype) && args->grads_dtype.bits != 0 &&
      !(args->grads_dtype.code == kDLFloat && args->grads_dtype.bits == 32))
    return host->error(host->ctx, TSR_ERR_UNSUPPORTED, "faulty-sgd: fp32 gradients only");
  if (args->n == 0) return TSR_OK;
  shape[0] = (int64_t)args->n;
  memset(&p, 0, sizeof p);
  p.data = args->params;
  p.device = args->device;
  p.ndim = 1;
  p.dtype.code = kDLFloat;
  p.dtype.bits = 32;
  p.dtype.lanes = 1;
  p.shape = shape;
  g = p;
  g.data = (void *)args->grads;
  s = ops->axpy(host->ctx, (float)(-args->lr * args->grad_scale), &g, &p);
  if (s != TSR_OK || !args->compute_params) return s;
  c = p;
  c.data = args->compute_params;
  c.dtype = args->compute_dtype;
  return ops->cast(host->ctx, &p, &c);
}

static tsr_status faulty_step(void *self, const tsr_optimizer_step_args *args) {
  faulty *f = (faulty *)self;
  const tsr_host *host = f->host;
  if ((int64_t)host->run->rank == f->fail_rank && args->step == f->fail_step) {
    char msg[160];
    snprintf(msg, sizeof msg, "faulty-sgd: injected failure on rank %u at step %lld",
             (unsigned)host->run->rank, (long long)args->step);
    if (f->mode == 0) return host->error(host->ctx, TSR_ERR_INTERNAL, msg);
    fprintf(stderr, "%s\n", msg);
    fflush(stderr);
    if (f->mode == 1) _exit(3);
    raise(SIGABRT);
    _exit(4); /* not reached */
  }
  return update(f, args);
}

static const tsr_param_decl faulty_params[] = {
    {sizeof(tsr_param_decl), "lr", TSR_PARAM_FLOAT, "0.01", "base learning rate", 1, 0.0, 0, 0.0,
     NULL},
    {sizeof(tsr_param_decl), "fail_rank", TSR_PARAM_INT, "1", "the rank that fails", 1, 0.0, 0, 0.0,
     NULL},
    {sizeof(tsr_param_decl), "fail_step", TSR_PARAM_INT, "5",
     "the optimizer step (1-based) at which it fails", 1, 1.0, 0, 0.0, NULL},
    {sizeof(tsr_param_decl), "mode", TSR_PARAM_STRING, "\"error\"",
     "how it fails: return an error, _exit(3), or raise SIGABRT", 0, 0.0, 0, 0.0,
     "error|exit|abort"},
};

static const tsr_optimizer_vtable faulty_vtable = {
    sizeof(tsr_optimizer_vtable), faulty_create,     faulty_destroy,
    faulty_state_count,           faulty_state_name, faulty_step};

/* The configured rate, the peak the engine's schedule scales: the lr
 * extension (ABI 1.2) answers it. */
static double faulty_base_lr(void *self) {
  return ((faulty *)self)->lr;
}

static const tsr_ext_optimizer_lr faulty_lr_extension = {tsr_ext_optimizer_lr_STRUCT_SIZE,
                                                         faulty_base_lr};

static const void *faulty_extension(const char *id) {
  return strcmp(id, TSR_EXT_OPTIMIZER_LR) == 0 ? (const void *)&faulty_lr_extension : NULL;
}

static const tsr_plugin_descriptor faulty_descriptor = {
    sizeof(tsr_plugin_descriptor),
    TSR_KIND_OPTIMIZER,
    "faulty-sgd",
    "1.0.0",
    "plain SGD that fails on purpose on one rank at one step (fault tests)",
    faulty_params,
    sizeof(faulty_params) / sizeof(faulty_params[0]),
    TSR_DEVICE_CPU | TSR_DEVICE_CUDA,
    &faulty_vtable,
    faulty_extension};
static const tsr_plugin_descriptor *const plugins[] = {&faulty_descriptor};
static const tsr_plugin_library library = {sizeof(tsr_plugin_library), TSR_ABI_MAJOR, TSR_ABI_MINOR,
                                           plugins, 1};

TSR_PLUGIN_ENTRY {
  return &library;
}
