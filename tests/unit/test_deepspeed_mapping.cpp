// DeepSpeed JSON configs on top of configs/quickstart.toml: each mapping of
// DeepSpeed's names and defaults onto tessera's sections (batch, optimizer,
// scheduler, fp16/bf16, gradient clipping, ZeRO stage and offload,
// steps_per_print, wall_clock_breakdown), with warnings for unused keys and
// errors naming the file and key. The tutorial config, unused top-level keys
// and broken files are in test_deepspeed.cpp.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>

#include "config/config.hpp"
#include "config/deepspeed.hpp"
#include "deepspeed_support.hpp"
#include "train/job.hpp"
#include "train/schedule.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_deepspeed_mapping {

using namespace tessera::test::deepspeed_support;

// ---------------------------------------------------------------------------
// Batch

TEST_CASE("DeepSpeed batch keys follow DeepSpeed's batch rule", "[config][deepspeed]") {
  Quickstart q;
  SECTION("micro only: accumulation 1, global derived") {
    tessera::Job job = q.job(R"({"train_micro_batch_size_per_gpu": 16})", 4);
    CHECK(job.settings.micro_batch == 16);
    CHECK(job.settings.accumulation == 1);
    CHECK(job.settings.global_batch == 64);
  }
  SECTION("global and micro: accumulation derived") {
    tessera::Job job = q.job(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8})", 4);
    CHECK(job.settings.accumulation == 2);
  }
  SECTION("global and accumulation: micro derived") {
    tessera::Job job = q.job(R"({"train_batch_size": 64, "gradient_accumulation_steps": 4})", 2);
    CHECK(job.settings.micro_batch == 8);
  }
  SECTION("all three, consistent for 4 ranks, not for 2") {
    const char *all =
        R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
            "gradient_accumulation_steps": 2})";
    tessera::Job job = q.job(all, 4);
    CHECK(job.settings.global_batch == 32);
    std::string msg = q.job_error(all, 2);
    // The section came from the JSON: the message names it, and all four numbers.
    CHECK(msg.rfind(q.dir.file("ds.json") + ": ", 0) == 0);
    CHECK_THAT(msg, Catch::Contains("global (train_batch_size) = 32") &&
                        Catch::Contains("micro (train_micro_batch_size_per_gpu) = 4") &&
                        Catch::Contains("accumulation (gradient_accumulation_steps) = 2") &&
                        Catch::Contains("world size = 2"));
  }
  SECTION("bad values name the file and the DeepSpeed key") {
    std::string ds = q.dir.file("ds.json");
    std::string msg = q.doc_error(R"({"train_batch_size": "4"})");
    CHECK(msg.rfind(ds + ": train_batch_size: expected a number", 0) == 0);
    msg = q.job_error(R"({"train_batch_size": -4})");
    CHECK(msg.rfind(ds + ": train_batch_size: ", 0) == 0);
    CHECK_THAT(msg, Catch::Contains("must be >= 0"));
    msg = q.job_error(R"({"train_batch_size": 4.5})");
    CHECK(msg.rfind(ds + ": train_batch_size: ", 0) == 0);
    CHECK_THAT(msg, Catch::Contains("expected an integer"));
  }
}

// ---------------------------------------------------------------------------
// Optimizer

