/* The host table: everything a plugin may touch. A plugin receives a
 * `const tsr_host *` at create time and keeps it; the table and everything it
 * points at outlive every plugin instance. */
#ifndef TESSERA_HOST_H
#define TESSERA_HOST_H

#include <dlpack/dlpack.h>
#include <tessera/abi.h>
#include <tessera/ops.h>

/* Opaque host-side handles. */
typedef struct tsr_config tsr_config; /* one plugin's validated config section */
typedef struct tsr_step tsr_step;     /* the current micro-batch step */

/* Log levels. */
#define TSR_LOG_DEBUG 0
#define TSR_LOG_INFO 1
#define TSR_LOG_WARN 2
#define TSR_LOG_ERROR 3

/* What a device allocation is for; the allocator keeps statistics by purpose. */
typedef int32_t tsr_mem_purpose;
#define TSR_MEM_PARAMS 0
#define TSR_MEM_GRADS 1
#define TSR_MEM_OPTIMIZER 2
#define TSR_MEM_ACTIVATIONS 3
#define TSR_MEM_COMM 4
#define TSR_MEM_OTHER 5
#define TSR_MEM_PURPOSE_COUNT 6

/* Numeric precision of a run. */
typedef int32_t tsr_precision;
#define TSR_PRECISION_FP32 0
#define TSR_PRECISION_BF16 1
#define TSR_PRECISION_FP16 2

/* Reduction operators for collectives. */
typedef int32_t tsr_reduce_op;
#define TSR_REDUCE_SUM 0
#define TSR_REDUCE_AVG 1
#define TSR_REDUCE_MAX 2
#define TSR_REDUCE_MIN 3

/* Facts about this process in the job. */
typedef struct tsr_run_info {
  size_t struct_size;
  uint32_t rank;
  uint32_t world_size;
  uint32_t local_rank;
  uint32_t local_world_size;
  DLDevice device;         /* where compute runs */
  tsr_precision precision; /* compute precision */
  uint64_t seed;           /* run.seed */
  const char *run_dir;     /* run.dir, created by the host */
} tsr_run_info;
#define tsr_run_info_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_run_info, run_dir)

/* ABI 1.2: what tsr_host.device_memory reports. */
typedef struct tsr_device_memory {
  size_t struct_size;
  size_t in_use; /* bytes allocated through the host now */
  size_t peak;   /* the most allocated at once since the run began */
  size_t limit;  /* what the run may use; 0: no known limit */
} tsr_device_memory;
#define tsr_device_memory_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_device_memory, limit)

/* A pending collective; wait on it with tsr_comm.wait. */
typedef struct tsr_comm_work tsr_comm_work;

/* Collectives across the ranks of the job (Gloo on CPU, NCCL on CUDA).
 * Every call is asynchronous when `work` is non-NULL (wait on it later) and
 * blocking when it is NULL. Tensors must be contiguous. */
typedef struct tsr_comm {
  size_t struct_size;
  tsr_status (*all_reduce)(tsr_host_ctx *ctx, DLTensor *tensor, tsr_reduce_op op,
                           tsr_comm_work **work);
  /* input: world_size * n elements; output: n elements (this rank's slice). */
  tsr_status (*reduce_scatter)(tsr_host_ctx *ctx, const DLTensor *input, DLTensor *output,
                               tsr_reduce_op op, tsr_comm_work **work);
  /* input: n elements; output: world_size * n elements, rank order. */
  tsr_status (*all_gather)(tsr_host_ctx *ctx, const DLTensor *input, DLTensor *output,
                           tsr_comm_work **work);
  tsr_status (*broadcast)(tsr_host_ctx *ctx, DLTensor *tensor, uint32_t root, tsr_comm_work **work);
  tsr_status (*barrier)(tsr_host_ctx *ctx);
  tsr_status (*wait)(tsr_host_ctx *ctx, tsr_comm_work *work);
} tsr_comm;
#define tsr_comm_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_comm, wait)

