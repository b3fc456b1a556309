#include "train/generate.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ckpt/checkpoint.hpp"
#include "data/tokenizer_bpe.hpp"
#include "data/tokenizer_json.hpp"
#include "train/device_select.hpp"
#include "train/frozen_model.hpp"
#include "train/model_file.hpp"
#include "train/trainer.hpp"
#include "util/error.hpp"
#include "util/regular_file.hpp"

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

void check_options(const GenerateOptions &o) {
  TSR_CHECK(o.max_tokens >= 0, TSR_ERR_CONFIG, "--max-tokens must be >= 0");
  TSR_CHECK(o.top_k >= 0, TSR_ERR_CONFIG, "--top-k must be >= 0 (0: greedy)");
  TSR_CHECK(o.top_k == 0 || (o.temperature > 0 && std::isfinite(o.temperature)), TSR_ERR_CONFIG,
            "--temperature must be a finite number > 0");
  TSR_CHECK(o.encoder.empty() == o.bpe.empty(), TSR_ERR_CONFIG,
            o.encoder.empty() ? "--bpe needs --encoder (GPT-2's encoder.json) too"
                              : "--encoder needs --bpe (GPT-2's vocab.bpe) too");
}

// The job the checkpoint was trained with (the config in its manifest),
// for one process and one sequence. Sets *checkpoint to the step_ directory
// and *manifest_path to its manifest.
Job load_checkpoint_job(const GenerateOptions &o, std::string *checkpoint,
                        std::string *manifest_path) {
  try {
    *checkpoint = resolve_checkpoint(o.ckpt, o.ckpt);
  } catch (const Error &e) {
    throw Error(e.code(), std::string("--ckpt ") + e.what());
  }
  *manifest_path = (fs::path(*checkpoint) / "manifest.json").string();
  const nlohmann::json manifest = read_manifest(*checkpoint);
  if (!manifest.contains("config") || !manifest["config"].is_string() ||
      manifest["config"].get<std::string>().empty())
    throw Error(TSR_ERR_INVALID, "--ckpt: " + *manifest_path + " holds no config");
  JobOptions jo;
  jo.config_path = *manifest_path;
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
  return job;
}

// The model's vocabulary: predict's size query (no batch).
int64_t model_vocabulary(Session &s, tsr_step *step) {
  int64_t qshape[2] = {1, 0};
  DLTensor query{nullptr, DLDevice{kDLCPU, 0}, 2, DLDataType{kDLFloat, 32, 1}, qshape, nullptr, 0};
  plugin_ok(s.host, s.model.vt->predict(s.model.self, step, nullptr, &query), "model", s.model.name,
            "predict (classes)");
  const int64_t V = qshape[1];
  TSR_CHECK(V >= 1, TSR_ERR_INVALID,
            "[model] plugin '" + s.model.name + "' reports " + std::to_string(V) + " classes");
  return V;
}

// The end-of-sequence ids of the model whose tokenizer.json is at `path`:
// eos_token_id (an id or a list) of generation_config.json, else of
// config.json, in the tokenizer's directory; none when neither says.
std::vector<uint32_t> eos_beside(const fs::path &path) {
  std::error_code ec;
  const fs::path dir = fs::is_directory(path, ec) ? path : path.parent_path();
  for (const char *name : {"generation_config.json", "config.json"}) {
    const fs::path file = dir / name;
    if (!fs::exists(file, ec)) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_regular(file.string(), "model config"));
    } catch (const nlohmann::json::exception &e) {
      throw Error(TSR_ERR_INVALID, "'" + file.string() + "' is not valid JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("eos_token_id")) continue;
    const nlohmann::json &e = j["eos_token_id"];
    std::vector<uint32_t> ids;
    for (const auto &v : e.is_array() ? e : nlohmann::json::array({e}))
      if (v.is_number_unsigned() && v.get<uint64_t>() <= UINT32_MAX)
        ids.push_back(v.get<uint32_t>());
    return ids;
  }
  return {};
}