TEST_CASE("DeepSpeed optimizers map onto sgd and adam", "[config][deepspeed]") {
  Quickstart q;
  SECTION("Adam defaults to adam_w_mode = true and weight_decay 0") {
    Document d = q.doc(R"({"optimizer": {"type": "Adam", "params": {"lr": 0.0002}}})");
    CHECK(str_at(d, "optimizer.plugin") == "adam");
    CHECK(bool_at(d, "optimizer.adamw") == true);
    CHECK(num_at(d, "optimizer.weight_decay") == 0.0);
    CHECK(num_at(d, "optimizer.lr") == 0.0002);
    tessera::Job job = q.job(R"({"optimizer": {"type": "Adam", "params": {"lr": 0.0002}}})");
    CHECK(job.plugin("optimizer").entry->desc->name == std::string("adam"));
    CHECK(job.plugin("optimizer").values["adamw"].value_or(false) == true);
  }
  SECTION("Adam with adam_w_mode false is torch's Adam") {
    Document d = q.doc(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})");
    CHECK(bool_at(d, "optimizer.adamw") == false);
    // adam_w_mode is used, not ignored: the only warning is the note that
    // the TOML's schedule still applies (no scheduler in the JSON).
    for (const auto &w : d.warnings()) CHECK_THAT(w, Catch::Contains("but no scheduler"));
  }
  SECTION("AdamW is decoupled whatever adam_w_mode says, and types are case-blind") {
    Document d = q.doc(R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.001}}})");
    CHECK(str_at(d, "optimizer.plugin") == "adam");
    CHECK(bool_at(d, "optimizer.adamw") == true);
    CHECK(num_at(d, "optimizer.weight_decay") == 0.0);
    Document lower = q.doc(R"({"optimizer": {"type": "adamw", "params": {"adam_w_mode": false}}})");
    CHECK(bool_at(lower, "optimizer.adamw") == true);
  }
  SECTION("betas, eps and weight_decay") {
    tessera::Job job = q.job(R"({"optimizer": {"type": "Adam", "params":
        {"lr": 0.003, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.1}}})");
    const toml::table &v = job.plugin("optimizer").values;
    const toml::array *betas = v.get("betas")->as_array();
    REQUIRE(betas != nullptr);
    REQUIRE(betas->size() == 2);
    CHECK(betas->get(0)->value_or(0.0) == 0.8);
    CHECK(betas->get(1)->value_or(0.0) == 0.99);
    CHECK(v.get("eps")->value_or(0.0) == 1e-6);
    CHECK(v.get("weight_decay")->value_or(0.0) == 0.1);
    CHECK(v.get("lr")->value_or(0.0) == 0.003);
  }
  SECTION("SGD's keys") {
    tessera::Job job = q.job(R"({"optimizer": {"type": "SGD", "params":
        {"lr": 0.1, "momentum": 0.5, "dampening": 0.1, "weight_decay": 0.01}}})");
    const toml::table &v = job.plugin("optimizer").values;
    CHECK(v.get("dampening")->value_or(0.0) == 0.1);
    CHECK(v.get("weight_decay")->value_or(0.0) == 0.01);
  }
  SECTION("DeepSpeed's tuning knobs are warnings; what tessera does anyway is silent") {
    // bias_correction true, torch_adam and amsgrad false are what tessera's
    // adam does; a parameter SGD does not take is refused
    // (test_deepspeed_strict.cpp).
    Document d = q.doc(R"({"optimizer": {"type": "Adam", "params":
        {"lr": 0.001, "bias_correction": true, "torch_adam": false, "amsgrad": false,
         "fused": true}}})");
    CHECK(any_warning(d, "optimizer.params.fused is not used"));
    CHECK_FALSE(any_warning(d, "bias_correction"));
    CHECK_FALSE(any_warning(d, "torch_adam"));
    CHECK_FALSE(any_warning(d, "amsgrad"));
    Document sgd =
        q.doc(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "foreach": true}}})");
    CHECK(any_warning(sgd, "optimizer.params.foreach is not used by tessera"));
    CHECK(find(sgd.root(), "optimizer.foreach") == nullptr);
  }
  SECTION("errors name the file and key") {
    std::string ds = q.dir.file("ds.json");
    std::string msg = q.doc_error(R"({"optimizer": {"type": "Lamb", "params": {}}})");
    CHECK(msg.rfind(ds + ": optimizer.type: 'Lamb' is not supported", 0) == 0);
    msg = q.doc_error(R"({"optimizer": {"params": {"lr": 0.1}}})");
    CHECK(msg.rfind(ds + ": optimizer: expected", 0) == 0);
    msg = q.doc_error(R"({"optimizer": {"type": "SGD", "params": [0.1]}})");
    CHECK(msg.rfind(ds + ": optimizer.params: expected an object", 0) == 0);
    msg = q.doc_error(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": "yes"}}})");
    CHECK(msg.rfind(ds + ": optimizer.params.adam_w_mode: expected true or false", 0) == 0);
    msg = q.job_error(R"({"optimizer": {"type": "SGD", "params": {"lr": "fast"}}})");
    CHECK(msg.rfind(ds + ": optimizer.params.lr: ", 0) == 0);
    CHECK_THAT(msg, Catch::Contains("expected a number, got \"fast\""));
    msg = q.job_error(R"({"optimizer": {"type": "SGD", "params": {"momentum": 2}}})");
    CHECK(msg.rfind(ds + ": optimizer.params.momentum: ", 0) == 0);
    CHECK_THAT(msg, Catch::Contains("must be <= 1"));
  }
}

