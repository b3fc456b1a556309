// Every key a DeepSpeed JSON holds is used, warned about once (a DeepSpeed
// tuning knob with no meaning here, listed in docs/config.md) or refused:
// a typo at any depth with a did-you-mean naming its path, a feature tessera
// lacks (switched on) naming it, and a key given twice naming the key and
// the file (issue 53, item 4).
#include <catch2/catch.hpp>
#include <string>

#include "config/config.hpp"
#include "deepspeed_support.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_deepspeed_strict {

using namespace tessera::test::deepspeed_support;

namespace {

int count_warnings(const Document &d, const std::string &part) {
  int n = 0;
  for (const auto &w : d.warnings()) n += w.find(part) != std::string::npos;
  return n;
}

}  // namespace

TEST_CASE("a typo inside a DeepSpeed section is refused with the path it meant",
          "[config][deepspeed]") {
  Quickstart q;
  const std::string ds = q.dir.file("ds.json");
  struct Typo {
    const char *json, *wrote, *meant;
  };
  const Typo typos[] = {
      {R"({"zero_optimization": {"stgae": 2}})", "zero_optimization.stgae",
       "zero_optimization.stage"},
      {R"({"optimizer": {"type": "SGD", "parms": {"lr": 0.1, "momentum": 0.9}}})",
       "optimizer.parms", "optimizer.params"},
      {R"({"optimizer": {"type": "SGD", "params": {"lrr": 0.1}}})", "optimizer.params.lrr",
       "optimizer.params.lr"},
      {R"({"optimizer": {"type": "Adam", "params": {"lr": 0.1, "betass": [0.9, 0.99]}}})",
       "optimizer.params.betass", "optimizer.params.betas"},
      {R"({"zero_optimization": {"stage": 2, "offload_optimiser": {"device": "cpu"}}})",
       "zero_optimization.offload_optimiser", "zero_optimization.offload_optimizer"},
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"devcie": "cpu"}}})",
       "zero_optimization.offload_optimizer.devcie", "zero_optimization.offload_optimizer.device"},
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"devcie": "cpu"}}})",
       "zero_optimization.offload_param.devcie", "zero_optimization.offload_param.device"},
      {R"({"zero_optimization": {"stage": 2, "reduce_bucket_sise": 5e8}})",
       "zero_optimization.reduce_bucket_sise", "zero_optimization.reduce_bucket_size"},
      {R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_step": 10}}})",
       "scheduler.params.warmup_num_step", "scheduler.params.warmup_num_steps"},
      {R"({"fp16": {"enabled": true, "loss_scale_windw": 100}})", "fp16.loss_scale_windw",
       "fp16.loss_scale_window"},
      {R"({"bf16": {"enabeld": true}})", "bf16.enabeld", "bf16.enabled"},
      {R"({"tensorboard": {"enabled": true, "output_pth": "tb"}})", "tensorboard.output_pth",
       "tensorboard.output_path"},
      {R"({"activation_checkpointing": {"partition_activation": false}})",
       "activation_checkpointing.partition_activation",
       "activation_checkpointing.partition_activations"},
  };
  for (const auto &t : typos) {
    INFO(t.json);
    const std::string msg = q.doc_error(t.json);
    CHECK(msg == ds + ": '" + t.wrote + "' is not a DeepSpeed config key; did you mean '" +
                     t.meant + "'?");
  }
  // No close key: the section's keys are listed.
  const std::string msg = q.doc_error(R"({"zero_optimization": {"zzzzzzzz": 1}})");
  CHECK_THAT(msg, Catch::StartsWith(ds + ": 'zero_optimization.zzzzzzzz' is not a DeepSpeed "
                                         "config key (docs/config.md"));
}

TEST_CASE("the tutorial's optimizer with a misspelt 'params' does not train on defaults",
          "[config][deepspeed]") {
  Quickstart q;
  // Before: trained with sgd's default lr and momentum, without a word.
  const std::string msg =
      q.job_error(R"({"optimizer": {"type": "SGD", "parms": {"lr": 0.001, "momentum": 0.9}}})");
  CHECK_THAT(msg, Catch::Contains("did you mean 'optimizer.params'?"));
}

