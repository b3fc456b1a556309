/* tessera plugin ABI 1.2: extensions, the optional capabilities a host asks a
 * plugin for by versioned id (CLAP's get_extension), so the engine never
 * reads a plugin's config keys or knows a plugin by its name.
 *
 * A descriptor of ABI 1.2 may set get_extension (tsr_plugin_descriptor);
 * the host calls it with an id below and gets the extension's table, or
 * NULL when the plugin does not offer it. Tables are static storage; their
 * functions take the instance (`self`, made by the kind's create) or, where
 * they say so, a config. An id names one version of one table for ever: a
 * change that is not an appended field is a new id ("/2").
 *
 * Every table starts with struct_size and follows the struct_size rule
 * (abi.h). C99. */
#ifndef TESSERA_EXTENSIONS_H
#define TESSERA_EXTENSIONS_H

#include <tessera/dataset.h>
#include <tessera/host.h>
#include <tessera/zero.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- optimizers --------------------------------------------------------- */

/* The learning rate the optimizer was configured with: the peak the run's
 * schedule ([schedule]) scales each step (the step then gets the scheduled
 * rate in tsr_optimizer_step_args.lr). */
#define TSR_EXT_OPTIMIZER_LR "tessera.optimizer.lr/1"
typedef struct tsr_ext_optimizer_lr {
  size_t struct_size;
  double (*base_lr)(void *self);
} tsr_ext_optimizer_lr;
#define tsr_ext_optimizer_lr_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_ext_optimizer_lr, base_lr)

/* ---- models ------------------------------------------------------------- */

/* Initial weights from a file: a safetensors file whose tensors, matched by
 * parameter name, replace the declared initialisers (a tensor with fewer
 * rows than the parameter fills its first rows). weights_file returns the
 * path (valid while `self` lives), or NULL / "" for none. */
#define TSR_EXT_MODEL_INIT_FROM "tessera.model.init-from/1"
typedef struct tsr_ext_model_init_from {
  size_t struct_size;
  const char *(*weights_file)(void *self);
  /* ---- ABI 1.8 (optional, may be NULL) ----
   * 1 when the file need not hold parameter `index`: absent there, it keeps
   * its declared initialiser (low-rank adapters added to a base model's
   * weights); 0 when it must (the default for every parameter without
   * this entry). */
  int32_t (*may_lack)(void *self, size_t index);
} tsr_ext_model_init_from;
#define tsr_ext_model_init_from_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_ext_model_init_from, may_lack)
#define tsr_ext_model_init_from_STRUCT_SIZE_1_2 \
  TSR_STRUCT_SIZE(tsr_ext_model_init_from, weights_file)

/* A Hugging Face export of the weights (`tessera ckpt export`, the default
 * for a model that offers it, or --format hf): the plugin writes the files
 * another framework loads (for GPT-2, transformers' from_pretrained
 * directory). `self` is an instance the host made from the checkpoint's
 * config (on the CPU, for a micro-batch of 1), so its declared parameters
 * are the checkpoint's; the host hands each one's master weights. write
 * fills `summary` with one line for the user (what it wrote, where). */
#define TSR_EXT_MODEL_EXPORT_HF "tessera.model.export-hf/1"
typedef struct tsr_export_args {
  size_t struct_size;
  const char *out;            /* -o as the user gave it: a directory, or a FILE.safetensors */
  int64_t bf16;               /* 1: round the weights to bfloat16 (nearest even); 0: float32 */
  int64_t step;               /* the checkpoint's step, for the files' metadata */
  size_t num_params;          /* the model's num_params */
  const float *const *params; /* params[i]: parameter i's values, fp32, its declared shape */
  char *summary;              /* out: NUL-terminated, at most summary_cap bytes with the NUL */
  size_t summary_cap;
  /* ---- ABI 1.7 (check TSR_HAS_FIELD(args, tsr_export_args, max_shard_bytes)) ----
   * The largest weights file to write (--shard-size); a larger model goes
   * into shards with an index, as save_pretrained's max_shard_size. 0: the
   * plugin's default (Hugging Face's 5 GB). A plugin that writes one file
   * whatever the size may ignore it. */
  uint64_t max_shard_bytes;
  /* ---- ABI 1.8 (check TSR_HAS_FIELD(args, tsr_export_args, adapters)) ----
   * What to write of the low-rank adapters (LoRA) a model declares beside
   * its base weights (`tessera ckpt export --merge`, `--lora-format`):
   * TSR_EXPORT_BASE: the base weights as they are, the adapters left out
   * (the plugin warns that there are some); TSR_EXPORT_MERGED: each adapted
   * weight with its adapter folded in, a model without adapters;
   * TSR_EXPORT_PEFT: the adapters alone as PEFT's adapter directory
   * (adapter_config.json, adapter_model.safetensors) for the base model. A
   * plugin refuses MERGED and PEFT for a model without adapters; a host
   * asks for them only of a plugin of ABI 1.8 or later. */
  int64_t adapters;
} tsr_export_args;
#define TSR_EXPORT_BASE 0
#define TSR_EXPORT_MERGED 1
#define TSR_EXPORT_PEFT 2
/* Writers set the full size; a plugin accepts anything from the 1.2 size
 * (through summary_cap) on. */