// ---------------------------------------------------------------------------
// Scheduler

TEST_CASE("DeepSpeed schedulers map onto [schedule]", "[config][deepspeed]") {
  Quickstart q;
  SECTION("WarmupLR: warmup_max_lr is the optimizer's lr; log ramp by default") {
    tessera::Job job = q.job(R"({"scheduler": {"type": "WarmupLR", "params":
        {"warmup_min_lr": 0.0001, "warmup_max_lr": 0.01, "warmup_num_steps": 50}}})");
    const auto &s = job.settings.schedule;
    CHECK(s.type == "warmup");
    CHECK(s.warmup_type == "log");
    CHECK(s.warmup_steps == 50);
    CHECK(s.warmup_min_lr == 0.0001);
    CHECK(job.plugin("optimizer").values["lr"].value_or(0.0) == 0.01);
    // The quickstart's adam is kept: the JSON has no optimizer.
    CHECK(job.plugin("optimizer").entry->desc->name == std::string("adam"));
    double lr = job.plugin("optimizer").values["lr"].value_or(0.0);
    CHECK(tessera::schedule_lr(s, lr, 0, 1000) == Approx(0.0001));
    CHECK(tessera::schedule_lr(s, lr, 49, 1000) == Approx(0.01));
  }
  SECTION("WarmupLR defaults: 1000 steps, min 0, the optimizer's lr") {
    Document d = q.doc(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.05}},
                           "scheduler": {"type": "WarmupLR"}})");
    CHECK(str_at(d, "schedule.type") == "warmup");
    CHECK(str_at(d, "schedule.warmup_type") == "log");
    CHECK(int_at(d, "schedule.warmup_steps") == 1000);
    CHECK(num_at(d, "optimizer.lr") == 0.05);
    CHECK(find(d.root(), "schedule.warmup_min_lr") == nullptr);  // engine default 0
  }
  SECTION("warmup_type linear") {
    Document d =
        q.doc(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "linear"}}})");
    CHECK(str_at(d, "schedule.warmup_type") == "linear");
    std::string msg =
        q.job_error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}})");
    CHECK(msg.rfind(q.dir.file("ds.json") + ": scheduler.params.warmup_type: ", 0) == 0);
    CHECK_THAT(msg, Catch::Contains("is not one of linear|log"));
  }
  SECTION("WarmupDecayLR: total_num_steps, and DeepSpeed's default peak 0.001") {
    tessera::Job job = q.job(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.5}},
        "scheduler": {"type": "WarmupDecayLR", "params":
        {"total_num_steps": 1000, "warmup_num_steps": 100, "warmup_type": "linear"}}})");
    const auto &s = job.settings.schedule;
    CHECK(s.type == "warmup_decay");
    CHECK(s.total_steps == 1000);
    CHECK(s.warmup_steps == 100);
    CHECK(s.warmup_type == "linear");
    CHECK(job.plugin("optimizer").values["lr"].value_or(0.0) == 0.001);
  }
  SECTION("WarmupCosineLR: ratios, DeepSpeed's cos_min_ratio 0.0001 by default") {
    tessera::Job job = q.job(R"({"scheduler": {"type": "WarmupCosineLR", "params":
        {"total_num_steps": 500, "warmup_min_ratio": 0.1, "warmup_num_steps": 20}}})");
    const auto &s = job.settings.schedule;
    CHECK(s.type == "warmup_cosine");
    CHECK(s.total_steps == 500);
    CHECK(s.warmup_min_ratio == 0.1);
    CHECK(s.warmup_steps == 20);
    CHECK(s.warmup_type == "log");
    CHECK(s.cos_min_ratio == 0.0001);
    Document d = q.doc(R"({"scheduler": {"type": "WarmupCosineLR", "params":
        {"total_num_steps": 500, "cos_min_ratio": 0.05}}})");
    CHECK(num_at(d, "schedule.cos_min_ratio") == 0.05);
    CHECK(int_at(d, "schedule.warmup_steps") == 1000);
    // The lr is the optimizer's (the quickstart's), not a schedule key.
    CHECK(num_at(d, "optimizer.lr") == q.base().plugin("optimizer").values["lr"].value_or(-1.0));
  }
  SECTION("OneCycle") {
    tessera::Job job = q.job(R"({"scheduler": {"type": "OneCycle", "params":
        {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01, "cycle_first_step_size": 100,
         "cycle_second_step_size": 200, "decay_lr_rate": 0.5, "decay_step_size": 10,
         "cycle_momentum": false}}})");
    const auto &s = job.settings.schedule;
    CHECK(s.type == "one_cycle");
    CHECK(s.cycle_min_lr == 0.001);
    CHECK(s.cycle_max_lr == 0.01);
    CHECK(s.cycle_first_step_size == 100);
    CHECK(s.cycle_second_step_size == 200);
    CHECK(s.decay_lr_rate == 0.5);
    CHECK(s.decay_step_size == 10);
    CHECK(any_warning(job.doc, "scheduler.params.cycle_momentum is not used"));
  }
  SECTION("the JSON's scheduler replaces the TOML's [schedule] wholesale; --set comes last") {
    std::string text = quickstart_text();
    size_t at = text.find("[schedule]\n");
    REQUIRE(at != std::string::npos);
    text.insert(at + 11, "decay_step_size = 3\n");
    q.toml = q.dir.write("quickstart.toml", text);
    std::string ds =
        q.json(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0}}})");
    Document before = tessera::load_document(q.options(""));
    REQUIRE(int_at(before, "schedule.decay_step_size") == 3);
    Document d = tessera::load_document(q.options(ds));
    CHECK(str_at(d, "schedule.type") == "one_cycle");
    CHECK(num_at(d, "schedule.cycle_min_lr") == 0.0);
    // Nothing of the TOML's [schedule] is left.
    CHECK(find(d.root(), "schedule")->as_table()->size() == 2);
    CHECK(find(d.root(), "schedule.decay_step_size") == nullptr);
    Document set = tessera::load_document(q.options(ds, {"schedule.cycle_min_lr=0.25"}));
    CHECK(num_at(set, "schedule.cycle_min_lr") == 0.25);
  }
  SECTION("typos, unknown types and bad values are errors") {
    Document d = q.doc(R"({"scheduler": {"type": "WarmupLR", "params":
        {"warmup_num_steps": 10, "last_batch_iteration": -1}}})");
    CHECK_FALSE(any_warning(d, "last_batch_iteration"));
    std::string ds = q.dir.file("ds.json");
    CHECK_THAT(q.doc_error(R"({"scheduler": {"type": "WarmupLR", "params":
        {"warmup_num_steps": 10, "warmup_num_step": 10}}})"),
               Catch::Contains("did you mean 'scheduler.params.warmup_num_steps'?"));
    std::string msg = q.doc_error(R"({"scheduler": {"type": "LRRangeTest", "params": {}}})");
    CHECK(msg.rfind(ds + ": scheduler.type: 'LRRangeTest' is not supported", 0) == 0);
    msg = q.doc_error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "x"}}})");
    CHECK(msg.rfind(ds + ": scheduler.params.warmup_max_lr: expected a number", 0) == 0);
    msg = q.job_error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": -5}}})");
    CHECK(msg.rfind(ds + ": scheduler.params.warmup_num_steps: ", 0) == 0);
    CHECK_THAT(msg, Catch::Contains("must be >= 0"));
    msg = q.doc_error(R"({"scheduler": {"type": "WarmupLR", "params": 3}})");
    CHECK(msg.rfind(ds + ": scheduler.params: expected an object", 0) == 0);
  }
}

