// Every key DeepSpeed's config reader knows, section by section
// (deepspeed/runtime/config.py, zero/config.py, zero/offload_config.py,
// precision_config.py, the monitor and activation checkpointing configs,
// and the constructors of the optimizers and schedulers it builds), sorted
// into what tessera maps, DeepSpeed's tuning knobs that mean nothing here
// (warned about; docs/config.md lists them) and features tessera does not
// have (refused unless switched off). A key in none of them is a typo.
#include <algorithm>

#include "config/deepspeed.hpp"

namespace tessera::config {

namespace {

using Keys = std::vector<std::string>;

// The optimizer's and scheduler's params depend on their type: the
// section's name carries it ("optimizer.params:SGD").
// long-function: one table of DeepSpeed's keys, section by section, read
// top to bottom beside DeepSpeed's config reference; split, it would only
// be harder to check against it.
const std::vector<std::pair<std::string, DeepSpeedSection>> &sections() {
  static const std::vector<std::pair<std::string, DeepSpeedSection>> all = {
      {"",
       {{"activation_checkpointing", "bf16", "bfloat16", "comet", "csv_monitor", "fp16",
         "gradient_accumulation_steps", "gradient_clipping", "optimizer", "scheduler",
         "steps_per_print", "tensorboard", "train_batch_size", "train_micro_batch_size_per_gpu",
         "wall_clock_breakdown", "wandb", "zero_optimization"},
        {"aio",
         "autotuning",
         "checkpoint",
         "comms_logger",
         "communication_data_type",
         "compile",
         "data_types",
         "dataloader_drop_last",
         "disable_allgather",
         "dump_state",
         "flops_profiler",
         "fp32_allreduce",
         "gradient_predivide_factor",
         "graph_harvesting",
         "memory_breakdown",
         "nebula",
         "prescale_gradients",
         "seq_parallel_communication_data_type",
         "sparse_gradients",
         "timers",
         "use_data_before_expert_parallelism",
         "vocabulary_size",
         "zero_allow_untested_optimizer",
         "zero_force_ds_cpu_optimizer"},
        {"amp", "compression_training", "curriculum_learning", "data_efficiency", "eigenvalue",
         "elasticity", "hybrid_engine", "pipeline", "progressive_layer_drop", "quantize_training",
         "sequence_parallel_size", "sparse_attention", "tensor_parallel", "torch_autocast",
         "weight_quantization"}}},
      {"zero_optimization",
       {{"stage", "offload_optimizer", "offload_param", "reduce_bucket_size", "overlap_comm",
         "stage3_prefetch_bucket_size"},
        {"allgather_bucket_size",
         "allgather_partitions",
         "contiguous_gradients",
         "cpu_offload_use_pin_memory",
         "elastic_checkpoint",
         "gather_16bit_weights_on_model_save",
         "ignore_unused_parameters",
         "legacy_stage1",
         "load_from_fp32_weights",
         "log_trace_cache_warnings",
         "max_live_parameters",
         "max_reuse_distance",
         "memory_efficient_linear",
         "model_persistence_threshold",
         "module_granularity_threshold",
         "override_module_apply",
         "param_persistence_threshold",
         "pipeline_loading_checkpoint",
         "prefetch_bucket_size",
         "reduce_scatter",
         "round_robin_gradients",
         "stage3_gather_16bit_weights_on_model_save",
         "stage3_gather_fp16_weights_on_model_save",
         "stage3_max_live_parameters",
         "stage3_max_reuse_distance",
         "stage3_model_persistence_threshold",
         "stage3_module_granularity_threshold",
         "stage3_param_persistence_threshold",
         "stage3_use_all_reduce_for_fetch_params",
         "sub_group_size",
         "use_all_reduce_for_fetch_params",
         "use_multi_rank_bucket_allreduce"},
        {"cpu_offload", "cpu_offload_param", "mics_hierarchical_params_gather", "mics_shard_size",
         "zero_hpz_partition_size", "zero_quantized_gradients",
         "zero_quantized_nontrainable_weights", "zero_quantized_weights", "zeropp_loco_param"}}},
      {"zero_optimization.offload_optimizer",
       {{"device", "nvme_path", "ratio"},
        {"buffer_count", "fast_init", "pin_memory", "pipeline", "pipeline_read", "pipeline_write"},
        {}}},
      {"zero_optimization.offload_param",
       {{"device", "nvme_path"}, {"buffer_count", "buffer_size", "max_in_cpu", "pin_memory"}, {}}},
      {"fp16",
       {{"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
         "min_loss_scale"},
        {"auto_cast"},
        {"consecutive_hysteresis", "fp16_master_weights_and_grads"}}},
      {"bf16", {{"enabled"}, {"check_grad_overflow", "immediate_grad_update"}, {}}},
      {"optimizer", {{"type", "params"}, {"legacy_fusion"}, {}}},
      {"optimizer.params:sgd",
       {{"lr", "momentum", "dampening", "nesterov", "weight_decay"},
        {"differentiable", "foreach", "fused"},
        {"maximize"}}},
      {"optimizer.params:adam",
       {{"lr", "betas", "eps", "weight_decay", "adam_w_mode", "torch_adam", "amsgrad",
         "bias_correction"},
        {"capturable", "differentiable", "foreach", "fp32_optimizer_states", "fused",
         "set_grad_none"},
        {"maximize"}}},
      {"scheduler", {{"type", "params"}, {}, {}}},
      {"scheduler.params:WarmupLR",
       {{"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
         "last_batch_iteration"},
        {},
        {}}},
      {"scheduler.params:WarmupDecayLR",
       {{"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps",
         "last_batch_iteration"},
        {},
        {}}},
      {"scheduler.params:WarmupCosineLR",
       {{"warmup_min_ratio", "warmup_num_steps", "warmup_type", "total_num_steps", "cos_min_ratio",
         "last_batch_iteration"},
        {},
        {}}},
      {"scheduler.params:OneCycle",
       {{"cycle_min_lr", "cycle_max_lr", "cycle_first_step_size", "cycle_second_step_size",
         "decay_lr_rate", "decay_step_size", "last_batch_iteration"},
        // Momentum cycling (tessera does not cycle momentum) and the stair
        // counts: warned, as DeepSpeed's OneCycle configs carry them.
        {"cycle_first_stair_count", "cycle_max_mom", "cycle_min_mom", "cycle_momentum",
         "cycle_second_stair_count", "decay_mom_rate"},
        {}}},
      {"activation_checkpointing",
       {{},
        {"contiguous_memory_optimization", "cpu_checkpointing", "number_checkpoints",
         "partition_activations", "profile", "synchronize_checkpoint_boundary"},
        {}}},
      {"tensorboard", {{"enabled", "output_path", "job_name"}, {}, {}}},
      {"csv_monitor", {{"enabled", "output_path", "job_name"}, {}, {}}},
      {"wandb", {{"enabled"}, {"group", "project", "team"}, {}}},
      {"comet",
       {{"enabled"},
        {"api_key", "experiment_key", "experiment_name", "mode", "online", "project",
         "samples_log_interval", "workspace"},
        {}}},
  };
  return all;
}

}  // namespace

const DeepSpeedSection *deepspeed_section(const std::string &name) {
  const std::string key = name == "bfloat16" ? "bf16" : name;
  for (const auto &[n, s] : sections())
    if (n == key) return &s;
  return nullptr;
}

Keys DeepSpeedSection::all() const {
  Keys k = used;
  k.insert(k.end(), knobs.begin(), knobs.end());
  k.insert(k.end(), lacking.begin(), lacking.end());
  return k;
}

bool DeepSpeedSection::has(const Keys &list, const std::string &key) {
  return std::find(list.begin(), list.end(), key) != list.end();
}

}  // namespace tessera::config
