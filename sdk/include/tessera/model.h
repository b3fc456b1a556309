/* Kind tessera.model/1: parameters, forward, backward, metrics, FLOPs. */
#ifndef TESSERA_MODEL_H
#define TESSERA_MODEL_H

#include <tessera/dataset.h>
#include <tessera/host.h>

#define TSR_MAX_DIMS 8

/* Parameter initialisers. */
typedef int32_t tsr_init;
#define TSR_INIT_ZEROS 0
#define TSR_INIT_ONES 1
#define TSR_INIT_NORMAL 2  /* mean a, std b */
#define TSR_INIT_UNIFORM 3 /* in [a, b) */

/* One declared parameter. The host lays parameters out in flat buffers,
 * group after group, in declaration order. */
typedef struct tsr_param_info {
  size_t struct_size;
  const char *name; /* the model's own tensor name, used in exports */
  int32_t ndim;
  int64_t shape[TSR_MAX_DIMS];
  uint32_t group; /* usually a layer; non-decreasing over declaration order */
  tsr_init init;
  float init_a;
  float init_b;
  int32_t trainable; /* 0: frozen, no gradient and no optimizer state */
  int32_t decay;     /* 0: excluded from weight decay (biases, norms) */
} tsr_param_info;
#define tsr_param_info_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_param_info, decay)

/* What the model is built for. */
typedef struct tsr_model_init {
  size_t struct_size;
  const tsr_data_info *data; /* the training dataset's sample description */
  int64_t max_micro_batch;   /* largest batch forward will see */
} tsr_model_init;
#define tsr_model_init_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_model_init, max_micro_batch)

/* Result of one forward pass over a micro-batch. */
typedef struct tsr_forward_result {
  size_t struct_size;
  double loss_sum; /* summed over counted targets */
  int64_t count;   /* targets counted in the loss */
  int64_t correct; /* targets predicted right (classification), or -1 */
} tsr_forward_result;
#define tsr_forward_result_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_forward_result, correct)

typedef struct tsr_model_vtable {
  size_t struct_size;
  tsr_status (*create)(const tsr_host *host, const tsr_config *cfg, const tsr_model_init *init,
                       void **out_self);
  void (*destroy)(void *self);
  size_t (*num_params)(void *self);
  tsr_status (*param_info)(void *self, size_t index, tsr_param_info *out);
  /* Forward over `batch`; keeps what backward needs. When `training` is 0 no
   * backward follows. */
  tsr_status (*forward)(void *self, tsr_step *step, const tsr_batch *batch, int32_t training,
                        tsr_forward_result *out);
  /* Backward of the last forward; adds d(loss_sum * loss_scale)/dparam into
   * the gradients and calls grads_done for each group once it is final. */
  tsr_status (*backward)(void *self, tsr_step *step, const tsr_batch *batch, float loss_scale);
  /* Forward+backward FLOPs per sample, for MFU; 0 if unknown. */
  double (*flops_per_sample)(void *self);

  /* ---- ABI 1.1 (check TSR_HAS_FIELD(vt, tsr_model_vtable, predict) and
   * that it is not NULL: a model may leave it out) ---- */

  /* Inference: forward over `batch` without a loss, writing the logits of
   * each sample's prediction into `logits`, float32 [batch->size, classes],
   * compact, in host memory (kDLCPU, kDLCUDAHost) or on the run's device;
   * the model casts and copies into it. classes is the model's number of
   * real classes (a language model's vocabulary without padding rows). For
   * a sequence model the prediction is the one after each sample's LAST
   * input position (inputs [n, T'], T' up to the model's context; shorter
   * than the training windows works); for a classifier, each sample's.
   * `batch->targets` may be absent (data NULL) and is not read. Keeps
   * nothing for backward: a backward after predict is an error. With
   * pinned memory (kDLCUDAHost) the copy may still be in flight on
   * compute_stream when predict returns; kDLCPU memory is written when it
   * returns.
   * Size query: with `logits->data` NULL (ndim 2, shape pointing at two
   * int64_t), predict computes nothing, sets logits->shape[1] to classes
   * and returns TSR_OK; `batch` is not read and may be NULL. */
  tsr_status (*predict)(void *self, tsr_step *step, const tsr_batch *batch, DLTensor *logits);
} tsr_model_vtable;
#define tsr_model_vtable_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_model_vtable, predict)

#endif /* TESSERA_MODEL_H */