// ---------------------------------------------------------------------------
// Precision, clipping, ZeRO, logging

TEST_CASE("DeepSpeed fp16 and bf16 set the precision and the loss scaler", "[config][deepspeed]") {
  Quickstart q;
  SECTION("fp16 with its scaler keys") {
    tessera::Job job = q.job(R"({"fp16": {"enabled": true, "loss_scale": 0,
        "initial_scale_power": 12, "loss_scale_window": 500, "hysteresis": 3,
        "min_loss_scale": 2}})");
    CHECK(job.settings.precision == "fp16");
    CHECK(job.settings.fp16.loss_scale == 0.0);
    CHECK(job.settings.fp16.initial_scale_power == 12.0);
    CHECK(job.settings.fp16.loss_scale_window == 500);
    CHECK(job.settings.fp16.hysteresis == 3);
    CHECK(job.settings.fp16.min_loss_scale == 2.0);
  }
  SECTION("fp16 with DeepSpeed's defaults") {
    tessera::Job job = q.job(R"({"fp16": {"enabled": true}})");
    CHECK(job.settings.precision == "fp16");
    CHECK(job.settings.fp16.initial_scale_power == 16.0);
    CHECK(job.settings.fp16.loss_scale_window == 1000);
    CHECK(job.settings.fp16.hysteresis == 2);
    CHECK(job.settings.fp16.min_loss_scale == 1.0);
    CHECK(job.settings.fp16.loss_scale == 0.0);
  }
  SECTION("a static loss scale") {
    tessera::Job job = q.job(R"({"fp16": {"enabled": true, "loss_scale": 128}})");
    CHECK(job.settings.fp16.loss_scale == 128.0);
  }
  SECTION("bf16, and its old name bfloat16") {
    CHECK(q.job(R"({"bf16": {"enabled": true}})").settings.precision == "bf16");
    CHECK(q.job(R"({"bfloat16": {"enabled": true}})").settings.precision == "bf16");
  }
  SECTION("disabled sections leave the TOML's precision") {
    CHECK(q.job(R"({"fp16": {"enabled": false}, "bf16": {}})").settings.precision ==
          q.base().settings.precision);
  }
  SECTION("errors and warnings") {
    std::string ds = q.dir.file("ds.json");
    std::string msg = q.doc_error(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})");
    CHECK(msg.rfind(ds + ": fp16/bf16: both are enabled", 0) == 0);
    msg = q.doc_error(R"({"fp16": {"enabled": "auto"}})");
    CHECK(msg.rfind(ds + ": fp16.enabled: expected true or false, got \"auto\"", 0) == 0);
    msg = q.doc_error(R"({"bf16": true})");
    CHECK(msg.rfind(ds + ": bf16: expected an object", 0) == 0);
    msg = q.job_error(R"({"fp16": {"enabled": true, "hysteresis": 0}})");
    CHECK(msg.rfind(ds + ": fp16.hysteresis: ", 0) == 0);
    CHECK_THAT(msg, Catch::Contains("must be >= 1"));
    Document d = q.doc(R"({"fp16": {"enabled": true, "auto_cast": false}})");
    CHECK(any_warning(d, "fp16.auto_cast is not used"));
  }
}

