// Mapping of DeepSpeed JSON onto tessera's config.
#include "config/deepspeed.hpp"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "config/config.hpp"

namespace tessera::config {

namespace {

using json = nlohmann::json;

struct Mapper {
  Document &doc;
  std::string path;

  std::string origin(const std::string &key) const { return path + ": " + key; }

  [[noreturn]] void fail(const std::string &key, const std::string &why) const {
    throw ConfigError(path + ": " + key + ": " + why);
  }

  void put(const std::string &dotted, const json &v, const std::string &key) {
    if (v.is_boolean())
      doc.set(dotted, toml::value<bool>(v.get<bool>()), origin(key));
    else if (v.is_number_integer())
      doc.set(dotted, toml::value<int64_t>(v.get<int64_t>()), origin(key));
    else if (v.is_number())
      doc.set(dotted, toml::value<double>(v.get<double>()), origin(key));
    else if (v.is_string())
      doc.set(dotted, toml::value<std::string>(v.get<std::string>()), origin(key));
    else if (v.is_array()) {
      toml::array arr;
      for (const auto &e : v) {
        if (e.is_number_integer())
          arr.push_back(e.get<int64_t>());
        else if (e.is_number())
          arr.push_back(e.get<double>());
        else if (e.is_string())
          arr.push_back(e.get<std::string>());
        else
          fail(key, "arrays may hold numbers or strings only");
      }
      doc.set(dotted, std::move(arr), origin(key));
    } else {
      fail(key, "unsupported value " + v.dump());
    }
  }

  // A feature tessera lacks, written as switched off: what tessera does.
  static bool is_off(const std::string &k, const json &v) {
    if (v.is_null() || v == false) return true;
    if (v.is_object()) return v.empty() || (v.contains("enabled") && v["enabled"] == false);
    const bool size = k.size() > 5 && k.compare(k.size() - 5, 5, "_size") == 0;
    return v.is_number() && (v == 0 || (size && (v == 1 || v == -1)));
  }

  // Every key of `o`, DeepSpeed's section `name` at `at` in the JSON: one
  // tessera maps passes (its mapping checks the value), a tuning knob is
  // warned about, a feature tessera lacks is refused unless switched off,
  // and anything else is a typo, refused with the closest key.
  void check(const std::string &name, const std::string &at, const json &o) const {
    const DeepSpeedSection *s = deepspeed_section(name);
    if (!s || !o.is_object()) return;
    for (const auto &[k, v] : o.items()) {
      const std::string key = at.empty() ? k : at + "." + k;
      if (DeepSpeedSection::has(s->used, k)) continue;
      if (DeepSpeedSection::has(s->knobs, k)) {
        // activation_checkpointing's keys at false are what tessera does.
        if (at == "activation_checkpointing" && v == false) continue;
        doc.warn(path + ": " + (at.empty() ? "'" + k + "'" : key) +
                 " is not used by tessera; ignored");
        continue;
      }
      if (DeepSpeedSection::has(s->lacking, k)) {
        if (is_off(k, v)) continue;
        fail(key,
             "tessera does not have this DeepSpeed feature (docs/config.md, \"DeepSpeed "
             "JSON\"); remove it or switch it off, got " +
                 v.dump());
      }
      std::string msg = path + ": '" + key + "' is not a DeepSpeed config key";
      const std::string dym = did_you_mean(k, s->all());
      msg += dym.empty() ? " (docs/config.md, \"DeepSpeed JSON\", lists the keys tessera maps)"
                         : "; did you mean '" + (at.empty() ? dym : at + "." + dym) + "'?";
      throw ConfigError(msg);
    }
  }

  void need_number(const json &v, const std::string &key) const {
    if (!v.is_number()) fail(key, "expected a number, got " + v.dump());
  }

  void batch(const json &j) {
    bool any = j.contains("train_batch_size") || j.contains("train_micro_batch_size_per_gpu") ||
               j.contains("gradient_accumulation_steps");
    if (!any) return;
    doc.erase("batch");
    if (j.contains("train_batch_size")) {
      need_number(j["train_batch_size"], "train_batch_size");
      put("batch.global", j["train_batch_size"], "train_batch_size");
    }
    if (j.contains("train_micro_batch_size_per_gpu")) {
      need_number(j["train_micro_batch_size_per_gpu"], "train_micro_batch_size_per_gpu");
      put("batch.micro", j["train_micro_batch_size_per_gpu"], "train_micro_batch_size_per_gpu");
    }
    if (j.contains("gradient_accumulation_steps")) {
      need_number(j["gradient_accumulation_steps"], "gradient_accumulation_steps");
      put("batch.accumulation", j["gradient_accumulation_steps"], "gradient_accumulation_steps");
    }
  }

