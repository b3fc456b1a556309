// LoRA in the llama plugin's Hugging Face export (`tessera ckpt export`):
// which form the host asked for (ABI 1.8's tsr_export_args.adapters), an
// adapted weight with its adapter folded in (W + s B A, for --merge), and
// the adapters alone as the directory PEFT's PeftModel.from_pretrained
// loads onto the base model (--lora-format peft): adapter_config.json with
// LoraConfig's fields and adapter_model.safetensors with PEFT's names,
//   base_model.model.model.layers.<l>.self_attn.q_proj.lora_A.weight [r, in]
//   base_model.model.model.layers.<l>.self_attn.q_proj.lora_B.weight [out, r]
#include <cstddef>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <tessera/cpp/formats/safetensors.hpp>
#include <tessera/cpp/half.hpp>
#include <tessera/cpp/synced_file.hpp>
#include <vector>

#include "llama.hpp"

namespace tessera::llama {

namespace {

namespace fs = std::filesystem;
namespace st = formats::safetensors;
using nlohmann::json;

size_t numel(const tsr_param_info &p) {
  size_t n = 1;
  for (int32_t k = 0; k < p.ndim; ++k) n *= static_cast<size_t>(p.shape[k]);
  return n;
}

const float *values_of(const Llama &m, const tsr_export_args &args, size_t i) {
  if (!args.params[i])
    throw Error(TSR_ERR_INVALID, std::string("llama export: no values for ") + m.infos[i].name);
  return args.params[i];
}

// LoraConfig's fields as PEFT's save_pretrained writes them (inference_mode
// true), those every PEFT release since DoRA (0.9) reads.
json adapter_config(const Llama &m) {
  const Lora &lo = m.lora;
  json targets = json::array();
  for (uint32_t t = 0; t < kLoraTargets; ++t)
    if (lo.on[t]) targets.push_back(kLoraModules[t]);
  const bool whole = lo.alpha == static_cast<double>(static_cast<int64_t>(lo.alpha));
  return {
      {"alpha_pattern", json::object()},
      {"auto_mapping", nullptr},
      {"base_model_name_or_path", m.source_dir.empty() ? json(nullptr) : json(m.source_dir)},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"layers_pattern", nullptr},
      {"layers_to_transform", nullptr},
      {"lora_alpha", whole ? json(static_cast<int64_t>(lo.alpha)) : json(lo.alpha)},
      {"lora_dropout", lo.dropout},
      {"modules_to_save", nullptr},
      {"peft_type", "LORA"},
      {"r", lo.rank},
      {"rank_pattern", json::object()},
      {"revision", nullptr},
      {"target_modules", targets},
      {"task_type", "CAUSAL_LM"},
      {"use_dora", false},
      {"use_rslora", false},
  };
}

fs::path peft_dir(const std::string &out) {
  if (out.ends_with(".safetensors"))
    throw Error(TSR_ERR_INVALID, "llama export --lora-format peft: -o " + out +
                                     " names a file; PEFT's adapter is a directory "
                                     "(adapter_config.json, adapter_model.safetensors)");
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec))
    throw Error(TSR_ERR_IO, "llama export --lora-format peft: " + out +
                                " is a file; -o names the adapter's directory");
  fs::create_directories(out, ec);
  if (ec) throw Error(TSR_ERR_IO, "llama export: " + out + ": cannot create: " + ec.message());
  return fs::path(out);
}

}  // namespace