typedef struct tsr_host {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  tsr_host_ctx *ctx;

  /* Errors: record `message` for the failing call and return `code`, so a
   * plugin writes `return host->error(host->ctx, TSR_ERR_CONFIG, "...");`.
   * The host copies the message. */
  tsr_status (*error)(tsr_host_ctx *ctx, tsr_status code, const char *message);
  void (*log)(tsr_host_ctx *ctx, int32_t level, const char *message);

  /* Typed reads of a plugin's validated config section. Every declared key is
   * present (the default when the user gave none). Strings are host-owned and
   * live as long as the config. Reading an undeclared key or the wrong type
   * is TSR_ERR_CONFIG. */
  tsr_status (*config_bool)(const tsr_config *cfg, const char *key, int32_t *out);
  tsr_status (*config_int)(const tsr_config *cfg, const char *key, int64_t *out);
  tsr_status (*config_float)(const tsr_config *cfg, const char *key, double *out);
  tsr_status (*config_string)(const tsr_config *cfg, const char *key, const char **out);
  tsr_status (*config_array_size)(const tsr_config *cfg, const char *key, size_t *out);
  tsr_status (*config_int_at)(const tsr_config *cfg, const char *key, size_t i, int64_t *out);
  tsr_status (*config_float_at)(const tsr_config *cfg, const char *key, size_t i, double *out);
  tsr_status (*config_string_at)(const tsr_config *cfg, const char *key, size_t i,
                                 const char **out);

  /* Memory on a device (kDLCPU for host memory, kDLCUDAHost for pinned host
   * memory), counted by purpose. Zero bytes gives NULL and TSR_OK. */
  tsr_status (*alloc)(tsr_host_ctx *ctx, DLDevice device, size_t bytes, tsr_mem_purpose purpose,
                      void **out);
  void (*free)(tsr_host_ctx *ctx, void *ptr);

  const tsr_run_info *run;
  const tsr_ops *ops;
  const tsr_comm *comm;

  /* A deterministic seed for a named random stream, derived from run.seed,
   * the rank when `per_rank` is non-zero, and the name. */
  uint64_t (*seed_for)(tsr_host_ctx *ctx, const char *stream, int32_t per_rank);

  /* The step context, valid inside model forward/backward. param gives a
   * view of declared parameter `index` in compute precision on the run's
   * device; grad gives its gradient buffer, which the model adds into.
   * Views stay valid until the model says it is done with the parameter's
   * group (params_done in forward, grads_done in backward) or the pass
   * ends; under ZeRO stage 3 the group is gathered on demand and released
   * then, so take views just before use.
   * grads_done(g): group g's gradients for this micro-batch are final, so
   * their reduction may start. params_done(g): the model needs group g's
   * parameters no more in this forward pass. */
  tsr_status (*param)(tsr_step *step, uint32_t index, DLTensor *out);
  tsr_status (*grad)(tsr_step *step, uint32_t index, DLTensor *out);
  tsr_status (*grads_done)(tsr_step *step, uint32_t group);
  tsr_status (*params_done)(tsr_step *step, uint32_t group);

  /* ---- ABI 1.1 ----
   * The stream every op of `ops` runs on (a cudaStream_t in CUDA runs; NULL
   * on the CPU). A plugin that launches its own kernels puts them on it, so
   * they stay ordered with the ops and the collectives. */
  void *compute_stream;
  /* Blocks until everything queued on compute_stream has finished (no-op
   * on the CPU). */
  tsr_status (*synchronize)(tsr_host_ctx *ctx);

  /* ---- ABI 1.2 (check TSR_HAS_FIELD(host, tsr_host, device_memory)) ----
   * Memory of the compute device as the host counts it: bytes in use and
   * the peak since the run began (every purpose), and the limit the run
   * may use (run.max_gpu_memory, else the device's capacity; 0 when
   * unknown, e.g. on the CPU). An offload backend sizes a GPU share of the
   * optimizer state from it. */
  tsr_status (*device_memory)(tsr_host_ctx *ctx, tsr_device_memory *out);

  /* ---- ABI 1.5 (check TSR_HAS_FIELD(host, tsr_host, grads_zeroed)) ----
   * Inside backward: *out = 1 when every gradient buffer `grad` hands out
   * in this pass held zeros as the pass began (the first micro-batch of a
   * step, the gradients cleared since the last update), else 0 (a later
   * micro-batch adds into what the earlier ones left, or the host does not
   * know). With 1 a model may write a gradient's first contribution
   * instead of adding it (a weight-gradient matmul with beta = 0 reads no
   * old gradient) and gets the same values; it still adds every later
   * contribution to the same gradient in the pass. */
  tsr_status (*grads_zeroed)(tsr_step *step, int32_t *out);

  /* ---- ABI 1.9 (check TSR_HAS_FIELD(host, tsr_host, step_position)) ----
   * Where this pass stands in training: *update = the training steps
   * completed before it (an fp16 step whose update was skipped counts; a
   * resumed run counts on from its checkpoint), *micro =
   * its micro-batch within the update (0 .. accumulation - 1); outside
   * training (evaluation, generation, checks) both 0. A
   * model that draws random numbers (dropout) keys them on these, so a
   * recomputed forward, a resumed run and a rerun draw the same ones. */
  tsr_status (*step_position)(tsr_step *step, uint64_t *update, uint32_t *micro);
} tsr_host;
#define tsr_host_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_host, step_position)

#endif /* TESSERA_HOST_H */