TEST_CASE("a parameter the optimizer type does not take is refused", "[config][deepspeed]") {
  Quickstart q;
  const std::string ds = q.dir.file("ds.json");
  // Adam's betas given to SGD: torch.optim.SGD would not take them either.
  CHECK(q.doc_error(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "betas": [0.9, 0.9]}}})")
            .rfind(ds + ": 'optimizer.params.betas' is not a DeepSpeed config key", 0) == 0);
  // bias_correction true is what tessera's adam does; false is refused.
  Document d = q.doc(R"({"optimizer": {"type": "Adam", "params": {"bias_correction": true}}})");
  CHECK_FALSE(any_warning(d, "bias_correction"));
  CHECK_THAT(
      q.doc_error(R"({"optimizer": {"type": "Adam", "params": {"bias_correction": false}}})"),
      Catch::StartsWith(ds + ": optimizer.params.bias_correction: "));
}

TEST_CASE("DeepSpeed features tessera lacks are refused when switched on, accepted when off",
          "[config][deepspeed]") {
  Quickstart q;
  const std::string ds = q.dir.file("ds.json");
  CHECK_THAT(q.doc_error(R"({"zero_optimization": {"stage": 3, "zero_quantized_weights": true}})"),
             Catch::StartsWith(ds + ": zero_optimization.zero_quantized_weights: ") &&
                 Catch::Contains("tessera does not have"));
  CHECK_THAT(q.doc_error(R"({"sequence_parallel_size": 4})"),
             Catch::StartsWith(ds + ": sequence_parallel_size: "));
  CHECK_THAT(q.doc_error(R"({"compression_training": {"weight_quantization": {}}})"),
             Catch::StartsWith(ds + ": compression_training: "));
  CHECK_THAT(q.doc_error(R"({"fp16": {"enabled": true, "consecutive_hysteresis": true}})"),
             Catch::StartsWith(ds + ": fp16.consecutive_hysteresis: "));
  // Off is what tessera does: nothing to say.
  Document d = q.doc(R"({"zero_optimization": {"stage": 2, "zero_quantized_weights": false},
      "sequence_parallel_size": 1, "hybrid_engine": {"enabled": false},
      "fp16": {"enabled": false, "consecutive_hysteresis": false}})");
  CHECK(d.warnings().empty());
}

TEST_CASE("DeepSpeed tuning knobs are warned about once, naming their path",
          "[config][deepspeed]") {
  Quickstart q;
  Document d = q.doc(R"({"zero_optimization": {"stage": 2, "contiguous_gradients": true,
      "allgather_bucket_size": 5e8, "offload_optimizer": {"device": "cpu", "pin_memory": true}},
      "prescale_gradients": false, "train_batch_size": 4})");
  CHECK(count_warnings(d, "zero_optimization.contiguous_gradients is not used by tessera") == 1);
  CHECK(count_warnings(d, "zero_optimization.allgather_bucket_size is not used by tessera") == 1);
  CHECK(count_warnings(d, "zero_optimization.offload_optimizer.pin_memory is not used") == 1);
  CHECK(count_warnings(d, "'prescale_gradients' is not used by tessera") == 1);
  // The same JSON layered twice (run.deepspeed and --deepspeed_config) says
  // each once.
  std::string text = quickstart_text();
  text.insert(text.find("[run]\n") + 6, "deepspeed = \"ds.json\"\n");
  JobOptions o = q.options(q.dir.file("ds.json"));
  o.config_path = q.dir.write("with_ds.toml", text);
  Document twice = tessera::load_document(o);
  CHECK(count_warnings(twice, "zero_optimization.contiguous_gradients is not used") == 1);
}

TEST_CASE("a key given twice in a DeepSpeed JSON is an error naming it and the file",
          "[config][deepspeed]") {
  Quickstart q;
  const std::string ds = q.dir.file("ds.json");
  CHECK(q.doc_error(R"({"train_batch_size": 4, "train_batch_size": 8})") ==
        ds + ": 'train_batch_size' is given twice; DeepSpeed would silently take the last");
  CHECK(q.doc_error(R"({"zero_optimization": {"stage": 1, "overlap_comm": true, "stage": 3}})") ==
        ds + ": 'zero_optimization.stage' is given twice; DeepSpeed would silently take the last");
  CHECK_THAT(q.doc_error(R"({"optimizer": {"type": "SGD", "params": {"lr": 1, "lr": 2}}})"),
             Catch::Contains("'optimizer.params.lr' is given twice"));
  // The same name in two sections is no duplicate.
  Document d = q.doc(R"({"tensorboard": {"enabled": false}, "csv_monitor": {"enabled": false}})");
  CHECK(find(d.root(), "monitor.tensorboard.enabled") != nullptr);
}

}  // namespace unit_test_deepspeed_strict
