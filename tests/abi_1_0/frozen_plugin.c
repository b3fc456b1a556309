/* A plugin library built against the frozen ABI 1.0 headers only
 * (tests/abi_1_0/include; nothing of sdk/), in plain C99: one plugin of each
 * kind a user writes, so a run made only of them (plus the shipped ZeRO
 * stage) exercises the host table, the ops table, the config reads and every
 * kind's function table as a 1.0 plugin sees them.
 *
 *   dataset   frozen_blobs    labelled points around one centre per class
 *   sampler   frozen_blocks   contiguous equal blocks, one per rank
 *   model     frozen_linear   a linear softmax classifier through host->ops
 *   optimizer frozen_sgd      p -= lr * grad * grad_scale
 *   offload   frozen_host     master weights and state in host memory
 *
 * Only 1.0 names are used, and only 1.0 fields are read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tessera/tessera.h>

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const DLDataType kF32 = {kDLFloat, 32, 1};

/* splitmix64, as a counter-based generator. */
static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/* Uniform in [-1, 1). */
static float unit(uint64_t h) {
  return (float)((double)(h >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/* --- dataset frozen_blobs --------------------------------------------------- */

typedef struct blobs {
  const tsr_host *host;
  int64_t samples, features, classes;
  uint64_t stream;
} blobs;

static tsr_status blobs_create(const tsr_host *host, const tsr_config *cfg, const char *split,
                               void **out) {
  blobs *b = (blobs *)calloc(1, sizeof *b);
  tsr_status s;
  if (!b) return host->error(host->ctx, TSR_ERR_NO_MEMORY, "frozen_blobs: out of memory");
  b->host = host;
  if ((s = host->config_int(cfg, "samples", &b->samples)) != TSR_OK ||
      (s = host->config_int(cfg, "features", &b->features)) != TSR_OK ||
      (s = host->config_int(cfg, "classes", &b->classes)) != TSR_OK) {
    free(b);
    return s;
  }
  b->stream = (split && strcmp(split, "eval") == 0) ? 2 : 1;
  *out = b;
  return TSR_OK;
}

static void blobs_destroy(void *self) {
  free(self);
}

static tsr_status blobs_info(void *self, tsr_data_info *out) {
  const blobs *b = (const blobs *)self;
  tsr_data_info d;
  size_t size;
  if (!TSR_HAS_FIELD(out, tsr_data_info, num_classes))
    return b->host->error(b->host->ctx, TSR_ERR_INVALID, "frozen_blobs: info struct too small");
  size = out->struct_size;
  memset(&d, 0, sizeof d);
  d.length = b->samples;
  d.input_dtype = kF32;
  d.input_ndim = 1;
  d.input_shape[0] = b->features;
  d.target_dtype.code = kDLInt;
  d.target_dtype.bits = 32;
  d.target_dtype.lanes = 1;
  d.target_ndim = 0;
  d.num_classes = b->classes;
  memcpy(out, &d, size < sizeof d ? size : sizeof d);
  out->struct_size = size;
  return TSR_OK;
}

/* Sample i: class mix(stream, i) % classes; features = 2 * centre + noise. */
static tsr_status blobs_read(void *self, const int64_t *indices, tsr_batch *out) {
  const blobs *b = (const blobs *)self;
  float *x = (float *)((char *)out->inputs.data + out->inputs.byte_offset);
  int32_t *y = (int32_t *)((char *)out->targets.data + out->targets.byte_offset);
  int64_t r, j;
  for (r = 0; r < out->size; ++r) {
    const int64_t i = indices[r];
    int32_t c;
    if (i < 0 || i >= b->samples)
      return b->host->error(b->host->ctx, TSR_ERR_INVALID, "frozen_blobs: index out of range");
    c = (int32_t)(mix(b->stream * 1000003u + (uint64_t)i) % (uint64_t)b->classes);
    for (j = 0; j < b->features; ++j) {
      const float centre = unit(mix(77u + (uint64_t)c * 131u + (uint64_t)j));
      const float noise = unit(mix(((uint64_t)i << 20) ^ ((uint64_t)j << 4) ^ b->stream));
      x[r * b->features + j] = 2.0f * centre + noise;
    }
    y[r] = c;
  }
  return TSR_OK;
}

static const tsr_param_decl blobs_params[] = {
    {sizeof(tsr_param_decl), "samples", TSR_PARAM_INT, "2048", "samples", 1, 1.0, 0, 0.0, NULL},
    {sizeof(tsr_param_decl), "features", TSR_PARAM_INT, "16", "values per sample", 1, 1.0, 0, 0.0,
     NULL},
    {sizeof(tsr_param_decl), "classes", TSR_PARAM_INT, "4", "classes", 1, 2.0, 0, 0.0, NULL},
};

static const tsr_dataset_vtable blobs_vtable = {sizeof(tsr_dataset_vtable), blobs_create,
                                                blobs_destroy, blobs_info, blobs_read};

/* --- sampler frozen_blocks ---------------------------------------------------- */

static tsr_status blocks_create(const tsr_host *host, const tsr_config *cfg, void **out) {
  (void)cfg;
  *out = (void *)host;
  return TSR_OK;
}

static void blocks_destroy(void *self) {
  (void)self;
}

static tsr_status blocks_epoch_size(void *self, const tsr_sampler_args *args, int64_t *out) {
  const tsr_host *host = (const tsr_host *)self;
  if (!TSR_HAS_FIELD(args, tsr_sampler_args, seed) || args->world_size == 0)
    return host->error(host->ctx, TSR_ERR_INVALID, "frozen_blocks: bad sampler args");
  *out = args->dataset_size / (int64_t)args->world_size;
  return TSR_OK;
}

static tsr_status blocks_indices(void *self, const tsr_sampler_args *args, int64_t *out) {
  int64_t n = 0, k;
  const tsr_status s = blocks_epoch_size(self, args, &n);
  if (s != TSR_OK) return s;
  for (k = 0; k < n; ++k) out[k] = (int64_t)args->rank * n + k;
  return TSR_OK;
}

static const tsr_sampler_vtable blocks_vtable = {sizeof(tsr_sampler_vtable), blocks_create,
                                                 blocks_destroy, blocks_epoch_size, blocks_indices};

/* --- model frozen_linear -------------------------------------------------------- */

typedef struct linear {
  const tsr_host *host;
  int64_t inputs, classes, max_batch;
  void *logits; /* [max_batch, classes] float32 */
  int ready;
} linear;

static tsr_status linear_create(const tsr_host *host, const tsr_config *cfg,
                                const tsr_model_init *init, void **out) {
  linear *m;
  tsr_status s;
  int32_t d;
  (void)cfg;
  if (!TSR_HAS_FIELD(init, tsr_model_init, max_micro_batch) || !init->data)
    return host->error(host->ctx, TSR_ERR_INVALID, "frozen_linear: no model init");
  m = (linear *)calloc(1, sizeof *m);
  if (!m) return host->error(host->ctx, TSR_ERR_NO_MEMORY, "frozen_linear: out of memory");
  m->host = host;
  m->inputs = 1;
  for (d = 0; d < init->data->input_ndim; ++d) m->inputs *= init->data->input_shape[d];
  m->classes = init->data->num_classes;
  m->max_batch = init->max_micro_batch;
  s = host->alloc(host->ctx, host->run->device, (size_t)(m->max_batch * m->classes) * sizeof(float),
                  TSR_MEM_ACTIVATIONS, &m->logits);
  if (s != TSR_OK) {
    free(m);
    return s;
  }
  *out = m;
  return TSR_OK;
}

static void linear_destroy(void *self) {
  linear *m = (linear *)self;
  m->host->free(m->host->ctx, m->logits);
  free(m);
}

static size_t linear_num_params(void *self) {
  (void)self;
  return 2;
}

static tsr_status linear_param_info(void *self, size_t i, tsr_param_info *out) {
  const linear *m = (const linear *)self;
  tsr_param_info p;
  size_t size;
  if (i > 1 || !TSR_HAS_FIELD(out, tsr_param_info, decay))
    return m->host->error(m->host->ctx, TSR_ERR_INVALID, "frozen_linear: bad param_info call");
  size = out->struct_size;
  memset(&p, 0, sizeof p);
  p.name = i == 0 ? "weight" : "bias";
  p.ndim = i == 0 ? 2 : 1;
  p.shape[0] = m->classes;
  p.shape[1] = i == 0 ? m->inputs : 0;
  p.group = 0;
  p.init = i == 0 ? TSR_INIT_NORMAL : TSR_INIT_ZEROS;
  p.init_a = 0.0f;
  p.init_b = i == 0 ? 0.01f : 0.0f;
  p.trainable = 1;
  p.decay = i == 0;
  memcpy(out, &p, size < sizeof p ? size : sizeof p);
  out->struct_size = size;
  return TSR_OK;
}

static DLTensor view2(void *data, uint64_t byte_offset, DLDevice device, DLDataType dtype,
                      int32_t ndim, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.byte_offset = byte_offset;
  t.device = device;
  t.dtype = dtype;
  t.ndim = ndim;
  t.shape = shape;
  return t;
}

/* Runs forward; with dlogits, turns the logits into loss_scale * dlogits. */
static tsr_status linear_pass(linear *m, tsr_step *step, const tsr_batch *batch, float scale,
                              int with_grad, tsr_forward_result *out) {
  const tsr_host *h = m->host;
  const tsr_ops *ops = h->ops;
  int64_t xs[2], zs[2], ys[1];
  DLTensor x, z, y, w, b;
  double loss = 0;
  int64_t count = 0, correct = 0;
  tsr_status s;
  const int64_t n = batch->size;
  if (n < 0 || n > m->max_batch)
    return h->error(h->ctx, TSR_ERR_INVALID, "frozen_linear: batch larger than max_micro_batch");
  if (n > 0) {
    xs[0] = n;
    xs[1] = m->inputs;
    zs[0] = n;
    zs[1] = m->classes;
    ys[0] = n;
    x = view2(batch->inputs.data, batch->inputs.byte_offset, batch->inputs.device, kF32, 2, xs);
    y = view2(batch->targets.data, batch->targets.byte_offset, batch->targets.device,
              batch->targets.dtype, 1, ys);
    z = view2(m->logits, 0, h->run->device, kF32, 2, zs);
    if (!with_grad) {
      if ((s = h->param(step, 0, &w)) != TSR_OK) return s;
      if ((s = h->param(step, 1, &b)) != TSR_OK) return s;
      if ((s = ops->matmul(h->ctx, &x, 0, &w, 1, &z, 1.0f, 0.0f)) != TSR_OK) return s;
      if ((s = ops->bias_act(h->ctx, &z, &b, TSR_ACT_NONE)) != TSR_OK) return s;
      if ((s = ops->cross_entropy(h->ctx, &z, &y, m->classes, 1.0f, NULL, &loss, &count,
                                  &correct)) != TSR_OK)
        return s;
    } else {
      if ((s = ops->cross_entropy(h->ctx, &z, &y, m->classes, scale, &z, &loss, &count, NULL)) !=
          TSR_OK)
        return s;
      if ((s = h->grad(step, 0, &w)) != TSR_OK) return s;
      if ((s = h->grad(step, 1, &b)) != TSR_OK) return s;
      if ((s = ops->matmul(h->ctx, &z, 1, &x, 0, &w, 1.0f, 1.0f)) != TSR_OK) return s;
      if ((s = ops->bias_grad(h->ctx, &z, &b)) != TSR_OK) return s;
    }
  }
  if (out) {
    out->loss_sum = loss;
    out->count = count;
    out->correct = correct;
  }
  return with_grad ? h->grads_done(step, 0) : TSR_OK;
}

static tsr_status linear_forward(void *self, tsr_step *step, const tsr_batch *batch,
                                 int32_t training, tsr_forward_result *out) {
  linear *m = (linear *)self;
  const tsr_status s = linear_pass(m, step, batch, 1.0f, 0, out);
  m->ready = s == TSR_OK && training;
  return s;
}

static tsr_status linear_backward(void *self, tsr_step *step, const tsr_batch *batch,
                                  float loss_scale) {
  linear *m = (linear *)self;
  if (!m->ready)
    return m->host->error(m->host->ctx, TSR_ERR_INVALID, "frozen_linear: backward before forward");
  m->ready = 0;
  return linear_pass(m, step, batch, loss_scale, 1, NULL);
}

static double linear_flops(void *self) {
  const linear *m = (const linear *)self;
  return 6.0 * (double)(m->inputs * m->classes);
}

static const tsr_model_vtable linear_vtable = {
    sizeof(tsr_model_vtable), linear_create,  linear_destroy,  linear_num_params,
    linear_param_info,        linear_forward, linear_backward, linear_flops};

/* --- optimizer frozen_sgd ------------------------------------------------------- */

static tsr_status sgd_create(const tsr_host *host, const tsr_config *cfg, void **out) {
  (void)cfg;
  *out = (void *)host;
  return TSR_OK;
}

static void sgd_destroy(void *self) {
  (void)self;
}

static uint32_t sgd_state_count(void *self) {
  (void)self;
  return 0;
}

static const char *sgd_state_name(void *self, uint32_t i) {
  (void)self;
  (void)i;
  return NULL;
}

static tsr_status sgd_step(void *self, const tsr_optimizer_step_args *a) {
  const tsr_host *host = (const tsr_host *)self;
  float *copy = NULL;
  size_t i;
  if (!TSR_HAS_FIELD(a, tsr_optimizer_step_args, compute_dtype) || a->device.device_type != kDLCPU)
    return host->error(host->ctx, TSR_ERR_INVALID, "frozen_sgd: bad step args");
  if (a->compute_params) copy = (float *)a->compute_params;
  for (i = 0; i < a->n; ++i) {
    a->params[i] -= (float)a->lr * a->grads[i] * (float)a->grad_scale;
    if (copy) copy[i] = a->params[i];
  }
  return TSR_OK;
}

static const tsr_param_decl sgd_params[] = {
    {sizeof(tsr_param_decl), "lr", TSR_PARAM_FLOAT, "0.1", "learning rate", 1, 0.0, 0, 0.0, NULL},
};

static const tsr_optimizer_vtable sgd_vtable = {sizeof(tsr_optimizer_vtable),
                                                sgd_create,
                                                sgd_destroy,
                                                sgd_state_count,
                                                sgd_state_name,
                                                sgd_step};

/* --- offload frozen_host -------------------------------------------------------- */

typedef struct hostoff {
  const tsr_host *host;
  tsr_offload_setup setup;
  float *slots[8]; /* master, then up to 7 state arrays */
  uint32_t nslots;
} hostoff;

static tsr_status hostoff_create(const tsr_host *host, const tsr_config *cfg, void **out) {
  hostoff *o = (hostoff *)calloc(1, sizeof *o);
  (void)cfg;
  if (!o) return host->error(host->ctx, TSR_ERR_NO_MEMORY, "frozen_host: out of memory");
  o->host = host;
  *out = o;
  return TSR_OK;
}

static void hostoff_destroy(void *self) {
  hostoff *o = (hostoff *)self;
  uint32_t i;
  for (i = 0; i < o->nslots; ++i) o->host->free(o->host->ctx, o->slots[i]);
  free(o);
}

static tsr_status hostoff_setup(void *self, const tsr_offload_setup *s) {
  hostoff *o = (hostoff *)self;
  const DLDevice cpu = {kDLCPU, 0};
  uint32_t i;
  tsr_status st;
  if (!TSR_HAS_FIELD(s, tsr_offload_setup, compute_dtype) || s->state_count > 7)
    return o->host->error(o->host->ctx, TSR_ERR_INVALID, "frozen_host: bad setup");
  o->setup = *s;
  for (i = 0; i < 1 + s->state_count; ++i) {
    void *p = NULL;
    if ((st = o->host->alloc(o->host->ctx, cpu, s->n * sizeof(float), TSR_MEM_OPTIMIZER, &p)) !=
        TSR_OK)
      return st;
    o->slots[o->nslots++] = (float *)p;
  }
  return TSR_OK;
}

static tsr_status hostoff_step(void *self, const tsr_offload_step *s) {
  hostoff *o = (hostoff *)self;
  tsr_optimizer_step_args a;
  float *state[7];
  uint32_t i;
  if (s->offset + s->count > o->setup.n)
    return o->host->error(o->host->ctx, TSR_ERR_INVALID, "frozen_host: range out of bounds");
  for (i = 1; i < o->nslots; ++i) state[i - 1] = o->slots[i] + s->offset;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.device = o->setup.device;
  a.params = o->slots[0] + s->offset;
  a.grads = (const float *)s->grads;
  a.state = state;
  a.n = s->count;
  a.segments = s->segments;
  a.num_segments = s->num_segments;
  a.lr = s->lr;
  a.grad_scale = s->grad_scale;
  a.step = s->step;
  a.compute_params = s->params;
  a.compute_dtype = o->setup.compute_dtype;
  return o->setup.optimizer->step(o->setup.optimizer_self, &a);
}

static tsr_status hostoff_flush(void *self) {
  (void)self;
  return TSR_OK;
}

/* The state slot's memory at `offset`, or NULL (error recorded) if the slot or
 * the range is out of bounds. */
static float *hostoff_at(hostoff *o, uint32_t slot, size_t offset, size_t count) {
  if (slot >= o->nslots || offset + count > o->setup.n) {
    o->host->error(o->host->ctx, TSR_ERR_INVALID, "frozen_host: bad state slot or range");
    return NULL;
  }
  return o->slots[slot] + offset;
}

static tsr_status hostoff_read(void *self, uint32_t slot, size_t offset, size_t count, float *dst) {
  const float *p = hostoff_at((hostoff *)self, slot, offset, count);
  if (!p) return TSR_ERR_INVALID;
  memcpy(dst, p, count * sizeof(float));
  return TSR_OK;
}

static tsr_status hostoff_write(void *self, uint32_t slot, size_t offset, size_t count,
                                const float *src) {
  float *p = hostoff_at((hostoff *)self, slot, offset, count);
  if (!p) return TSR_ERR_INVALID;
  memcpy(p, src, count * sizeof(float));
  return TSR_OK;
}

static const tsr_offload_vtable hostoff_vtable = {sizeof(tsr_offload_vtable),
                                                  hostoff_create,
                                                  hostoff_destroy,
                                                  hostoff_setup,
                                                  hostoff_step,
                                                  hostoff_flush,
                                                  hostoff_read,
                                                  hostoff_write};

/* --- the library -------------------------------------------------------------------- */

static const tsr_plugin_descriptor kDescriptors[] = {
    {sizeof(tsr_plugin_descriptor), TSR_KIND_DATASET, "frozen_blobs", "1.0.0",
     "ABI 1.0 test dataset", blobs_params, COUNT(blobs_params), TSR_DEVICE_CPU, &blobs_vtable},
    {sizeof(tsr_plugin_descriptor), TSR_KIND_SAMPLER, "frozen_blocks", "1.0.0",
     "ABI 1.0 test sampler", NULL, 0, TSR_DEVICE_CPU, &blocks_vtable},
    {sizeof(tsr_plugin_descriptor), TSR_KIND_MODEL, "frozen_linear", "1.0.0", "ABI 1.0 test model",
     NULL, 0, TSR_DEVICE_CPU, &linear_vtable},
    {sizeof(tsr_plugin_descriptor), TSR_KIND_OPTIMIZER, "frozen_sgd", "1.0.0",
     "ABI 1.0 test optimizer", sgd_params, COUNT(sgd_params), TSR_DEVICE_CPU, &sgd_vtable},
    {sizeof(tsr_plugin_descriptor), TSR_KIND_OFFLOAD, "frozen_host", "1.0.0",
     "ABI 1.0 test offload", NULL, 0, TSR_DEVICE_CPU, &hostoff_vtable},
};

static const tsr_plugin_descriptor *const kPlugins[] = {
    &kDescriptors[0], &kDescriptors[1], &kDescriptors[2], &kDescriptors[3], &kDescriptors[4]};

static const tsr_plugin_library kLibrary = {sizeof(tsr_plugin_library), TSR_ABI_MAJOR,
                                            TSR_ABI_MINOR, kPlugins, COUNT(kPlugins)};

TSR_PLUGIN_ENTRY {
  return &kLibrary;
}