#define tsr_export_args_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_export_args, adapters)
#define tsr_export_args_STRUCT_SIZE_1_2 TSR_STRUCT_SIZE(tsr_export_args, summary_cap)

typedef struct tsr_ext_model_export_hf {
  size_t struct_size;
  const char *target; /* what the files are for, in messages (e.g. "GPT2LMHeadModel") */
  tsr_status (*write)(void *self, const tsr_export_args *args);
} tsr_ext_model_export_hf;
#define tsr_ext_model_export_hf_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_ext_model_export_hf, write)

/* ---- datasets ----------------------------------------------------------- */

/* The shape of a sample from the dataset's config alone, without opening
 * its files: what `tessera generate` builds a language model for when the
 * training data is not at hand. `length` may be 0 (unknown). */
#define TSR_EXT_DATASET_SHAPE "tessera.dataset.shape/1"
typedef struct tsr_ext_dataset_shape {
  size_t struct_size;
  tsr_status (*shape)(const tsr_host *host, const tsr_config *cfg, tsr_data_info *out);
} tsr_ext_dataset_shape;
#define tsr_ext_dataset_shape_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_ext_dataset_shape, shape)

/* ---- zero plugins and offload backends: parameter offload ---------------- */

/* Where owned compute parameters come from when the zero plugin does not
 * keep them (DeepSpeed's offload_param): fetch starts copying owned
 * elements [offset, offset + count) (the zero plugin's owned offsets, as in
 * tsr_owned_range.owned_offset) into `dst`, count elements of the compute
 * dtype on the compute device, once the last update of those elements has
 * written them, and names the copy in *ticket; ready(ticket) makes work
 * queued on the host's compute stream from then on see the copied values
 * (a stream wait on CUDA; on the CPU, fetch has copied by the time it
 * returns). Valid for the run. */
typedef struct tsr_param_source {
  size_t struct_size;
  void *self;
  tsr_status (*fetch)(void *self, size_t offset, size_t count, void *dst, uint64_t *ticket);
  tsr_status (*ready)(void *self, uint64_t ticket);
} tsr_param_source;
#define tsr_param_source_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_param_source, ready)

/* An offload backend that can keep the owned compute parameters itself, in
 * host memory or on disk. home says where this instance keeps them, from
 * its config (asked after create, before setup): TSR_PARAMS_ON_DEVICE
 * means it does not (the zero plugin keeps them, the default). Otherwise
 * the host hands fetch and ready to the zero plugin as a tsr_param_source
 * (TSR_EXT_ZERO_PARAM_SOURCE), the ranges' params pointers are NULL, and
 * the backend's updates write its own copy: write_state of slot 0 (the
 * initial and the checkpoint's master weights) sets it too. bytes reports
 * what that copy takes in host memory and on disk, for the start-up
 * report. */
#define TSR_EXT_OFFLOAD_PARAMS "tessera.offload.params/1"
#define TSR_PARAMS_ON_DEVICE 0
#define TSR_PARAMS_ON_HOST 1
#define TSR_PARAMS_ON_DISK 2
typedef struct tsr_ext_offload_params {
  size_t struct_size;
  int32_t (*home)(void *self);
  tsr_status (*fetch)(void *self, size_t offset, size_t count, void *dst, uint64_t *ticket);
  tsr_status (*ready)(void *self, uint64_t ticket);
  void (*bytes)(void *self, uint64_t *host_bytes, uint64_t *disk_bytes);
} tsr_ext_offload_params;
#define tsr_ext_offload_params_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_ext_offload_params, bytes)

/* A zero plugin that can take its owned compute parameters from a
 * tsr_param_source instead of keeping them on the device. use() is called
 * once, before setup; it fails (naming why) when the plugin's stage keeps
 * full parameters on every rank, which only partitioning (stage 3) avoids.
 * The plugin then keeps no device copy of its slice, brings a group's
 * slice through the source just before the group is used, and reports
 * params = NULL in its ranges. */
