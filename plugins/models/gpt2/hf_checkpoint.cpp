// Reading a Hugging Face GPT-2 checkpoint's config.json and safetensors
// header (hf_checkpoint.hpp), and merging its dimensions into the model's.
#include "hf_checkpoint.hpp"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <tessera/cpp/regular_file.hpp>

namespace tessera::gpt2 {

namespace {

// A config.json: a regular file (a FIFO would block the read), small.
std::string read_file(const std::string &path) {
  std::string text, why;
  bool refused = false;
  if (!sdk::read_regular_file(path, &text, &why, uint64_t{16} << 20, &refused))
    throw Error(refused ? TSR_ERR_INVALID : TSR_ERR_IO,
                refused ? "gpt2: " + path + " " + why : "gpt2: cannot open " + path + ": " + why);
  return text;
}

// Exactly n bytes at `offset`, or false.
bool read_at(int fd, void *dst, size_t n, uint64_t offset) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r =
        ::pread(fd, static_cast<char *>(dst) + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

bool is_dir(const std::string &path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

int64_t json_int(const nlohmann::json &j, const char *key, const std::string &file) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer())
    throw Error(TSR_ERR_INVALID, "gpt2: " + file + " has no integer '" + key + "'");
  return it->get<int64_t>();
}

}  // namespace

HfCheckpoint open_checkpoint(const std::string &from) {
  HfCheckpoint ck;
  if (is_dir(from)) {
    ck.dir = from;
    ck.weights_path = from + "/model.safetensors";
  } else {
    const size_t slash = from.find_last_of('/');
    ck.dir = slash == std::string::npos ? "." : from.substr(0, slash);
    ck.weights_path = from;
  }
  ck.config_path = ck.dir + "/config.json";
  sdk::RegularFile probe = sdk::open_regular_file(ck.weights_path);
  if (probe.refused)
    throw Error(TSR_ERR_INVALID,
                "gpt2: init_from '" + from + "': " + ck.weights_path + " " + probe.why);
  if (!probe)
    throw Error(TSR_ERR_IO, "gpt2: init_from '" + from + "': cannot open " + ck.weights_path +
                                " (init_from is a Hugging Face model directory with "
                                "config.json and model.safetensors)");

  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(read_file(ck.config_path));
  } catch (const nlohmann::json::exception &e) {
    throw Error(TSR_ERR_INVALID, "gpt2: " + ck.config_path + ": " + e.what());
  }
  const std::string &cp = ck.config_path;
  if (cfg.contains("model_type") && cfg["model_type"] != "gpt2")
    throw Error(TSR_ERR_UNSUPPORTED, "gpt2: " + cp + " describes a '" +
                                         cfg["model_type"].get<std::string>() +
                                         "' model, not gpt2");
  ck.dims.layers = json_int(cfg, "n_layer", cp);
  ck.dims.heads = json_int(cfg, "n_head", cp);
  ck.dims.width = json_int(cfg, "n_embd", cp);
  ck.dims.context =
      cfg.contains("n_positions") ? json_int(cfg, "n_positions", cp) : json_int(cfg, "n_ctx", cp);
  ck.dims.vocab = json_int(cfg, "vocab_size", cp);
  // What this plugin computes: refuse a config.json that asks for otherwise.
  if (cfg.contains("n_inner") && !cfg["n_inner"].is_null() &&
      cfg["n_inner"].get<int64_t>() != 4 * ck.dims.width)
    throw Error(TSR_ERR_UNSUPPORTED,
                "gpt2: " + cp + ": n_inner " + cfg["n_inner"].dump() +
                    " is not 4 * n_embd; the gpt2 plugin's MLP is 4 * width wide");
  if (cfg.contains("activation_function")) {
    const std::string act = cfg["activation_function"].get<std::string>();
    if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast")
      throw Error(TSR_ERR_UNSUPPORTED, "gpt2: " + cp + ": activation_function '" + act +
                                           "'; the gpt2 plugin computes the tanh GELU "
                                           "(gelu_new)");
  }
  if (cfg.contains("layer_norm_epsilon") &&
      std::fabs(cfg["layer_norm_epsilon"].get<double>() - 1e-5) > 1e-12)
    throw Error(TSR_ERR_UNSUPPORTED, "gpt2: " + cp + ": layer_norm_epsilon " +
                                         cfg["layer_norm_epsilon"].dump() +
                                         "; the gpt2 plugin uses 1e-5");
  if (cfg.value("scale_attn_by_inverse_layer_idx", false))
    throw Error(TSR_ERR_UNSUPPORTED,
                "gpt2: " + cp + ": scale_attn_by_inverse_layer_idx is not supported");
  if (cfg.contains("scale_attn_weights") && !cfg.value("scale_attn_weights", true))
    throw Error(TSR_ERR_UNSUPPORTED, "gpt2: " + cp + ": scale_attn_weights = false");
  if (!cfg.value("tie_word_embeddings", true))
    throw Error(TSR_ERR_UNSUPPORTED,
                "gpt2: " + cp + ": tie_word_embeddings = false (the LM head is wte here)");

  // The safetensors header: 8-byte little-endian length, then JSON.
  unsigned char len8[8] = {0};
  if (!read_at(probe.fd, len8, 8, 0))
    throw Error(TSR_ERR_INVALID, "gpt2: " + ck.weights_path + " is too short");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len8[i];
  if (n > (uint64_t{100} << 20))
    throw Error(TSR_ERR_INVALID, "gpt2: " + ck.weights_path + ": implausible header length " +
                                     std::to_string(n) + " (not a safetensors file?)");
  if (n > probe.size - 8)
    throw Error(TSR_ERR_INVALID, "gpt2: " + ck.weights_path + ": header length " +
                                     std::to_string(n) + " exceeds the file (" +
                                     std::to_string(probe.size) + " bytes)");
  std::string text(static_cast<size_t>(n), '\0');
  if (!read_at(probe.fd, text.data(), text.size(), 8))
    throw Error(TSR_ERR_INVALID, "gpt2: " + ck.weights_path + ": truncated safetensors header");
  try {
    ck.header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception &e) {
    throw Error(TSR_ERR_INVALID, "gpt2: " + ck.weights_path + ": " + e.what());
  }
  return ck;
}

void merge_dim(int64_t &dim, int64_t from_file, const char *key, const char *hf_key,
               const std::string &file) {
  if (dim != 0 && dim != from_file)
    throw Error(TSR_ERR_CONFIG, std::string("gpt2: model.") + key + " = " + std::to_string(dim) +
                                    " but " + file + " has " + hf_key + " = " +
                                    std::to_string(from_file) +
                                    " (leave the key out to take the checkpoint's)");
  dim = from_file;
}

}  // namespace tessera::gpt2
