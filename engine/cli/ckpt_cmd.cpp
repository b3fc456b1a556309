// tessera ckpt inspect | verify | export: checkpoints without a run.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "ckpt/checkpoint.hpp"
#include "ckpt/export_hf.hpp"
#include "cli/args.hpp"
#include "util/error.hpp"
#include "util/safetensors.hpp"

namespace fs = std::filesystem;

namespace tessera::cli {

namespace {

const char *kCkptUsage = R"(usage: tessera ckpt inspect PATH
       tessera ckpt verify PATH
       tessera ckpt export PATH -o OUT [--dtype fp32|bf16] [--format auto|hf|tessera]

PATH is a checkpoint directory (step_NNNNNNNN) or a checkpoint root holding
'latest'.

inspect  step, world size, ZeRO stage, optimizer, files, parameters and sizes,
         and whether every checksum holds
verify   reads every file and tensor block against the manifest's checksums;
         exits 1 naming each damaged file and tensor
export   the master weights (fp32, or rounded to bf16), loadable without
         tessera. --format auto (default): a model with a Hugging Face export
         gets it, others the tessera format.
           hf       gpt2: OUT is a directory for transformers'
                    GPT2LMHeadModel.from_pretrained(OUT): model.safetensors
                    (wte trimmed to the real vocabulary) and config.json; an
                    OUT ending in .safetensors is written as that file, with
                    config.json beside it
           tessera  one consolidated safetensors file OUT with the model's
                    own tensor names and shapes (what tessera eval --ckpt
                    FILE reads)
)";

std::string resolve(const std::string &path) {
  std::string p = resolve_checkpoint(path, path);
  if (p.empty()) throw Error(TSR_ERR_IO, path + ": no checkpoint here");
  return p;
}

std::string human_bytes(double b) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", b, units[u]);
  return buf;
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
                human_bytes(f["bytes"].get<double>()).c_str(), f["tensors"].size());
  std::vector<std::string> problems = verify_checkpoint(dir);
  std::printf("  checksums: %s\n",
              problems.empty() ? "all sound" : "DAMAGED (run tessera ckpt verify)");
  return problems.empty() ? 0 : 1;
}

int verify(const std::string &path) {
  std::string dir = resolve(path);
  std::vector<std::string> problems = verify_checkpoint(dir);
  for (const auto &p : problems) std::fprintf(stderr, "tessera ckpt verify: %s\n", p.c_str());
  if (problems.empty())
    std::printf("%s: every file and tensor block matches its checksum\n", dir.c_str());
  return problems.empty() ? 0 : 1;
}

int export_ckpt(const std::string &path, const std::string &out, const std::string &dtype,
                const std::string &format) {
  if (out.empty()) throw UsageError("tessera ckpt export: -o OUT is required");
  if (dtype != "fp32" && dtype != "bf16")
    throw UsageError("tessera ckpt export: --dtype must be fp32 or bf16");
  if (format != "auto" && format != "hf" && format != "tessera")
    throw UsageError("tessera ckpt export: --format must be auto, hf or tessera");
  std::string dir = resolve(path);
  nlohmann::json m = read_manifest(dir);
  const std::string model = m.value("model", "");
  const ModelExporter *exporter = format == "tessera" ? nullptr : find_model_exporter(model);
  if (format == "hf" && !exporter)
    throw UsageError("tessera ckpt export: --format hf: model '" + model +
                     "' has no Hugging Face export (gpt2 has); --format tessera writes its own "
                     "names and shapes");
  std::vector<float> canonical;
  read_canonical_params(dir, &canonical, &m);
  if (exporter) {
    std::printf("%s\n", exporter->write(ExportInput{dir, &m, &canonical, out, dtype}).c_str());
    return 0;
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
      for (size_t i = 0; i < n; ++i) halves.back()[i] = fp32_to_bf16(canonical[off + i]);
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
  if (sub == "verify") return verify(path);
  if (sub == "export")
    return export_ckpt(path, p.get("-o", p.get("--output")), p.get("--dtype", "fp32"),
                       p.get("--format", "auto"));
  throw UsageError("tessera ckpt: unknown subcommand '" + sub + "' (inspect, verify, export)");
}

}  // namespace

int cmd_ckpt(const Args &args) {
  return run_command("ckpt", kCkptUsage, ckpt_body, args,
                     {{"-o", true, false},
                      {"--output", true, false},
                      {"--dtype", true, false},
                      {"--format", true, false},
                      {"--help", false, false},
                      {"-h", false, false}});
}

}  // namespace tessera::cli