// How the prompt becomes ids and ids become text: GPT-2's files, a
// tokenizer.json, or bytes (id = byte value).
struct TextCodec {
  std::optional<data::Gpt2Bpe> gpt2;
  std::optional<data::TokenizerJson> hf;
  std::vector<uint32_t> stops;  // generation ends at any of these

  std::vector<int32_t> encode(const std::string &prompt, int64_t V) {
    std::vector<int32_t> tokens;
    if (gpt2 || hf) {
      for (uint32_t id : gpt2 ? gpt2->encode(prompt) : hf->encode(prompt))
        tokens.push_back(static_cast<int32_t>(id));
      if (tokens.empty() && gpt2 && gpt2->end_of_text()) tokens.push_back(*gpt2->end_of_text());
      return tokens;
    }
    for (unsigned char c : prompt) {
      if (c >= V)
        throw Error(TSR_ERR_INVALID, "--prompt: byte " + std::to_string(c) +
                                         " is not below the model's vocabulary of " +
                                         std::to_string(V));
      tokens.push_back(c);
    }
    return tokens;
  }
  std::string text_of(int32_t id) const {
    if (gpt2) return std::string(gpt2->decode(static_cast<uint32_t>(id)));
    if (hf) return std::string(hf->token_bytes(static_cast<uint32_t>(id)));
    return id < 256 ? std::string(1, static_cast<char>(id)) : std::string();
  }
};

// The tokenizer the options name for a model of V classes: GPT-2's BPE or
// a tokenizer.json when given and the vocabulary is more than bytes.
TextCodec make_codec(const GenerateOptions &o, int64_t V) {
  TextCodec c;
  TSR_CHECK(o.tokenizer.empty() || o.encoder.empty(), TSR_ERR_CONFIG,
            "--tokenizer (a tokenizer.json) or --encoder/--bpe (GPT-2's files), not both");
  const bool given = !o.encoder.empty() || !o.tokenizer.empty();
  if (given && V <= 256) {
    spdlog::warn("{} ignored: the model's vocabulary is {} tokens, bytes",
                 o.tokenizer.empty() ? "--encoder/--bpe" : "--tokenizer", V);
  } else if (!o.encoder.empty()) {
    c.gpt2.emplace(data::Gpt2Bpe::load(o.encoder, o.bpe));
    if (c.gpt2->vocab_size() > V)
      throw Error(TSR_ERR_INVALID, "--encoder '" + o.encoder + "' has " +
                                       std::to_string(c.gpt2->vocab_size()) +
                                       " tokens; the model's vocabulary is " + std::to_string(V));
    if (auto eot = c.gpt2->end_of_text()) c.stops.push_back(*eot);
  } else if (!o.tokenizer.empty()) {
    c.hf.emplace(data::TokenizerJson::load(o.tokenizer));
    if (c.hf->vocab_size() > V)
      throw Error(TSR_ERR_INVALID, "--tokenizer '" + c.hf->name() + "' has " +
                                       std::to_string(c.hf->vocab_size()) +
                                       " ids; the model's vocabulary is " + std::to_string(V));
    c.stops = eos_beside(o.tokenizer);
  } else if (V > 256) {
    spdlog::warn(
        "the model's vocabulary is {} tokens but no tokenizer was given: the prompt is read as "
        "bytes (ids 0-255) and ids above 255 print as nothing; give --tokenizer (a Hugging Face "
        "tokenizer.json or model directory), or for GPT-2's vocabulary --encoder encoder.json "
        "--bpe vocab.bpe (tools/fetch-gpt2-vocab)",
        V);
  }
  return c;
}

// The model's input window and its logits for the next token. The window
// is copied to the run's device when that is not the host.
struct Predictor {
  Session &s;
  tsr_step *step;
  int64_t window, vocabulary;
  std::vector<int32_t> ids;
  std::unique_ptr<DeviceBuffer> dev_ids;
  std::vector<float> logits;
};

