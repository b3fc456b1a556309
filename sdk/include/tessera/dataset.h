/* Kind tessera.dataset/1: how samples are read and batched. */
#ifndef TESSERA_DATASET_H
#define TESSERA_DATASET_H

#include <tessera/host.h>

/* Shape of one sample. */
typedef struct tsr_data_info {
  size_t struct_size;
  int64_t length; /* number of samples */
  DLDataType input_dtype;
  int32_t input_ndim;
  int64_t input_shape[8];
  DLDataType target_dtype;
  int32_t target_ndim; /* 0: one target per sample */
  int64_t target_shape[8];
  int64_t num_classes; /* classification: number of classes; else 0 */
  /* ---- ABI 1.8 (check TSR_HAS_FIELD(info, tsr_data_info, positions)) ----
   * 1: every batch carries per-token positions (tsr_batch.positions, int32
   * with the inputs' shape): packed sequences, whose positions restart at 0
   * where each packed example begins. 0: none (a sequence model counts
   * positions 0, 1, ... along each sample). */
  int32_t positions;
} tsr_data_info;
#define tsr_data_info_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_data_info, positions)

/* A batch in host memory: inputs [n, input_shape...], targets [n, target_shape...]. */
typedef struct tsr_batch {
  size_t struct_size;
  int64_t size;
  DLTensor inputs;
  DLTensor targets;
  /* ---- ABI 1.8 (check TSR_HAS_FIELD(batch, tsr_batch, positions) and that
   * positions.data is not NULL) ----
   * Per-token positions, int32 [n, input_shape...], where the dataset's
   * info says positions = 1 (else data is NULL): position p at token i
   * means tokens i - p .. i are one packed example, the tokens a model
   * lets token i attend to (ops.h, attention_packed_forward), and p is the
   * position its rotary embedding uses. */
  DLTensor positions;
} tsr_batch;
#define tsr_batch_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_batch, positions)
/* What a host or dataset of ABI 1.0 to 1.7 sets: a reader accepts any
 * struct_size from here on and reads positions only under TSR_HAS_FIELD. */
#define tsr_batch_STRUCT_SIZE_1_0 TSR_STRUCT_SIZE(tsr_batch, targets)

typedef struct tsr_dataset_vtable {
  size_t struct_size;
  /* `split` is "train" or "eval": the config section the dataset came from. */
  tsr_status (*create)(const tsr_host *host, const tsr_config *cfg, const char *split,
                       void **out_self);
  void (*destroy)(void *self);
  tsr_status (*info)(void *self, tsr_data_info *out);
  /* Fill out->inputs and out->targets (host buffers the host allocated for
   * out->size samples) with the samples at `indices`, and out->positions
   * too where the info says positions = 1 (ABI 1.8). Called from loader
   * threads: must be safe to call concurrently. */
  tsr_status (*read)(void *self, const int64_t *indices, tsr_batch *out);
} tsr_dataset_vtable;
#define tsr_dataset_vtable_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_dataset_vtable, read)

#endif /* TESSERA_DATASET_H */