  void optimizer(const json &o) {
    if (!o.is_object() || !o.contains("type") || !o["type"].is_string())
      fail("optimizer", "expected {\"type\": \"Adam\", \"params\": {...}}");
    check("optimizer", "optimizer", o);
    std::string type = o["type"];
    std::string lower;
    for (char c : type) lower.push_back(static_cast<char>(std::tolower(c)));
    json params = o.value("params", json::object());
    if (!params.is_object()) fail("optimizer.params", "expected an object");
    doc.erase("optimizer");
    std::set<std::string> keys;
    if (lower == "sgd") {
      doc.set("optimizer.plugin", toml::value<std::string>("sgd"), origin("optimizer.type"));
      keys = {"lr", "momentum", "dampening", "nesterov", "weight_decay"};
    } else if (lower == "adam" || lower == "adamw") {
      doc.set("optimizer.plugin", toml::value<std::string>("adam"), origin("optimizer.type"));
      // DeepSpeed's Adam defaults to decoupled decay (adam_w_mode = true);
      // torch_adam / adam_w_mode false gives torch.optim.Adam's L2.
      if (params.contains("adam_w_mode") && !params["adam_w_mode"].is_boolean())
        fail("optimizer.params.adam_w_mode",
             "expected true or false, got " + params["adam_w_mode"].dump());
      bool adamw = lower == "adamw" ? true : params.value("adam_w_mode", true);
      doc.set("optimizer.adamw", toml::value<bool>(adamw), origin("optimizer.params.adam_w_mode"));
      keys = {"lr", "betas", "eps", "weight_decay"};
      // DeepSpeed's FusedAdam defaults weight_decay to 0 for both modes.
      if (!params.contains("weight_decay"))
        doc.set("optimizer.weight_decay", toml::value<double>(0.0),
                origin("optimizer (DeepSpeed default weight_decay)"));
    } else {
      fail("optimizer.type", "'" + type + "' is not supported (SGD, Adam, AdamW)");
    }
    if (params.contains("amsgrad") && params["amsgrad"] == true)
      fail("optimizer.params.amsgrad",
           "AMSGrad is not supported by tessera's adam; remove it or set false");
    if (lower != "sgd" && params.contains("bias_correction") && params["bias_correction"] != true)
      fail("optimizer.params.bias_correction",
           "tessera's adam always corrects the moments' bias; remove it or set true, got " +
               params["bias_correction"].dump());
    check(std::string("optimizer.params:") + (lower == "sgd" ? "sgd" : "adam"), "optimizer.params",
          params);
    for (const auto &[k, v] : params.items())
      if (keys.count(k)) put("optimizer." + k, v, "optimizer.params." + k);
  }