Predictor predictor_make(Session &s, tsr_step *step, int64_t window, int64_t V) {
  Predictor p{s,
              step,
              window,
              V,
              std::vector<int32_t>(static_cast<size_t>(window)),
              nullptr,
              std::vector<float>(static_cast<size_t>(V))};
  const DLDevice dev = s.host.facts().device;
  if (dev.device_type == kDLCUDA)
    p.dev_ids = std::make_unique<DeviceBuffer>(s.host, dev, static_cast<size_t>(window) * 4);
  return p;
}

// Fills p.logits for the token after `tokens`, from the last `window` of
// them (the model's positions are absolute).
void predictor_run(Predictor &p, const std::vector<int32_t> &tokens) {
  Session &s = p.s;
  const int64_t n = std::min<int64_t>(p.window, static_cast<int64_t>(tokens.size()));
  std::copy(tokens.end() - n, tokens.end(), p.ids.begin());
  int64_t shape[2] = {1, n};
  DLTensor host_ids{
      p.ids.data(), DLDevice{kDLCPU, 0}, 2, DLDataType{kDLInt, 32, 1}, shape, nullptr, 0};
  tsr_batch batch{};
  batch.struct_size = tsr_batch_STRUCT_SIZE;
  batch.size = 1;
  batch.inputs = host_ids;
  if (p.dev_ids) {
    batch.inputs.data = p.dev_ids->ptr;
    batch.inputs.device = s.host.facts().device;
    plugin_ok(s.host, s.host.table()->ops->copy(s.host.ctx(), &host_ids, &batch.inputs),
              "copy the prompt window to the device");
  }
  int64_t lshape[2] = {1, p.vocabulary};
  DLTensor z{
      p.logits.data(), DLDevice{kDLCPU, 0}, 2, DLDataType{kDLFloat, 32, 1}, lshape, nullptr, 0};
  plugin_ok(s.host, s.model.vt->predict(s.model.self, p.step, &batch, &z), "model", s.model.name,
            "predict");
  plugin_ok(s.host, s.zero.vt->end_pass(s.zero.self), "zero", s.zero.name, "end_pass");
}

}  // namespace

GenerateResult generate(const GenerateOptions &o, std::FILE *out) {
  GenerateResult r;
  check_options(o);
  std::string manifest_path;
  Job job = load_checkpoint_job(o, &r.checkpoint, &manifest_path);

  const tsr_data_info info = model_data_info(job, manifest_path, "tessera generate");
  ProcessInfo proc;
  proc.device = choose_device(job.settings, 0, 1);
  proc.device_chosen = true;
  prepare_process(job, proc);
  Session s(
      job, run_facts(job, proc), false,
      [&](const Layout &layout, float *flat) { load_model_params(r.checkpoint, layout, flat); },
      &info);
  if (!s.model.caps.model.predict)
    throw Error(TSR_ERR_UNSUPPORTED,
                "[model] plugin '" + s.model.name +
                    "' has no predict entry (ABI 1.1), which tessera generate needs");
  ModelPass pass(s, forward_phase());
  tsr_step *step = pass.handle();

  const int64_t V = model_vocabulary(s, step);
  TextCodec codec = make_codec(o, V);
  std::vector<int32_t> tokens = codec.encode(o.prompt, V);
  TSR_CHECK(!tokens.empty(), TSR_ERR_CONFIG, "--prompt is empty: give at least one character");
  r.prompt_tokens = static_cast<int64_t>(tokens.size());

  std::fputs(o.prompt.c_str(), out);
  std::fflush(out);
  Predictor predictor = predictor_make(s, step, info.input_shape[0], V);
  std::mt19937_64 rng(o.seed.value_or(static_cast<uint64_t>(job.settings.seed)));
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < o.max_tokens; ++i) {
    predictor_run(predictor, tokens);
    const int32_t next = pick(predictor.logits, o.top_k, o.temperature, rng);
    if (std::count(codec.stops.begin(), codec.stops.end(), static_cast<uint32_t>(next))) break;
    tokens.push_back(next);
    ++r.tokens;
    const std::string text = codec.text_of(next);
    std::fwrite(text.data(), 1, text.size(), out);
    std::fflush(out);
  }
  std::fputc('\n', out);
  std::fflush(out);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace tessera