#define TSR_EXT_ZERO_PARAM_SOURCE "tessera.zero.param-source/1"
typedef struct tsr_ext_zero_param_source {
  size_t struct_size;
  tsr_status (*use)(void *self, const tsr_param_source *source);
} tsr_ext_zero_param_source;
#define tsr_ext_zero_param_source_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_ext_zero_param_source, use)

/* Where a zero plugin hands this rank's reduced gradients, as each bucket's
 * reduce-scatter completes, instead of keeping them on the device (ZeRO
 * stage 3 with offloaded parameters). put takes owned [offset, offset +
 * count) from device memory src in the compute dtype: add 0 replaces what
 * the sink holds (the step's first contribution), add 1 adds to it (later
 * micro-batches). It is ordered after the work queued on the compute
 * stream so far and returns a ticket; src stays untouched until
 * release(ticket), which orders later compute-stream work after the copy's
 * read of src. norm_sq gives the sum of squares of every held gradient
 * (this rank's owned elements, once all puts have landed), for clipping. */
typedef struct tsr_grad_sink {
  size_t struct_size;
  void *self;
  tsr_status (*put)(void *self, size_t offset, size_t count, const void *src, int32_t add,
                    uint64_t *ticket);
  tsr_status (*release)(void *self, uint64_t ticket);
  tsr_status (*norm_sq)(void *self, double *out);
} tsr_grad_sink;
#define tsr_grad_sink_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_grad_sink, norm_sq)

/* An offload backend that can hold the owned gradients itself, in host
 * memory where its update reads them: the sink's three calls. The host
 * uses it with parameter offload (TSR_EXT_OFFLOAD_PARAMS): the ranges'
 * grads pointers are then NULL too. */
#define TSR_EXT_OFFLOAD_GRADS "tessera.offload.grads/1"
typedef struct tsr_ext_offload_grads {
  size_t struct_size;
  tsr_status (*put)(void *self, size_t offset, size_t count, const void *src, int32_t add,
                    uint64_t *ticket);
  tsr_status (*release)(void *self, uint64_t ticket);
  tsr_status (*norm_sq)(void *self, double *out);
} tsr_ext_offload_grads;
#define tsr_ext_offload_grads_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_ext_offload_grads, norm_sq)

/* ABI 1.7: an offload backend whose overlapped step (ABI 1.2 wait_params)
 * may start before the step's gradient scale is known. With gradient
 * clipping or fp16 loss scaling the scale needs the global gradient norm,
 * which needs every gradient; the host then calls begin() before handing
 * the step's first range over, hands ranges over as their gradients are
 * final with grad_scale as if no clipping applied (1 / loss scale), and
 * calls resolve() once the norm is known, before anything reads the
 * parameters or the state:
 *
 *   TSR_SPECULATE_KEEP    the scale handed over was right; nothing to redo.
 *   TSR_SPECULATE_RESTEP  every range handed over since begin() is updated
 *                         as if step() had been given grad_scale instead:
 *                         bit for bit the parameters, master weights and
 *                         state a plain step with grad_scale gives.
 *   TSR_SPECULATE_SKIP    no range handed over since begin() is updated
 *                         (fp16 overflow): parameters, master weights and
 *                         state stay bit for bit what they were.
 *
 * The gradients handed over stay untouched until wait_grads(), as for any
 * overlapped step. begin's flags: TSR_SPECULATE_MAY_SKIP when resolve may
 * say SKIP (the backend then also keeps what it needs to restore the
 * compute parameters). How the backend keeps what it needs to undo, and
 * how much it speculates, is its own (offload cpu: docs/config.md);
 * stats reports it for the breakdown. */
