// tessera ckpt inspect | verify | export: checkpoints without a run.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <tessera/cpp/half.hpp>

#include "ckpt/checkpoint.hpp"
#include "cli/args.hpp"
#include "config/settings.hpp"
#include "host/plugin_call.hpp"
#include "train/frozen_model.hpp"
#include "util/error.hpp"
#include "util/safetensors.hpp"
#include "util/text.hpp"

namespace fs = std::filesystem;

namespace tessera::cli {

namespace {

const char *kCkptUsage = R"(usage: tessera ckpt inspect PATH
       tessera ckpt verify PATH [--allow-nonfinite]
       tessera ckpt export PATH -o OUT [--dtype fp32|bf16] [--format auto|hf|tessera]
                           [--shard-size SIZE] [--merge | --lora-format peft]
                           [--plugin-path DIR]...

PATH is a checkpoint directory (step_NNNNNNNN) or a checkpoint root holding
'latest'.

inspect  step, world size, ZeRO stage, optimizer, files, parameters and sizes,
         and whether every checksum holds
verify   reads every file and tensor block against the manifest's checksums,
         each shard's own header against the manifest's places for its
         tensors, and every value of the weights and optimizer state (NaN
         or infinity is a problem unless --allow-nonfinite); exits 1 naming
         each damaged file and tensor
export   the master weights (fp32, or rounded to bf16), loadable without
         tessera. --format auto (default): a model whose plugin offers a
         Hugging Face export (built from the checkpoint's config to write it)
         gets it, others the tessera format.
           hf       the model plugin's own export. gpt2: OUT is a directory
                    for transformers' GPT2LMHeadModel.from_pretrained(OUT):
                    model.safetensors (wte trimmed to the real vocabulary)
                    and config.json; an OUT ending in .safetensors is written
                    as that file, with config.json beside it. llama: OUT is
                    a directory for AutoModelForCausalLM.from_pretrained:
                    config.json, model.safetensors or, past --shard-size
                    (default 5GB), model-0000k-of-0000n.safetensors with
                    model.safetensors.index.json, and the tokenizer files
                    of the model's init_from (or hf_config) directory
           tessera  one consolidated safetensors file OUT with the model's
                    own tensor names and shapes (what tessera eval --ckpt
                    FILE reads), LoRA adapters included
         A model with LoRA adapters (llama's lora.rank > 0): its Hugging
         Face export is the base model without them (a warning says so);
           --merge            folds them in: each adapted weight written as
                              W + (alpha/rank) B A, a full Hugging Face model
           --lora-format peft writes them alone to the directory OUT for
                              PEFT's PeftModel.from_pretrained onto the base:
                              adapter_config.json, adapter_model.safetensors
         --plugin-path DIR searches DIR for the model's plugin first
         (repeatable), as tessera run does.
)";

std::string resolve(const std::string &path) {
  std::string p = resolve_checkpoint(path, path);
  if (p.empty()) throw Error(TSR_ERR_IO, path + ": no checkpoint here");
  return p;
}

int inspect(const std::string &path) {
  std::string dir = resolve(path);
  nlohmann::json m = read_manifest(dir);
  std::printf("checkpoint %s\n", dir.c_str());
  std::printf("  step %lld (epoch %lld, %lld steps into it), %lld samples seen\n",
              m["step"].get<long long>(), m["epoch"].get<long long>(),
              m["batch_in_epoch"].get<long long>(), m["samples"].get<long long>());
  std::printf("  saved by %u ranks with %s, optimizer %s (%s), model %s\n",
              m["world_size"].get<unsigned>(), m["zero"].get<std::string>().c_str(),
              m["optimizer"].get<std::string>().c_str(), m["slots"].dump().c_str(),
              m["model"].get<std::string>().c_str());
  size_t total = 0;
  std::printf("  parameters:\n");
  for (const auto &p : m["params"]) {
    size_t n = 1;
    for (auto d : p["shape"]) n *= d.get<size_t>();
    total += n;
    std::printf("    %-28s %-18s %zu\n", p["name"].get<std::string>().c_str(),
                p["shape"].dump().c_str(), n);
  }
  std::printf("  %zu parameters in all\n  files:\n", total);
  for (const auto &f : m["files"])
    std::printf("    %-28s %10s  %zu tensors\n", f["name"].get<std::string>().c_str(),
                format_bytes(f["bytes"].get<double>()).c_str(), f["tensors"].size());
  std::vector<std::string> problems = verify_checkpoint(dir);
  std::printf("  checksums: %s\n",
              problems.empty() ? "all sound" : "DAMAGED (run tessera ckpt verify)");
  return problems.empty() ? 0 : 1;
}

int verify(const std::string &path, bool allow_nonfinite) {
  std::string dir = resolve(path);
  std::vector<std::string> problems = verify_checkpoint(dir, allow_nonfinite);
  for (const auto &p : problems) std::fprintf(stderr, "tessera ckpt verify: %s\n", p.c_str());
  if (problems.empty())
    std::printf("%s: every file and tensor block matches its checksum\n", dir.c_str());
  return problems.empty() ? 0 : 1;
}

// The Hugging Face export of a model that offers one (TSR_EXT_MODEL_EXPORT_HF):
// the model built from the checkpoint's config, handed each parameter's
// master weights. Returns false, having written nothing, when the model has
// none (or, with `quiet_missing`, when its plugin cannot be loaded or the
// model built here: the caller writes the tessera format instead).
bool export_by_model(const std::string &dir, const nlohmann::json &m,
                     const std::vector<float> &canonical, const std::string &out, bool bf16,
                     uint64_t shard_bytes, int64_t adapters,
                     const std::vector<std::string> &plugin_paths, bool quiet_missing) {
  const std::string manifest_path = (fs::path(dir) / "manifest.json").string();
  // The model's plugin, and the model itself, built here; with
  // quiet_missing a failure of either is a warning and the tessera format.
  std::optional<FrozenModel> built;
  const tsr_ext_model_export_hf *ext = nullptr;
  try {
    Job job = checkpoint_job(manifest_path, m.value("config", std::string()), plugin_paths);
    const PluginEntry &entry = *job.plugin("model").entry;
    ext = entry.caps.model.export_hf;  // null: the model has none
    if (!ext) return false;
    // Before ABI 1.8 a plugin does not read `adapters` and would write the
    // base model for a --merge.
    TSR_CHECK(adapters == TSR_EXPORT_BASE || entry.abi_major > 1 || entry.abi_minor >= 8,
              TSR_ERR_UNSUPPORTED,
              "model plugin '" + std::string(entry.desc->name) + "' (" + entry.file +
                  ") was built for ABI " + std::to_string(entry.abi_major) + "." +
                  std::to_string(entry.abi_minor) +
                  ", before adapter exports (--merge, --lora-format: ABI 1.8)");
    built.emplace(std::move(job), dir);
  } catch (const Error &e) {
    if (!quiet_missing) throw;
    spdlog::warn(
        "the checkpoint's model cannot be built here ({}): writing the tessera format "
        "(--format hf says what to fix)",
        error_for_user(e));
    return false;
  }
  FrozenModel &model = *built;
  // The model's parameters are the checkpoint's, in its order.
  const auto &params = m.at("params");
  const size_t n = model.vt->num_params(model.self);
  TSR_CHECK(n == params.size(), TSR_ERR_INVALID,
            manifest_path + " has " + std::to_string(params.size()) + " parameters; model '" +
                model.name + "' built from its config declares " + std::to_string(n) +
                " (config and checkpoint disagree)");
  std::vector<const float *> values(n);
  for (size_t i = 0; i < n; ++i) {
    tsr_param_info info{};
    info.struct_size = tsr_param_info_STRUCT_SIZE;
    plugin_ok(model.host(), model.vt->param_info(model.self, i, &info), "model", model.name,
              "param_info");
    const auto shape = params[i].at("shape").get<std::vector<int64_t>>();
    const std::string saved = params[i].at("name").get<std::string>();
    TSR_CHECK(
        saved == info.name && shape == std::vector<int64_t>(info.shape, info.shape + info.ndim),
        TSR_ERR_INVALID,
        manifest_path + ": parameter " + std::to_string(i) + " is '" + saved + "' " +
            params[i].at("shape").dump() + ", but model '" + model.name +
            "' built from its config declares '" + info.name + "' with another shape or name");
    size_t numel = 1;
    for (int64_t d : shape) numel *= static_cast<size_t>(d);
    const size_t off = params[i].at("canonical_offset").get<size_t>();
    TSR_CHECK(off + numel <= canonical.size(), TSR_ERR_INVALID,
              manifest_path + ": '" + std::string(info.name) + "' lies past the checkpoint's end");
    values[i] = canonical.data() + off;
  }
  std::string summary(4096, '\0');
  tsr_export_args a{};
  a.struct_size = tsr_export_args_STRUCT_SIZE;
  a.out = out.c_str();
  a.bf16 = bf16 ? 1 : 0;
  a.step = m.value("step", int64_t{0});
  a.num_params = n;
  a.params = values.data();
  a.summary = summary.data();
  a.summary_cap = summary.size();
  a.max_shard_bytes = shard_bytes;
  a.adapters = adapters;
  plugin_ok(model.host(), ext->write(model.self, &a), "model", model.name, "Hugging Face export");
  summary.resize(std::strlen(summary.c_str()));
  std::printf("exported from %s: %s\n", dir.c_str(), summary.c_str());
  return true;
}

// --merge / --lora-format as tsr_export_args.adapters (ABI 1.8).
int64_t adapters_option(const Parsed &p) {
  const bool merge = p.has("--merge"), lora = p.has("--lora-format");
  if (merge && lora)
    throw UsageError(
        "tessera ckpt export: --merge writes a full model, --lora-format peft the "
        "adapters alone; give one");
  if (lora && p.get("--lora-format") != "peft")
    throw UsageError("tessera ckpt export: --lora-format must be peft, got '" +
                     p.get("--lora-format") + "'");
  return merge ? TSR_EXPORT_MERGED : lora ? TSR_EXPORT_PEFT : TSR_EXPORT_BASE;
}

int export_ckpt(const std::string &path, const std::string &out, const std::string &dtype,
                const std::string &format, const std::string &shard_size, int64_t adapters,
                const std::vector<std::string> &plugin_paths) {
  if (out.empty()) throw UsageError("tessera ckpt export: -o OUT is required");
  if (dtype != "fp32" && dtype != "bf16")
    throw UsageError("tessera ckpt export: --dtype must be fp32 or bf16");
  if (format != "auto" && format != "hf" && format != "tessera")
    throw UsageError("tessera ckpt export: --format must be auto, hf or tessera");
  if (adapters != TSR_EXPORT_BASE && format == "tessera")
    throw UsageError(std::string("tessera ckpt export: ") +
                     (adapters == TSR_EXPORT_MERGED ? "--merge" : "--lora-format peft") +
                     " is a Hugging Face export; --format tessera writes every parameter, "
                     "adapters included, under the model's own names");
  const uint64_t shard_bytes = config::parse_bytes(shard_size, "tessera ckpt export --shard-size");
  if (!shard_size.empty() && shard_bytes == 0)
    throw UsageError("tessera ckpt export: --shard-size must be more than 0 bytes");
  std::string dir = resolve(path);
  nlohmann::json m = read_manifest(dir);
  std::vector<float> canonical;
  read_canonical_params(dir, &canonical, &m);
  if (format != "tessera") {
    if (export_by_model(dir, m, canonical, out, dtype == "bf16", shard_bytes, adapters,
                        plugin_paths, format == "auto" && adapters == TSR_EXPORT_BASE))
      return 0;
    if (format == "hf" || adapters != TSR_EXPORT_BASE)
      throw UsageError(std::string("tessera ckpt export: ") +
                       (format == "hf" ? "--format hf" : "--merge / --lora-format") + ": model '" +
                       m.value("model", "") +
                       "' has no Hugging Face export (its plugin offers no " +
                       TSR_EXT_MODEL_EXPORT_HF +
                       "); --format tessera writes its own names and "
                       "shapes");
  }
  std::vector<StTensor> tensors;
  std::vector<std::vector<uint16_t>> halves;
  size_t off = 0;
  for (const auto &p : m["params"]) {
    std::vector<int64_t> shape = p["shape"].get<std::vector<int64_t>>();
    size_t n = 1;
    for (auto d : shape) n *= static_cast<size_t>(d);
    if (dtype == "fp32") {
      tensors.push_back(StTensor{p["name"], "F32", shape, canonical.data() + off, n * 4});
    } else {
      halves.emplace_back(n);
      for (size_t i = 0; i < n; ++i) halves.back()[i] = sdk::float_to_bf16(canonical[off + i]);
      tensors.push_back(StTensor{p["name"], "BF16", shape, halves.back().data(), n * 2});
    }
    off += n;
  }
  safetensors_write(out, tensors,
                    {{"format", "pt"}, {"tessera_model", m["model"].get<std::string>()}});
  std::printf("exported %zu tensors (%s) from %s to %s\n", tensors.size(), dtype.c_str(),
              dir.c_str(), out.c_str());
  return 0;
}

int ckpt_body(const Parsed &p) {
  if (p.positional.size() != 2) throw UsageError("tessera ckpt: expected a subcommand and a PATH");
  const std::string &sub = p.positional[0], &path = p.positional[1];
  if (sub == "inspect") return inspect(path);
  if (sub == "verify") return verify(path, p.has("--allow-nonfinite"));
  if (sub == "export")
    return export_ckpt(path, p.get("-o", p.get("--output")), p.get("--dtype", "fp32"),
                       p.get("--format", "auto"), p.get("--shard-size"), adapters_option(p),
                       p.all("--plugin-path"));
  throw UsageError("tessera ckpt: unknown subcommand '" + sub + "' (inspect, verify, export)");
}

}  // namespace

int cmd_ckpt(const Args &args) {
  return run_command("ckpt", kCkptUsage, ckpt_body, args,
                     {{"-o", true, false},
                      {"--output", true, false},
                      {"--dtype", true, false},
                      {"--format", true, false},
                      {"--shard-size", true, false},
                      {"--merge", false, false},
                      {"--lora-format", true, false},
                      {"--plugin-path", true, true},
                      {"--allow-nonfinite", false, false},
                      {"--help", false, false},
                      {"-h", false, false}});
}

}  // namespace tessera::cli
