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
} tsr_ext_model_init_from;
#define tsr_ext_model_init_from_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_ext_model_init_from, weights_file)

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
} tsr_export_args;
#define tsr_export_args_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_export_args, summary_cap)

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

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_EXTENSIONS_H */