  void scheduler(const json &s) {
    if (!s.is_object() || !s.contains("type") || !s["type"].is_string())
      fail("scheduler", "expected {\"type\": \"WarmupLR\", \"params\": {...}}");
    check("scheduler", "scheduler", s);
    std::string type = s["type"];
    json p = s.value("params", json::object());
    if (!p.is_object()) fail("scheduler.params", "expected an object");
    check("scheduler.params:" + type, "scheduler.params", p);  // none for unknown types
    doc.erase("schedule");
    auto set_if = [&](const char *ds, const char *ours) {
      if (p.contains(ds))
        put(std::string("schedule.") + ours, p[ds], std::string("scheduler.params.") + ds);
    };
    auto set_str = [&](const std::string &k, const std::string &v) {
      doc.set("schedule." + k, toml::value<std::string>(v), origin("scheduler.type"));
    };
    // DeepSpeed's warmup ramps are logarithmic unless told otherwise.
    auto set_warmup_type = [&]() {
      if (p.contains("warmup_type"))
        set_if("warmup_type", "warmup_type");
      else
        doc.set("schedule.warmup_type", toml::value<std::string>("log"),
                origin("scheduler default warmup_type"));
    };
    if (type == "WarmupLR" || type == "WarmupDecayLR") {
      set_str("type", type == "WarmupLR" ? "warmup" : "warmup_decay");
      set_warmup_type();
      set_if("warmup_min_lr", "warmup_min_lr");
      set_if("warmup_num_steps", "warmup_steps");
      if (!p.contains("warmup_num_steps"))
        doc.set("schedule.warmup_steps", toml::value<int64_t>(1000), origin("scheduler default"));
      if (type == "WarmupDecayLR") set_if("total_num_steps", "total_steps");
      // The peak of the ramp is the optimizer's lr. Without warmup_max_lr,
      // WarmupLR keeps the optimizer's lr and WarmupDecayLR peaks at 0.001.
      if (p.contains("warmup_max_lr")) {
        need_number(p["warmup_max_lr"], "scheduler.params.warmup_max_lr");
        put("optimizer.lr", p["warmup_max_lr"], "scheduler.params.warmup_max_lr");
      } else if (type == "WarmupDecayLR") {
        doc.set("optimizer.lr", toml::value<double>(0.001),
                origin("scheduler (DeepSpeed default warmup_max_lr)"));
      }
    } else if (type == "WarmupCosineLR") {
      set_str("type", "warmup_cosine");
      set_warmup_type();
      set_if("warmup_min_ratio", "warmup_min_ratio");
      set_if("warmup_num_steps", "warmup_steps");
      if (!p.contains("warmup_num_steps"))
        doc.set("schedule.warmup_steps", toml::value<int64_t>(1000), origin("scheduler default"));
      set_if("total_num_steps", "total_steps");
      set_if("cos_min_ratio", "cos_min_ratio");
      if (!p.contains("cos_min_ratio"))
        doc.set("schedule.cos_min_ratio", toml::value<double>(0.0001),
                origin("scheduler default cos_min_ratio"));
    } else if (type == "OneCycle") {
      set_str("type", "one_cycle");
      set_if("cycle_min_lr", "cycle_min_lr");
      set_if("cycle_max_lr", "cycle_max_lr");
      set_if("cycle_first_step_size", "cycle_first_step_size");
      set_if("cycle_second_step_size", "cycle_second_step_size");
      set_if("decay_lr_rate", "decay_lr_rate");
      set_if("decay_step_size", "decay_step_size");
    } else {
      fail("scheduler.type",
           "'" + type + "' is not supported (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle)");
    }
  }

  void precision(const json &j) {
    auto enabled = [&](const std::string &sec) {
      if (!j.contains(sec)) return false;
      const json &o = j[sec];
      if (!o.is_object()) fail(sec, "expected an object like {\"enabled\": true}");
      check(sec, sec, o);
      if (!o.contains("enabled")) return false;
      if (!o["enabled"].is_boolean())
        fail(sec + ".enabled", "expected true or false, got " + o["enabled"].dump());
      return o["enabled"].get<bool>();
    };
    bool fp16 = enabled("fp16");
    bool bf16 = enabled("bf16") || enabled("bfloat16");
    if (fp16 && bf16) fail("fp16/bf16", "both are enabled; pick one");
    if (fp16) {
      doc.set("run.precision", toml::value<std::string>("fp16"), origin("fp16.enabled"));
      const json &f = j["fp16"];
      if (f.contains("loss_scale")) put("fp16.loss_scale", f["loss_scale"], "fp16.loss_scale");
      if (f.contains("initial_scale_power"))
        put("fp16.initial_scale_power", f["initial_scale_power"], "fp16.initial_scale_power");
      if (f.contains("loss_scale_window"))
        put("fp16.loss_scale_window", f["loss_scale_window"], "fp16.loss_scale_window");
      if (f.contains("hysteresis")) put("fp16.hysteresis", f["hysteresis"], "fp16.hysteresis");
      if (f.contains("min_loss_scale"))
        put("fp16.min_loss_scale", f["min_loss_scale"], "fp16.min_loss_scale");
    } else if (bf16) {
      doc.set("run.precision", toml::value<std::string>("bf16"), origin("bf16.enabled"));
    }
  }