TEST_CASE("DeepSpeed gradient_clipping and steps_per_print", "[config][deepspeed]") {
  Quickstart q;
  tessera::Job job = q.job(R"({"gradient_clipping": 1.0, "steps_per_print": 25})");
  CHECK(job.settings.gradient_clipping == 1.0);
  CHECK(job.settings.log_every == 25);
  // An integer clip is fine too.
  CHECK(q.job(R"({"gradient_clipping": 2})").settings.gradient_clipping == 2.0);

  std::string ds = q.dir.file("ds.json");
  CHECK(q.doc_error(R"({"gradient_clipping": "1.0"})")
            .rfind(ds + ": gradient_clipping: expected a number", 0) == 0);
  std::string msg = q.job_error(R"({"gradient_clipping": -1})");
  CHECK(msg.rfind(ds + ": gradient_clipping: ", 0) == 0);
  CHECK_THAT(msg, Catch::Contains("must be >= 0"));
  CHECK(q.doc_error(R"({"steps_per_print": 0})")
            .rfind(ds + ": steps_per_print: expected a positive integer", 0) == 0);
  CHECK(q.doc_error(R"({"steps_per_print": 2.5})")
            .rfind(ds + ": steps_per_print: expected a positive integer", 0) == 0);
}

TEST_CASE("DeepSpeed zero_optimization picks the zero and offload plugins", "[config][deepspeed]") {
  Quickstart q;
  SECTION("stage 0 resolves to the stage0 plugin") {
    tessera::Job job = q.job(R"({"zero_optimization": {"stage": 0}})");
    CHECK(job.plugin("zero").entry->desc->name == std::string("stage0"));
  }
  SECTION("stages 1 to 3 name the stageN plugins") {
    for (int stage = 1; stage <= 3; ++stage) {
      Document d = q.doc(R"({"zero_optimization": {"stage": )" + std::to_string(stage) + "}}");
      CHECK(str_at(d, "zero.plugin") == "stage" + std::to_string(stage));
    }
  }
  SECTION("offload_optimizer.device") {
    Document cpu = q.doc(R"({"zero_optimization": {"stage": 2,
        "offload_optimizer": {"device": "cpu", "pin_memory": true}}})");
    CHECK(str_at(cpu, "offload.plugin") == "cpu");
    CHECK(any_warning(cpu, "zero_optimization.offload_optimizer.pin_memory is not used"));
    Document nvme = q.doc(R"({"zero_optimization":
        {"offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"}}})");
    CHECK(str_at(nvme, "offload.plugin") == "nvme");
    CHECK(str_at(nvme, "offload.path") == "/local_nvme");
    // Without stage, the TOML's zero plugin stays.
    CHECK(str_at(nvme, "zero.plugin") == str_at(q.doc("{}"), "zero.plugin"));
    tessera::Job none = q.job(R"({"zero_optimization": {"stage": 0,
        "offload_optimizer": {"device": "none"}}})");
    CHECK(none.plugin("offload").entry->desc->name == std::string("none"));
  }
  SECTION("offload_param.device maps onto offload.params") {
    Document cpu = q.doc(R"({"zero_optimization": {"stage": 3,
        "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu",
        "pin_memory": true, "max_in_cpu": 1e9}}})");
    CHECK(str_at(cpu, "offload.plugin") == "cpu");
    CHECK(str_at(cpu, "offload.params") == "cpu");
    CHECK(any_warning(cpu, "zero_optimization.offload_param.max_in_cpu is not used"));
    tessera::Job job = q.job(R"({"zero_optimization": {"stage": 3,
        "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}})");
    CHECK(job.plugin("offload").values["params"].value_or(std::string()) == "cpu");
    // Parameters without an optimizer offload take the backend of their device.
    Document alone = q.doc(R"({"zero_optimization": {"stage": 3,
        "offload_param": {"device": "cpu"}}})");
    CHECK(str_at(alone, "offload.plugin") == "cpu");
    // On NVMe they live in the nvme backend's files, with the optimizer state.
    Document nvme = q.doc(R"({"zero_optimization": {"stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"}}})");
    CHECK(str_at(nvme, "offload.plugin") == "nvme");
    CHECK(str_at(nvme, "offload.params") == "nvme");
    CHECK(str_at(nvme, "offload.path") == "/local_nvme");
    CHECK(any_warning(nvme, "so that goes to NVMe too"));
    Document none = q.doc(R"({"zero_optimization": {"stage": 3,
        "offload_param": {"device": "none"}}})");
    CHECK(find(none.root(), "offload.params") == nullptr);
    CHECK(q.doc_error(R"({"zero_optimization": {"offload_param": {"device": "gpu"}}})")
              .rfind(q.dir.file("ds.json") +
                         ": zero_optimization.offload_param.device: expected none, cpu or nvme",
                     0) == 0);
  }
  SECTION("bucket size and overlap map onto the zero plugin's keys") {
    Document d = q.doc(R"({"zero_optimization": {"stage": 2, "overlap_comm": false,
        "reduce_bucket_size": 5e8, "contiguous_gradients": true}})");
    // DeepSpeed counts elements; bucket_mb is MiB of fp32 gradients.
    CHECK(find(d.root(), "zero.bucket_mb")->value_or(0.0) == Approx(5e8 * 4 / 1048576.0));
    CHECK(find(d.root(), "zero.overlap_comm")->value_or(true) == false);
    CHECK(any_warning(d, "zero_optimization.contiguous_gradients is not used"));
    tessera::Job job = q.job(R"({"zero_optimization": {"stage": 2, "overlap_comm": true,
        "reduce_bucket_size": 1048576}})");
    CHECK(job.plugin("zero").entry->desc->name == std::string("stage2"));
    CHECK(job.plugin("zero").values["bucket_mb"].value_or(0.0) == Approx(4.0));
  }
  SECTION("bad values name the file and key") {
    std::string ds = q.dir.file("ds.json");
    CHECK(q.doc_error(R"({"zero_optimization": {"stage": 7}})")
              .rfind(ds + ": zero_optimization.stage: expected 0, 1, 2 or 3, got 7", 0) == 0);
    CHECK(q.doc_error(R"({"zero_optimization": {"stage": "2"}})")
              .rfind(ds + ": zero_optimization.stage: expected 0, 1, 2 or 3, got \"2\"", 0) == 0);
    CHECK(q.doc_error(R"({"zero_optimization": 2})")
              .rfind(ds + ": zero_optimization: expected an object", 0) == 0);
    CHECK(q.doc_error(R"({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}})")
              .rfind(ds + ": zero_optimization.offload_optimizer.device: expected none, cpu or "
                          "nvme, got 'gpu'",
                     0) == 0);
    CHECK(q.doc_error(R"({"zero_optimization": {"offload_optimizer": {"device": 1}}})")
              .rfind(ds + ": zero_optimization.offload_optimizer.device: expected", 0) == 0);
  }
}

TEST_CASE("wall_clock_breakdown maps onto log.breakdown", "[config][deepspeed]") {
  Quickstart q;
  CHECK_FALSE(q.base().settings.log_breakdown);
  tessera::Job on = q.job(R"({"wall_clock_breakdown": true})");
  CHECK(on.settings.log_breakdown);
  CHECK(on.doc.warnings().empty());
  CHECK_FALSE(q.job(R"({"wall_clock_breakdown": false})").settings.log_breakdown);
  CHECK(q.doc_error(R"({"wall_clock_breakdown": "yes"})")
            .rfind(q.dir.file("ds.json") + ": wall_clock_breakdown: expected true or false", 0) ==
        0);
}

}  // namespace unit_test_deepspeed_mapping
