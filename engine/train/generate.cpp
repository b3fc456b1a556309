#include "train/generate.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>

#include "ckpt/checkpoint.hpp"
#include "data/tokenizer_bpe.hpp"
#include "train/device_select.hpp"
#include "train/frozen_model.hpp"
#include "train/model_file.hpp"
#include "train/trainer.hpp"
#include "util/error.hpp"

namespace fs = std::filesystem;

namespace tessera {

namespace {

// A uniform double in [0, 1) from 53 random bits: the same on every
// platform, unlike std::uniform_real_distribution.
double uniform(std::mt19937_64 &rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// The next token: argmax (top_k 0), else a draw from the softmax of
// logits / temperature over the k largest (ties: the lower id first).
int32_t pick(const std::vector<float> &z, int64_t top_k, double temperature, std::mt19937_64 &rng) {
  const int64_t V = static_cast<int64_t>(z.size());
  for (float v : z)
    if (!std::isfinite(v)) throw Error(TSR_ERR_INTERNAL, "the model's logits are not finite");
  if (top_k == 0) return static_cast<int32_t>(std::max_element(z.begin(), z.end()) - z.begin());
  const int64_t k = std::min(top_k, V);
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return z[static_cast<size_t>(a)] > z[static_cast<size_t>(b)] ||
           (z[static_cast<size_t>(a)] == z[static_cast<size_t>(b)] && a < b);
  });
  const double top = z[static_cast<size_t>(idx[0])];
  std::vector<double> w(static_cast<size_t>(k));
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) {
    w[static_cast<size_t>(i)] =
        std::exp((z[static_cast<size_t>(idx[static_cast<size_t>(i)])] - top) / temperature);
    sum += w[static_cast<size_t>(i)];
  }
  double u = uniform(rng) * sum;
  for (int64_t i = 0; i < k; ++i) {
    u -= w[static_cast<size_t>(i)];
    if (u < 0) return idx[static_cast<size_t>(i)];
  }
  return idx[static_cast<size_t>(k - 1)];
}

// Device memory from the host's allocator, freed on scope exit.
struct DeviceBuffer {
  Host &host;
  void *ptr = nullptr;
  DeviceBuffer(Host &h, DLDevice d, size_t bytes)
      : host(h), ptr(h.alloc(d, bytes, TSR_MEM_OTHER)) {}
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  ~DeviceBuffer() { host.free(ptr); }
};

}  // namespace