  // offload_param (ZeRO-Infinity): the offload backend keeps the
  // parameters too (offload.params). tessera keeps them with the optimizer
  // state's backend, so parameters on NVMe take the nvme backend, and
  // offloaded parameters without an optimizer offload take the backend of
  // their device.
  void offload_param(const json &o) {
    const std::string key = "zero_optimization.offload_param";
    if (!o.is_object()) fail(key, "expected an object");
    if (o.contains("device") && !o["device"].is_string())
      fail(key + ".device", "expected \"none\", \"cpu\" or \"nvme\", got " + o["device"].dump());
    const std::string dev = o.value("device", std::string("none"));
    if (dev != "none" && dev != "cpu" && dev != "nvme")
      fail(key + ".device", "expected none, cpu or nvme, got '" + dev + "'");
    check(key, key, o);
    if (dev == "none") return;
    std::string backend =
        doc.root().at_path("offload.plugin").value<std::string>().value_or("none");
    if (backend != dev && (dev == "nvme" || backend == "none")) {
      if (backend != "none")
        doc.warn(path + ": " + key + ".device = \"nvme\": tessera keeps offloaded parameters " +
                 "with the optimizer state, so that goes to NVMe too (offload.plugin = \"nvme\")");
      doc.set("offload.plugin", toml::value<std::string>(dev), origin(key + ".device"));
      backend = dev;
    }
    doc.set("offload.params", toml::value<std::string>(dev), origin(key + ".device"));
    if (dev == "nvme" && o.contains("nvme_path") && !doc.root().at_path("offload.path"))
      put("offload.path", o["nvme_path"], key + ".nvme_path");
  }

  void zero(const json &z) {
    if (!z.is_object()) fail("zero_optimization", "expected an object");
    check("zero_optimization", "zero_optimization", z);
    if (z.contains("stage")) {
      if (!z["stage"].is_number_integer() || z["stage"].get<int64_t>() < 0 ||
          z["stage"].get<int64_t>() > 3)
        fail("zero_optimization.stage", "expected 0, 1, 2 or 3, got " + z["stage"].dump());
      doc.erase("zero");
      doc.set("zero.plugin",
              toml::value<std::string>("stage" + std::to_string(z["stage"].get<int64_t>())),
              origin("zero_optimization.stage"));
    }
    if (z.contains("offload_optimizer")) {
      const json &o = z["offload_optimizer"];
      if (!o.is_object()) fail("zero_optimization.offload_optimizer", "expected an object");
      check("zero_optimization.offload_optimizer", "zero_optimization.offload_optimizer", o);
      if (o.contains("device") && !o["device"].is_string())
        fail("zero_optimization.offload_optimizer.device",
             "expected \"none\", \"cpu\" or \"nvme\", got " + o["device"].dump());
      std::string dev = o.value("device", std::string("none"));
      if (dev != "none" && dev != "cpu" && dev != "nvme")
        fail("zero_optimization.offload_optimizer.device",
             "expected none, cpu or nvme, got '" + dev + "'");
      doc.erase("offload");
      doc.set("offload.plugin", toml::value<std::string>(dev),
              origin("zero_optimization.offload_optimizer.device"));
      if (dev == "nvme" && o.contains("nvme_path"))
        put("offload.path", o["nvme_path"], "zero_optimization.offload_optimizer.nvme_path");
      // ratio: DeepSpeed's share of the optimizer state kept on the GPU;
      // offload cpu's `ratio` says the same (as text, so "auto" fits too).
      if (dev == "cpu" && o.contains("ratio")) {
        const json &r = o["ratio"];
        if (!(r.is_number() || (r.is_string() && r.get<std::string>() == "auto")))
          fail("zero_optimization.offload_optimizer.ratio",
               "expected a number from 0 to 1 or \"auto\", got " + r.dump());
        const std::string text = r.is_string() ? r.get<std::string>() : r.dump();
        doc.set("offload.ratio", toml::value<std::string>(text),
                origin("zero_optimization.offload_optimizer.ratio"));
      }
      if (o.contains("ratio") && dev != "cpu")
        doc.warn(path +
                 ": zero_optimization.offload_optimizer.ratio is used with device \"cpu\" "
                 "only; ignored");
    }
    if (z.contains("offload_param")) offload_param(z["offload_param"]);
    // Bucket size: DeepSpeed counts elements; ours is MiB of fp32 gradients.
    if (z.contains("reduce_bucket_size")) {
      const json &b = z["reduce_bucket_size"];
      if (!b.is_number() || b.get<double>() <= 0)
        fail("zero_optimization.reduce_bucket_size", "expected a positive number of elements");
      doc.set("zero.bucket_mb", toml::value<double>(b.get<double>() * 4.0 / 1048576.0),
              origin("zero_optimization.reduce_bucket_size"));
    }
    if (z.contains("overlap_comm")) {
      if (!z["overlap_comm"].is_boolean())
        fail("zero_optimization.overlap_comm", "expected true or false");
      doc.set("zero.overlap_comm", toml::value<bool>(z["overlap_comm"].get<bool>()),
              origin("zero_optimization.overlap_comm"));
    }
    if (z.contains("stage3_prefetch_bucket_size") &&
        !(z["stage3_prefetch_bucket_size"].is_number() && z.value("stage", 0) == 3))
      doc.warn(path +
               ": zero_optimization.stage3_prefetch_bucket_size applies to stage 3 only; ignored");
    if (z.contains("stage3_prefetch_bucket_size") && z["stage3_prefetch_bucket_size"].is_number() &&
        z.value("stage", 0) == 3)
      doc.set("zero.prefetch",
              toml::value<bool>(z["stage3_prefetch_bucket_size"].get<double>() > 0),
              origin("zero_optimization.stage3_prefetch_bucket_size"));
  }

