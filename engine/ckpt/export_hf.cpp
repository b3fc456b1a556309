#include "ckpt/export_hf.hpp"

#include <toml++/toml.h>

#include <cstring>
#include <filesystem>
#include <iterator>

#include "util/error.hpp"
#include "util/regular_file.hpp"
#include "util/safetensors.hpp"
#include "util/synced_file.hpp"

namespace fs = std::filesystem;

namespace tessera {

uint16_t fp32_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

namespace {

std::string shape_str(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A [model] key of the run's config: an integer (0 when absent, the
// plugin's default).
int64_t model_int(const toml::table *model, const char *key, int64_t absent) {
  if (!model) return absent;
  const toml::node *n = model->get(key);
  if (!n) return absent;
  if (auto v = n->value<int64_t>()) return *v;
  throw Error(TSR_ERR_CONFIG, std::string("gpt2 export: the checkpoint's config has model.") + key +
                                  " that is not an integer");
}

// Where init_from's config.json is: DIR/config.json for a directory,
// config.json beside a file (the gpt2 plugin's open_checkpoint).
fs::path config_json_of(const fs::path &from) {
  std::error_code ec;
  if (fs::is_directory(from, ec)) return from / "config.json";
  return from.parent_path().empty() ? fs::path("config.json") : from.parent_path() / "config.json";
}

fs::path find_init_from_config(const std::string &init_from, const std::string &ckpt_dir) {
  const fs::path from(init_from);
  std::error_code ec;
  std::vector<fs::path> tried;
  auto probe = [&](const fs::path &p) {
    tried.push_back(p);
    return fs::exists(p, ec) && fs::exists(config_json_of(p), ec);
  };
  if (probe(from)) return config_json_of(from);
  if (from.is_relative()) {
    for (fs::path a = fs::absolute(ckpt_dir, ec).parent_path(); !a.empty(); a = a.parent_path()) {
      if (probe(a / from)) return config_json_of(a / from);
      if (a == a.parent_path()) break;
    }
  }
  throw Error(TSR_ERR_IO, "gpt2 export: the run's model.init_from '" + init_from +
                              "' has no config.json here (looked in the current directory and "
                              "above the checkpoint); the export needs it for the model's "
                              "dimensions: run the export from the run's working directory");
}

int64_t json_int(const nlohmann::json &j, const char *key, const std::string &file) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer())
    throw Error(TSR_ERR_INVALID, "gpt2 export: " + file + " has no integer '" + key + "'");
  return it->get<int64_t>();
}

// As the plugin's merge_dim: a non-zero key must agree with config.json.
void merge_dim(int64_t &dim, int64_t from_file, const char *key, const char *hf_key,
               const std::string &file) {
  if (dim != 0 && dim != from_file)
    throw Error(TSR_ERR_CONFIG, std::string("gpt2 export: model.") + key + " = " +
                                    std::to_string(dim) + " but " + file + " has " + hf_key +
                                    " = " + std::to_string(from_file));
  dim = from_file;
}

std::string export_gpt2(const ExportInput &in) {
  const nlohmann::json &m = *in.manifest;
  const Gpt2Dims d = gpt2_dims_from_config(m.at("config").get<std::string>(), in.ckpt_dir);

  // The checkpoint must hold exactly the parameters the plugin declares for
  // these dimensions, in its order.
  const auto expected = gpt2_param_table(d);
  const auto &params = m.at("params");
  if (params.size() != expected.size())
    throw Error(TSR_ERR_INVALID,
                "gpt2 export: " + in.ckpt_dir + " has " + std::to_string(params.size()) +
                    " parameters; a gpt2 of " + std::to_string(d.layers) + " layers has " +
                    std::to_string(expected.size()) + " (config and checkpoint disagree)");
  for (size_t i = 0; i < expected.size(); ++i) {
    const std::string name = params[i].at("name").get<std::string>();
    const auto shape = params[i].at("shape").get<std::vector<int64_t>>();
    if (name != expected[i].first || shape != expected[i].second)
      throw Error(TSR_ERR_INVALID, "gpt2 export: parameter " + std::to_string(i) + " is '" + name +
                                       "' " + shape_str(shape) +
                                       " in the checkpoint, but the config's dimensions give '" +
                                       expected[i].first + "' " + shape_str(expected[i].second));
  }

  // Hugging Face names are the plugin's; wte keeps its first `vocab` rows
  // (row-major: a prefix of the tensor).
  const std::vector<float> &canon = *in.canonical;
  const bool bf16 = in.dtype == "bf16";
  std::vector<StTensor> tensors;
  std::vector<std::vector<uint16_t>> halves;
  halves.reserve(params.size());
  for (const auto &p : params) {
    std::vector<int64_t> shape = p.at("shape").get<std::vector<int64_t>>();
    const std::string name = p.at("name").get<std::string>();
    if (name == "transformer.wte.weight") shape[0] = d.vocab;
    size_t n = 1;
    for (int64_t s : shape) n *= static_cast<size_t>(s);
    const size_t off = p.at("canonical_offset").get<size_t>();
    if (off + n > canon.size())
      throw Error(TSR_ERR_INVALID, "gpt2 export: '" + name + "' lies past the checkpoint's end");
    if (!bf16) {
      tensors.push_back(StTensor{name, "F32", shape, canon.data() + off, n * 4});
    } else {
      halves.emplace_back(n);
      for (size_t i = 0; i < n; ++i) halves.back()[i] = fp32_to_bf16(canon[off + i]);
      tensors.push_back(StTensor{name, "BF16", shape, halves.back().data(), n * 2});
    }
  }

  // -o DIR: DIR/model.safetensors + DIR/config.json (what save_pretrained
  // writes); -o FILE.safetensors: that file, config.json beside it.
  fs::path weights, config;
  if (in.out.ends_with(".safetensors")) {
    weights = in.out;
    config = weights.parent_path().empty() ? fs::path("config.json")
                                           : weights.parent_path() / "config.json";
  } else {
    std::error_code ec;
    if (fs::exists(in.out, ec) && !fs::is_directory(in.out, ec))
      throw Error(TSR_ERR_IO, "gpt2 export: " + in.out +
                                  " is a file; -o names a directory for a Hugging Face export "
                                  "(or a .safetensors file)");
    fs::create_directories(in.out, ec);
    if (ec) throw Error(TSR_ERR_IO, in.out + ": cannot create: " + ec.message());
    weights = fs::path(in.out) / "model.safetensors";
    config = fs::path(in.out) / "config.json";
  }
  safetensors_write(weights.string(), tensors,
                    {{"format", "pt"},
                     {"tessera_model", "gpt2"},
                     {"tessera_step", std::to_string(m.value("step", int64_t{0}))}});
  write_file_synced(config, gpt2_hf_config(d, in.dtype).dump(2) + "\n");
  return "exported " + std::to_string(tensors.size()) + " tensors (" + in.dtype + ") from " +
         in.ckpt_dir + " as a Hugging Face GPT-2 (" + std::to_string(d.layers) + " layers, " +
         std::to_string(d.heads) + " heads, width " + std::to_string(d.width) + ", context " +
         std::to_string(d.context) + ", vocab " + std::to_string(d.vocab) + ", wte " +
         std::to_string(d.vocab) + " of " + std::to_string(d.padded_vocab) +
         " rows): " + weights.string() + " and " + config.string();
}

const ModelExporter kExporters[] = {
    {"gpt2", "Hugging Face transformers (GPT2LMHeadModel.from_pretrained)", export_gpt2},
};

}  // namespace