GenerateResult generate(const GenerateOptions &o, std::FILE *out) {
  GenerateResult r;
  TSR_CHECK(o.max_tokens >= 0, TSR_ERR_CONFIG, "--max-tokens must be >= 0");
  TSR_CHECK(o.top_k >= 0, TSR_ERR_CONFIG, "--top-k must be >= 0 (0: greedy)");
  TSR_CHECK(o.top_k == 0 || (o.temperature > 0 && std::isfinite(o.temperature)), TSR_ERR_CONFIG,
            "--temperature must be a finite number > 0");
  TSR_CHECK(o.encoder.empty() == o.bpe.empty(), TSR_ERR_CONFIG,
            o.encoder.empty() ? "--bpe needs --encoder (GPT-2's encoder.json) too"
                              : "--encoder needs --bpe (GPT-2's vocab.bpe) too");

  // The checkpoint, and the config it was trained with (in its manifest).
  try {
    r.checkpoint = resolve_checkpoint(o.ckpt, o.ckpt);
  } catch (const Error &e) {
    throw Error(e.code(), std::string("--ckpt ") + e.what());
  }
  const std::string manifest_path = (fs::path(r.checkpoint) / "manifest.json").string();
  const nlohmann::json manifest = read_manifest(r.checkpoint);
  if (!manifest.contains("config") || !manifest["config"].is_string() ||
      manifest["config"].get<std::string>().empty())
    throw Error(TSR_ERR_INVALID, "--ckpt: " + manifest_path + " holds no config");
  JobOptions jo;
  jo.config_path = manifest_path;
  jo.config_text = manifest["config"].get<std::string>();
  // One process, one sequence: the run's batch sizes (fitted to its world
  // size) and its DeepSpeed file (already folded into the config) go.
  jo.sets = {"batch.global=1", "batch.micro=1", "batch.accumulation=1", "run.deepspeed=''"};
  if (!o.device.empty()) {
    if (o.device != "cpu" && o.device != "cuda" && o.device != "auto")
      throw Error(TSR_ERR_CONFIG, "--device '" + o.device + "': expected cpu, cuda or auto");
    jo.sets.push_back("run.device='" + o.device + "'");
    if (o.device == "cpu") jo.sets.push_back("run.precision='fp32'");  // the CPU computes fp32
  }
  jo.sets.insert(jo.sets.end(), o.sets.begin(), o.sets.end());
  jo.plugin_paths = o.plugin_paths;
  Job job = load_job(jo, 1, false);
  for (const auto &w : job.doc.warnings()) spdlog::warn("{}", w);
  for (const auto &w : job.registry->refusals()) spdlog::warn("plugin refused: {}", w);

  const tsr_data_info info = model_data_info(job, manifest_path, "tessera generate");
  const int64_t window = info.input_shape[0];
  ProcessInfo proc;
  proc.device = choose_device(job.settings, 0, 1);
  proc.device_chosen = true;
  prepare_process(job, proc);
  Session s(
      job, run_facts(job, proc), false,
      [&](const Layout &layout, float *flat) { load_model_params(r.checkpoint, layout, flat); },
      &info);
  const tsr_model_vtable *vt = s.model.vt;
  if (!TSR_HAS_FIELD(vt, tsr_model_vtable, predict) || !vt->predict)
    throw Error(TSR_ERR_UNSUPPORTED,
                "[model] plugin '" + s.model.name +
                    "' has no predict entry (ABI 1.1), which tessera generate needs");
  ModelPass pass(s, forward_phase());
  tsr_step *step = pass.handle();

  // The vocabulary: the model's size query.
  int64_t qshape[2] = {1, 0};
  DLTensor query{nullptr, DLDevice{kDLCPU, 0}, 2, DLDataType{kDLFloat, 32, 1}, qshape, nullptr, 0};
  plugin_ok(s.host, vt->predict(s.model.self, step, nullptr, &query), "model", s.model.name,
            "predict (classes)");
  const int64_t V = qshape[1];
  TSR_CHECK(V >= 1, TSR_ERR_INVALID,
            "[model] plugin '" + s.model.name + "' reports " + std::to_string(V) + " classes");

  // The tokenizer: GPT-2's BPE when given and the vocabulary is more than
  // bytes, else bytes (id = byte value).
  std::optional<data::Gpt2Bpe> bpe;
  if (!o.encoder.empty() && V <= 256) {
    spdlog::warn("--encoder/--bpe ignored: the model's vocabulary is {} tokens, bytes", V);
  } else if (!o.encoder.empty()) {
    bpe.emplace(data::Gpt2Bpe::load(o.encoder, o.bpe));
    if (bpe->vocab_size() > V)
      throw Error(TSR_ERR_INVALID, "--encoder '" + o.encoder + "' has " +
                                       std::to_string(bpe->vocab_size()) +
                                       " tokens; the model's vocabulary is " + std::to_string(V));
  } else if (V > 256) {
    spdlog::warn(
        "the model's vocabulary is {} tokens but no --encoder/--bpe were given: the prompt is "
        "read as bytes (ids 0-255) and ids above 255 print as nothing; for GPT-2's vocabulary "
        "give --encoder encoder.json --bpe vocab.bpe (tools/fetch-gpt2-vocab)",
        V);
  }
  std::vector<int32_t> tokens;
  if (bpe) {
    for (uint32_t id : bpe->encode(o.prompt)) tokens.push_back(static_cast<int32_t>(id));
    if (tokens.empty() && bpe->end_of_text()) tokens.push_back(*bpe->end_of_text());
  } else {
    for (unsigned char c : o.prompt) {
      if (c >= V)
        throw Error(TSR_ERR_INVALID, "--prompt: byte " + std::to_string(c) +
                                         " is not below the model's vocabulary of " +
                                         std::to_string(V));
      tokens.push_back(c);
    }
  }
  TSR_CHECK(!tokens.empty(), TSR_ERR_CONFIG, "--prompt is empty: give at least one character");
  r.prompt_tokens = static_cast<int64_t>(tokens.size());
  auto text_of = [&](int32_t id) -> std::string {
    if (bpe) return std::string(bpe->decode(static_cast<uint32_t>(id)));
    return id < 256 ? std::string(1, static_cast<char>(id)) : std::string();
  };
  const std::optional<uint32_t> stop = bpe ? bpe->end_of_text() : std::nullopt;

  std::fputs(o.prompt.c_str(), out);
  std::fflush(out);

  // The input window, copied to the run's device when it is not the host.
  const DLDevice dev = s.host.facts().device;
  const bool on_device = dev.device_type == kDLCUDA;
  std::vector<int32_t> ids(static_cast<size_t>(window));
  std::unique_ptr<DeviceBuffer> dev_ids;
  if (on_device)
    dev_ids = std::make_unique<DeviceBuffer>(s.host, dev, static_cast<size_t>(window) * 4);
  std::vector<float> logits(static_cast<size_t>(V));
  std::mt19937_64 rng(o.seed.value_or(static_cast<uint64_t>(job.settings.seed)));
  const tsr_ops *ops = s.host.table()->ops;

  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < o.max_tokens; ++i) {
    // The last `window` tokens: the model's positions are absolute.
    const int64_t n = std::min<int64_t>(window, static_cast<int64_t>(tokens.size()));
    std::copy(tokens.end() - n, tokens.end(), ids.begin());
    int64_t shape[2] = {1, n};
    DLTensor host_ids{ids.data(), DLDevice{kDLCPU, 0}, 2, DLDataType{kDLInt, 32, 1}, shape, nullptr,
                      0};
    tsr_batch batch{};
    batch.struct_size = tsr_batch_STRUCT_SIZE;
    batch.size = 1;
    batch.inputs = host_ids;
    if (on_device) {
      batch.inputs.data = dev_ids->ptr;
      batch.inputs.device = dev;
      plugin_ok(s.host, ops->copy(s.host.ctx(), &host_ids, &batch.inputs),
                "copy the prompt window to the device");
    }
    int64_t lshape[2] = {1, V};
    DLTensor z{
        logits.data(), DLDevice{kDLCPU, 0}, 2, DLDataType{kDLFloat, 32, 1}, lshape, nullptr, 0};
    plugin_ok(s.host, vt->predict(s.model.self, step, &batch, &z), "model", s.model.name,
              "predict");
    plugin_ok(s.host, s.zero.vt->end_pass(s.zero.self), "zero", s.zero.name, "end_pass");
    const int32_t next = pick(logits, o.top_k, o.temperature, rng);
    if (stop && static_cast<uint32_t>(next) == *stop) break;
    tokens.push_back(next);
    ++r.tokens;
    const std::string text = text_of(next);
    std::fwrite(text.data(), 1, text.size(), out);
    std::fflush(out);
  }
  std::fputc('\n', out);
  std::fflush(out);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace tessera