int64_t export_adapters(const Llama &m, const tsr_export_args &args) {
  const int64_t mode =
      args.struct_size >= offsetof(tsr_export_args, adapters) + sizeof(args.adapters)
          ? args.adapters
          : TSR_EXPORT_BASE;  // a host before ABI 1.8
  if (mode != TSR_EXPORT_BASE && mode != TSR_EXPORT_MERGED && mode != TSR_EXPORT_PEFT)
    throw Error(TSR_ERR_INVALID, "llama export: adapters = " + std::to_string(mode) +
                                     " is none of TSR_EXPORT_BASE, _MERGED, _PEFT");
  if (mode != TSR_EXPORT_BASE && !m.lora.enabled())
    throw Error(TSR_ERR_INVALID,
                std::string("llama export: ") +
                    (mode == TSR_EXPORT_MERGED ? "--merge" : "--lora-format peft") +
                    ": the checkpoint's model has no LoRA adapters (model.lora.rank = 0); "
                    "export it without the flag");
  return mode;
}

const float *lora_export_values(const Llama &m, const tsr_export_args &args, size_t i,
                                std::vector<float> &scratch) {
  const float *w = values_of(m, args, i);
  if (!m.lora.enabled() || export_adapters(m, args) != TSR_EXPORT_MERGED) return w;
  for (uint32_t l = 0; l < m.L(); ++l)
    for (uint32_t t = 0; t < kLoraTargets; ++t) {
      if (!m.lora.on[t] || m.P(l, kLoraBase[t]) != i) continue;
      // W + s B A through the ops' matmul (the CPU's: the export's
      // instance is built there).
      const uint32_t ia = m.lora.index[l][t][0], ib = m.lora.index[l][t][1];
      const tsr_param_info &p = m.infos[i];
      scratch.assign(w, w + numel(p));
      const DLDevice cpu{kDLCPU, 0};
      const int64_t r = m.lora.rank;
      View a(const_cast<float *>(values_of(m, args, ia)), 0, cpu, sdk::dtype_f32(),
             {r, p.shape[1]});
      View b(const_cast<float *>(values_of(m, args, ib)), 0, cpu, sdk::dtype_f32(),
             {p.shape[0], r});
      View merged(scratch.data(), 0, cpu, sdk::dtype_f32(), {p.shape[0], p.shape[1]});
      check(m.ops->matmul(m.host->ctx, b.get(), 0, a.get(), 0, merged.get(), m.lora.scale, 1.0f));
      return scratch.data();
    }
  return w;
}

void lora_write_peft(const Llama &m, const tsr_export_args &args) {
  const fs::path dir = peft_dir(args.out);
  const bool bf16 = args.bf16 != 0;
  std::vector<st::Tensor> tensors;
  std::vector<std::vector<uint16_t>> halves;
  halves.reserve(m.infos.size());
  for (size_t i = 0; i < m.infos.size(); ++i) {
    if (!m.lora.is_adapter(i)) continue;
    const tsr_param_info &p = m.infos[i];
    const std::string name = "base_model.model." + std::string(p.name);  // PEFT's state dict
    const std::vector<int64_t> shape(p.shape, p.shape + p.ndim);
    const size_t n = numel(p);
    const float *v = values_of(m, args, i);
    if (!bf16) {
      tensors.push_back(st::Tensor{name, "F32", shape, v, n * 4});
    } else {
      halves.emplace_back(n);
      for (size_t j = 0; j < n; ++j) halves.back()[j] = sdk::float_to_bf16(v[j]);
      tensors.push_back(st::Tensor{name, "BF16", shape, halves.back().data(), n * 2});
    }
  }
  const fs::path weights = dir / "adapter_model.safetensors", config = dir / "adapter_config.json";
  st::write(
      weights.string(), tensors,
      {{"format", "pt"}, {"tessera_model", "llama"}, {"tessera_step", std::to_string(args.step)}});
  sdk::write_file_synced(config, adapter_config(m).dump(2) + "\n");
  export_summary(args, std::to_string(tensors.size()) + " LoRA tensors (" +
                           (bf16 ? "bf16" : "fp32") + ", rank " + std::to_string(m.lora.rank) +
                           " on " + m.lora.targets_text() +
                           ") as a PEFT adapter: " + weights.string() + ", " + config.string() +
                           " (load with PeftModel.from_pretrained onto the base model)");
}

}  // namespace tessera::llama