const ModelExporter *find_model_exporter(const std::string &model) {
  for (const auto &e : kExporters)
    if (model == e.model) return &e;
  return nullptr;
}

Gpt2Dims gpt2_dims_from_config(const std::string &config_toml, const std::string &ckpt_dir) {
  toml::table root;
  try {
    root = toml::parse(std::string_view(config_toml), std::string_view("manifest config"));
  } catch (const toml::parse_error &e) {
    throw Error(TSR_ERR_INVALID,
                std::string("gpt2 export: the checkpoint's config is not valid TOML: ") +
                    std::string(e.description()));
  }
  const toml::table *model = root["model"].as_table();
  Gpt2Dims d;
  d.layers = model_int(model, "layers", 0);
  d.heads = model_int(model, "heads", 0);
  d.width = model_int(model, "width", 0);
  d.context = model_int(model, "context", 0);
  d.vocab = model_int(model, "vocab", 0);
  d.vocab_pad_to = model_int(model, "vocab_pad_to", 64);
  if (model)
    if (auto s = (*model)["init_std"].value<double>()) d.init_std = *s;
  std::string init_from;
  if (model)
    if (auto s = (*model)["init_from"].value<std::string>()) init_from = *s;
  for (const auto &[v, key] :
       {std::pair{d.layers, "layers"}, std::pair{d.heads, "heads"}, std::pair{d.width, "width"},
        std::pair{d.context, "context"}, std::pair{d.vocab, "vocab"}})
    if (v < 0)
      throw Error(TSR_ERR_CONFIG, std::string("gpt2 export: model.") + key + " = " +
                                      std::to_string(v) + " is negative");
  if (d.vocab_pad_to < 1)
    throw Error(TSR_ERR_CONFIG, "gpt2 export: model.vocab_pad_to = " +
                                    std::to_string(d.vocab_pad_to) + " is below 1");

  // init_from's config.json wins (an explicit key that disagrees is an
  // error); without init_from, unset keys are GPT-2 small's.
  if (!init_from.empty()) {
    const fs::path cfg_path = find_init_from_config(init_from, ckpt_dir);
    const std::string f = cfg_path.string();
    d.init_from_config = f;
    nlohmann::json cfg;
    try {
      cfg = nlohmann::json::parse(read_regular(f, "Hugging Face config", uint64_t{16} << 20));
    } catch (const nlohmann::json::exception &e) {
      throw Error(TSR_ERR_INVALID, "gpt2 export: " + f + ": " + e.what());
    }
    merge_dim(d.layers, json_int(cfg, "n_layer", f), "layers", "n_layer", f);
    merge_dim(d.heads, json_int(cfg, "n_head", f), "heads", "n_head", f);
    merge_dim(d.width, json_int(cfg, "n_embd", f), "width", "n_embd", f);
    merge_dim(
        d.context,
        cfg.contains("n_positions") ? json_int(cfg, "n_positions", f) : json_int(cfg, "n_ctx", f),
        "context", "n_positions", f);
    merge_dim(d.vocab, json_int(cfg, "vocab_size", f), "vocab", "vocab_size", f);
  } else {
    if (d.layers == 0) d.layers = 12;
    if (d.heads == 0) d.heads = 12;
    if (d.width == 0) d.width = 768;
    if (d.context == 0) d.context = 1024;
    if (d.vocab == 0) d.vocab = 50257;
  }
  for (const auto &[v, key] :
       {std::pair{d.layers, "layers"}, std::pair{d.heads, "heads"}, std::pair{d.width, "width"},
        std::pair{d.context, "context"}, std::pair{d.vocab, "vocab"}})
    if (v < 1)
      throw Error(TSR_ERR_CONFIG, std::string("gpt2 export: ") + key + " must be at least 1");
  if (d.width % d.heads != 0)
    throw Error(TSR_ERR_CONFIG, "gpt2 export: width " + std::to_string(d.width) +
                                    " is not a multiple of heads " + std::to_string(d.heads));
  d.padded_vocab = (d.vocab + d.vocab_pad_to - 1) / d.vocab_pad_to * d.vocab_pad_to;
  return d;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> gpt2_param_table(const Gpt2Dims &d) {
  const int64_t C = d.width;
  std::vector<std::pair<std::string, std::vector<int64_t>>> t = {
      {"transformer.wte.weight", {d.padded_vocab, C}},
      {"transformer.wpe.weight", {d.context, C}},
  };
  for (int64_t l = 0; l < d.layers; ++l) {
    const std::string pre = "transformer.h." + std::to_string(l) + ".";
    t.push_back({pre + "ln_1.weight", {C}});
    t.push_back({pre + "ln_1.bias", {C}});
    t.push_back({pre + "attn.c_attn.weight", {C, 3 * C}});
    t.push_back({pre + "attn.c_attn.bias", {3 * C}});
    t.push_back({pre + "attn.c_proj.weight", {C, C}});
    t.push_back({pre + "attn.c_proj.bias", {C}});
    t.push_back({pre + "ln_2.weight", {C}});
    t.push_back({pre + "ln_2.bias", {C}});
    t.push_back({pre + "mlp.c_fc.weight", {C, 4 * C}});
    t.push_back({pre + "mlp.c_fc.bias", {4 * C}});
    t.push_back({pre + "mlp.c_proj.weight", {4 * C, C}});
    t.push_back({pre + "mlp.c_proj.bias", {C}});
  }
  t.push_back({"transformer.ln_f.weight", {C}});
  t.push_back({"transformer.ln_f.bias", {C}});
  return t;
}

nlohmann::json gpt2_hf_config(const Gpt2Dims &d, const std::string &dtype) {
  // GPT-2's BPE has <|endoftext|> = 50256 as both; another vocabulary has no
  // known special tokens.
  const nlohmann::json special = d.vocab == 50257 ? nlohmann::json(50256) : nlohmann::json(nullptr);
  // The keys save_pretrained writes for a GPT2Config (transformers 5), with
  // what the gpt2 plugin computes: tanh GELU, eps 1e-5, 4C MLP, tied head,
  // scaled attention, no dropout.
  return {
      {"activation_function", "gelu_new"},
      {"add_cross_attention", false},
      {"architectures", nlohmann::json::array({"GPT2LMHeadModel"})},
      {"attn_pdrop", 0.0},
      {"bos_token_id", special},
      {"dtype", dtype == "bf16" ? "bfloat16" : "float32"},
      {"embd_pdrop", 0.0},
      {"eos_token_id", special},
      {"initializer_range", d.init_std},
      {"layer_norm_epsilon", 1e-5},
      {"model_type", "gpt2"},
      {"n_embd", d.width},
      {"n_head", d.heads},
      {"n_inner", nullptr},
      {"n_layer", d.layers},
      {"n_positions", d.context},
      {"pad_token_id", nullptr},
      {"reorder_and_upcast_attn", false},
      {"resid_pdrop", 0.0},
      {"scale_attn_by_inverse_layer_idx", false},
      {"scale_attn_weights", true},
      {"summary_activation", nullptr},
      {"summary_first_dropout", 0.1},
      {"summary_proj_to_labels", true},
      {"summary_type", "cls_index"},
      {"summary_use_proj", true},
      {"tie_word_embeddings", true},
      {"use_cache", true},
      {"vocab_size", d.vocab},
  };
}

}  // namespace tessera