  // DeepSpeed's monitor outputs, onto [monitor.tensorboard] and
  // [monitor.csv_monitor]; W&B and Comet, enabled, are refused there.
  void monitor(const json &j) {
    for (const char *k : {"tensorboard", "csv_monitor", "wandb", "comet"}) {
      if (!j.contains(k)) continue;
      const json &o = j[k];
      const std::string key = k, to = "monitor." + key;
      if (!o.is_object())
        fail(key,
             "expected an object like {\"enabled\": true, \"output_path\": \"logs/\", "
             "\"job_name\": \"run1\"}");
      check(key, key, o);
      if (o.contains("enabled") && !o["enabled"].is_boolean())
        fail(key + ".enabled", "expected true or false, got " + o["enabled"].dump());
      if (key == "wandb" || key == "comet") {
        // Only `enabled` matters: the section is refused when it is true.
        if (o.value("enabled", false)) put(to + ".enabled", o["enabled"], key + ".enabled");
        continue;
      }
      doc.erase(to);
      for (const auto &[f, v] : o.items()) {
        if (f != "enabled" && !v.is_string())
          fail(key + "." + f, "expected a string, got " + v.dump());
        put(to + "." + f, v, key + "." + f);
      }
      // DeepSpeed's default job name, so the files land where its would.
      if (!o.contains("job_name"))
        doc.set(to + ".job_name", toml::value<std::string>("DeepSpeedJobName"),
                origin(key + " (DeepSpeed default job_name)"));
    }
  }

  // DeepSpeed checkpoints activations where the model's code asks for it;
  // the section says the model should. Here that is the model plugin's
  // boolean `recompute` (docs/writing-a-model.md), set only where the
  // chosen model declares it: for another the key is dropped with a
  // warning (Document::take_undeclared), not refused as a typo.
  void activation_checkpointing(const json &a) {
    if (!a.is_object())
      fail("activation_checkpointing",
           "expected an object like {\"partition_activations\": false}");
    // Model parallelism, CPU copies and profiling of the checkpoints: false
    // is what tessera does anyway, anything else is not done (check()).
    check("activation_checkpointing", "activation_checkpointing", a);
    doc.set_if_declared("model.recompute", toml::value<bool>(true),
                        origin("activation_checkpointing"), "activation checkpointing");
  }