#define TSR_EXT_OFFLOAD_SPECULATE "tessera.offload.speculate/1"
#define TSR_SPECULATE_KEEP 0
#define TSR_SPECULATE_RESTEP 1
#define TSR_SPECULATE_SKIP 2
#define TSR_SPECULATE_MAY_SKIP 1u
/* Cumulative counts and seconds since setup. */
typedef struct tsr_speculate_stats {
  size_t struct_size;
  uint64_t steps;           /* begin() .. resolve() rounds */
  uint64_t redone;          /* rounds resolved RESTEP with a range already updated */
  uint64_t restored;        /* rounds resolved SKIP with a range already updated */
  uint64_t elements_redone; /* elements restored (and stepped again, for RESTEP) */
  double save_s;            /* keeping what an undo needs, inside the speculative steps */
  double redo_s;            /* restoring and stepping again */
  double held_s;            /* the update waited for the verdict (nothing left to undo with) */
} tsr_speculate_stats;
#define tsr_speculate_stats_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_speculate_stats, held_s)
typedef struct tsr_ext_offload_speculate {
  size_t struct_size;
  tsr_status (*begin)(void *self, uint32_t flags);
  tsr_status (*resolve)(void *self, int32_t verdict, double grad_scale);
  tsr_status (*stats)(void *self, tsr_speculate_stats *out);
} tsr_ext_offload_speculate;
#define tsr_ext_offload_speculate_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_ext_offload_speculate, stats)

/* A zero plugin that can hand its reduced gradients to a tsr_grad_sink
 * instead of keeping them: use() once, before setup; it fails (naming why)
 * where the stage does not partition gradients. The plugin then keeps no
 * device gradient slice (only the buckets in flight), reports grads = NULL
 * in its ranges and takes the gradient norm from the sink. */
#define TSR_EXT_ZERO_GRAD_SINK "tessera.zero.grad-sink/1"
typedef struct tsr_ext_zero_grad_sink {
  size_t struct_size;
  tsr_status (*use)(void *self, const tsr_grad_sink *sink);
} tsr_ext_zero_grad_sink;
#define tsr_ext_zero_grad_sink_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_ext_zero_grad_sink, use)

/* Frozen parameters (tsr_param_info.trainable = 0). The host lays a model
 * group's frozen parameters out as layout groups of their own (zero.h), and
 * tells the zero plugin which, before setup: frozen(self, group_frozen,
 * num_groups) with group_frozen[g] = 1 for such a group. The plugin then
 * keeps no gradient for a frozen group (grads() on it is an error, and the
 * host never calls grads_done on it), leaves it out of owned_count and
 * ranges() (so no optimizer state, no master copy and no offload traffic),
 * never reduces it and never re-shares it; it still keeps, partitions and
 * gathers the group's parameters as it does any group's (they come from
 * tsr_zero_setup.initial_params; under a tsr_param_source it keeps frozen
 * slices itself). frozen_ranges() then calls fn for each frozen range it
 * keeps, in flat order: flat_offset, count, and params pointing at its
 * compute parameters on the device (owned_offset and grads are 0 and
 * NULL): what a checkpoint saves and loads of the frozen groups. */
#define TSR_EXT_ZERO_FROZEN "tessera.zero.frozen/1"
typedef struct tsr_ext_zero_frozen {
  size_t struct_size;
  tsr_status (*frozen)(void *self, const int32_t *group_frozen, size_t num_groups);
  tsr_status (*frozen_ranges)(void *self, tsr_range_fn fn, void *ctx);
} tsr_ext_zero_frozen;
#define tsr_ext_zero_frozen_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_ext_zero_frozen, frozen_ranges)

/* ABI 1.10: which groups' gradients are final on this rank during the
 * step's last backward, where the plugin reduces gradients in buckets.
 * take_final(self, groups, cap, &n) writes up to cap such groups, in the
 * order their reductions were launched, each once a step, and sets n:
 * groups declared done on the last micro-batch whose reduction has
 * completed, or on a device is ordered before anything the host enqueues
 * on the compute stream from now on. At stages 0-1 that is the whole
 * group's gradient (several ranks; at one rank every group is final when
 * declared and the host does not ask); at stages 2-3, at any number of
 * ranks, this rank's owned slices of the group. It may wait for the
 * oldest reductions in flight to make them final (a bounded number stays
 * in flight); the rest are final when finish_grads returns. The host calls
 * it after grads_done on the last micro-batch, to start the update of
 * those groups while backward still runs. Reporting none is always
 * correct (the host then starts every range after finish_grads): a plugin
 * does so where the backend holds the gradients (the gradient sink) or a
 * stage it does not track. (Hosts before 2026-12-07 asked only at stages
 * 0-1 on several ranks.) */
#define TSR_EXT_ZERO_FINAL_GROUPS "tessera.zero.final-groups/1"
typedef struct tsr_ext_zero_final_groups {
  size_t struct_size;
  tsr_status (*take_final)(void *self, uint32_t *groups, size_t cap, size_t *n);
} tsr_ext_zero_final_groups;
#define tsr_ext_zero_final_groups_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_ext_zero_final_groups, take_final)

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_EXTENSIONS_H */
