// Every top-level key DeepSpeed's config reader knows (deepspeed/runtime/
// config.py and the configs of its features), so that a key tessera does
// not use can be told from a typo: the first is a warning, the second an
// error with a did-you-mean.
#include "config/deepspeed.hpp"

namespace tessera::config {

const std::vector<std::string> &deepspeed_known_keys() {
  static const std::vector<std::string> keys = {
      "activation_checkpointing",
      "aio",
      "amp",
      "autotuning",
      "bf16",
      "bfloat16",
      "checkpoint",
      "comet",
      "communication_data_type",
      "comms_logger",
      "compile",
      "compression_training",
      "csv_monitor",
      "curriculum_learning",
      "data_efficiency",
      "data_types",
      "dataloader_drop_last",
      "disable_allgather",
      "dump_state",
      "eigenvalue",
      "elasticity",
      "flops_profiler",
      "fp16",
      "fp32_allreduce",
      "gradient_accumulation_steps",
      "gradient_clipping",
      "gradient_predivide_factor",
      "graph_harvesting",
      "hybrid_engine",
      "memory_breakdown",
      "nebula",
      "optimizer",
      "pipeline",
      "prescale_gradients",
      "progressive_layer_drop",
      "quantize_training",
      "scheduler",
      "seq_parallel_communication_data_type",
      "sequence_parallel_size",
      "sparse_attention",
      "sparse_gradients",
      "steps_per_print",
      "tensor_parallel",
      "tensorboard",
      "timers",
      "torch_autocast",
      "train_batch_size",
      "train_micro_batch_size_per_gpu",
      "use_data_before_expert_parallelism",
      "vocabulary_size",
      "wall_clock_breakdown",
      "wandb",
      "weight_quantization",
      "zero_allow_untested_optimizer",
      "zero_force_ds_cpu_optimizer",
      "zero_optimization",
  };
  return keys;
}

}  // namespace tessera::config