  void apply(const json &j) {
    if (!j.is_object()) throw ConfigError(path + ": a DeepSpeed config must be a JSON object");
    // A value of the wrong JSON type deep inside a section (e.g. "enabled":
    // "auto") surfaces as nlohmann's type_error: name the file and section.
    auto guarded = [&](const char *key, auto &&fn) {
      try {
        fn();
      } catch (const json::exception &e) {
        fail(key, std::string("unexpected value: ") + e.what());
      }
    };
    check("", "", j);  // typos first, before anything is mapped
    batch(j);
    if (j.contains("optimizer")) guarded("optimizer", [&] { optimizer(j["optimizer"]); });
    if (j.contains("scheduler")) guarded("scheduler", [&] { scheduler(j["scheduler"]); });
    guarded("fp16/bf16", [&] { precision(j); });
    if (j.contains("gradient_clipping")) {
      need_number(j["gradient_clipping"], "gradient_clipping");
      doc.set("run.gradient_clipping", toml::value<double>(j["gradient_clipping"].get<double>()),
              origin("gradient_clipping"));
    }
    if (j.contains("zero_optimization"))
      guarded("zero_optimization", [&] { zero(j["zero_optimization"]); });
    if (j.contains("steps_per_print")) {
      if (!j["steps_per_print"].is_number_integer() || j["steps_per_print"].get<int64_t>() < 1)
        fail("steps_per_print", "expected a positive integer");
      put("run.log_every", j["steps_per_print"], "steps_per_print");
    }
    if (j.contains("wall_clock_breakdown")) {
      if (!j["wall_clock_breakdown"].is_boolean())
        fail("wall_clock_breakdown", "expected true or false");
      put("log.breakdown", j["wall_clock_breakdown"], "wall_clock_breakdown");
    }
    guarded("monitor", [&] { monitor(j); });
    if (j.contains("activation_checkpointing"))
      activation_checkpointing(j["activation_checkpointing"]);
    if (j.contains("optimizer") && !j.contains("scheduler")) say_which_schedule();
  }

  // DeepSpeed without a "scheduler" keeps the rate constant; a [schedule]
  // of the TOML underneath still applies here, so say which one.
  void say_which_schedule() {
    const toml::node *t = find(doc.root(), "schedule.type");
    const std::string type = t ? t->value_or(std::string()) : std::string();
    if (type.empty() || type == "constant") return;
    const toml::node *w = find(doc.root(), "schedule.warmup_steps");
    std::string what = "'" + type + "'";
    if (w && w->is_integer()) what += " (warmup_steps " + std::to_string(w->value_or(0)) + ")";
    doc.warn(path + " sets an optimizer but no scheduler: the learning rate follows the " +
             doc.where("schedule.type", t) + " [schedule] " + what +
             ", where DeepSpeed would keep it constant; add --set schedule.type=constant (or a "
             "\"scheduler\" to the JSON) to match DeepSpeed");
  }
};

}  // namespace

namespace {

// Parses `text`, refusing a key given twice in one object (nlohmann, as
// Python's json that DeepSpeed reads with, keeps the last silently): the
// parser's callback sees each object open, each key and each close.
json parse_strict(const std::string &text, const std::string &path) {
  struct Open {
    std::string at;  // dotted path of this object ("" at the top)
    std::set<std::string> keys;
    bool object;
  };
  std::vector<Open> open;
  std::string last_key;  // the key whose value comes next
  auto child = [&]() {
    if (open.empty()) return std::string();
    const Open &p = open.back();
    if (!p.object) return p.at;  // an array's elements share its path
    return p.at.empty() ? last_key : p.at + "." + last_key;
  };
  json::parser_callback_t cb = [&](int, json::parse_event_t ev, json &parsed) {
    switch (ev) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        open.push_back({child(), {}, ev == json::parse_event_t::object_start});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!open.empty()) open.pop_back();
        break;
      case json::parse_event_t::key:
        last_key = parsed.get<std::string>();
        if (!open.empty() && !open.back().keys.insert(last_key).second)
          throw ConfigError(path + ": '" + child() +
                            "' is given twice; DeepSpeed would silently take the last");
        break;
      default:
        break;
    }
    return true;
  };
  return json::parse(text, cb);
}

}  // namespace

void deepspeed_apply(Document &doc, const std::string &path) {
  const std::string text = read_config_file(path, "DeepSpeed config");
  json j;
  try {
    j = parse_strict(text, path);
  } catch (const json::parse_error &e) {
    throw ConfigError(path + ": invalid JSON: " + e.what());
  }
  try {
    Mapper{doc, path}.apply(j);
  } catch (const json::exception &e) {
    // A field of the wrong JSON type that no check above names.
    throw ConfigError(path + ": a field has the wrong type: " + e.what());
  }
}

}  // namespace tessera::config
