#include "train/init_from.hpp"

#include <tessera/abi.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "util/error.hpp"
#include "util/finite.hpp"
#include "util/safetensors.hpp"

namespace fs = std::filesystem;

namespace tessera {

namespace {

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400u)) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::string shape_str(const std::vector<int64_t> &s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The files a checkpoint spans: one safetensors file, or the shards a
// Hugging Face index (model.safetensors.index.json: weight_map, tensor name
// -> shard file beside it) names.
std::vector<std::string> checkpoint_files(const std::string &given) {
  std::string path = given;
  if (fs::is_directory(path)) {
    const fs::path one = fs::path(path) / "model.safetensors";
    const fs::path index = fs::path(path) / "model.safetensors.index.json";
    path = (!fs::exists(one) && fs::exists(index) ? index : one).string();
  }
  if (!fs::exists(path))
    throw Error(TSR_ERR_IO, "[model] init_from: " + path +
                                " does not exist (expected a safetensors file, a Hugging Face "
                                "index model.safetensors.index.json, or a directory holding "
                                "either)");
  if (!path.ends_with(".index.json")) return {path};
  nlohmann::json index;
  try {
    std::ifstream in(path);
    index = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception &e) {
    throw Error(TSR_ERR_INVALID, "[model] init_from " + path + ": " + e.what());
  }
  if (!index.contains("weight_map") || !index["weight_map"].is_object())
    throw Error(TSR_ERR_INVALID, "[model] init_from " + path + ": no 'weight_map' object");
  std::set<std::string> shards;
  for (const auto &[name, file] : index["weight_map"].items()) {
    if (!file.is_string())
      throw Error(TSR_ERR_INVALID,
                  "[model] init_from " + path + ": weight_map['" + name + "'] is not a file name");
    const std::string f = file.get<std::string>();
    if (f.find('/') != std::string::npos)
      throw Error(TSR_ERR_INVALID, "[model] init_from " + path + ": shard '" + f +
                                       "' is not a file beside the index");
    shards.insert((fs::path(path).parent_path() / f).string());
  }
  return {shards.begin(), shards.end()};
}

// Elements [a, b) of a tensor of `dtype` at `data`, converted to float32.
void convert(const std::string &dtype, const void *data, size_t a, size_t b, float *dst) {
  if (dtype == "F32") {
    std::memcpy(dst + a, static_cast<const char *>(data) + a * 4, (b - a) * 4);
  } else if (dtype == "BF16" || dtype == "F16") {
    const char *src = static_cast<const char *>(data);
    for (size_t i = a; i < b; ++i) {
      uint16_t h;
      std::memcpy(&h, src + i * 2, 2);
      if (dtype == "F16") {
        dst[i] = half_to_float(h);
      } else {
        const uint32_t u = static_cast<uint32_t>(h) << 16;
        std::memcpy(&dst[i], &u, 4);
      }
    }
  } else {  // F64: references, some exports
    const char *src = static_cast<const char *>(data);
    for (size_t i = a; i < b; ++i) {
      double v;
      std::memcpy(&v, src + i * 8, 8);  // the data may be unaligned for double
      dst[i] = static_cast<float>(v);
    }
  }
}

// One tensor into its parameter's slot (the parts of it `keep` covers),
// converted to float32; its pages of the mapping dropped afterwards.
void load_tensor(const SafetensorsFile &file, const StTensor &t, const ParamSlot &p, float *flat,
                 const std::vector<FlatRange> *keep) {
  const std::string &path = file.path();
  bool ok = t.shape.size() == p.shape.size() && !t.shape.empty();
  for (size_t d = 0; ok && d < t.shape.size(); ++d)
    ok = d == 0 ? (t.shape[0] <= p.shape[0] && t.shape[0] > 0) : t.shape[d] == p.shape[d];
  if (!ok)
    throw Error(TSR_ERR_INVALID,
                "[model] init_from " + path + ": " + p.name + ": file " + shape_str(t.shape) +
                    ", model " + shape_str(p.shape) +
                    "; the file holds another model than [model] describes (only the "
                    "first dimension may be smaller in the file, as a padded vocabulary's)");
  if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16" && t.dtype != "F64")
    throw Error(TSR_ERR_UNSUPPORTED, "[model] init_from " + path + ": tensor '" + p.name + "' is " +
                                         t.dtype + "; F32, F16, BF16 or F64 expected");
  size_t n = 1;
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  float *dst = flat + p.offset;
  for (const auto &[a, b] : kept_parts(keep, p.offset, n)) {
    convert(t.dtype, t.data, a, b, dst);
    require_finite(dst + a, b - a, "[model] init_from " + path + ": tensor '" + p.name + "'");
  }
  file.release(t);
}

}  // namespace

std::string init_from_safetensors(const std::string &given, const Layout &layout, float *flat,
                                  const std::vector<FlatRange> *keep,
                                  const std::function<bool(size_t)> &may_lack) {
  const std::vector<std::string> paths = checkpoint_files(given);
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  size_t in_files = 0, loaded = 0, kept = 0;
  for (const std::string &p : paths) {
    files.push_back(std::make_unique<SafetensorsFile>(p));
    in_files += files.back()->tensors().size();
  }
  const std::string where =
      paths.size() == 1 ? paths[0] : given + " (" + std::to_string(paths.size()) + " shards)";
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const ParamSlot &p = layout.params[i];
    const StTensor *t = nullptr;
    size_t k = 0;
    for (; k < files.size() && !t; ++k) {
      auto it = files[k]->tensors().find(p.name);
      if (it != files[k]->tensors().end()) t = &it->second;
    }
    if (!t && may_lack && may_lack(i)) {
      ++kept;
      continue;
    }
    if (!t)
      throw Error(TSR_ERR_INVALID, "[model] init_from " + where + ": no tensor '" + p.name +
                                       "' (the model declares it with shape " + shape_str(p.shape) +
                                       ")");
    load_tensor(*files[k - 1], *t, p, flat, keep);
    ++loaded;
  }
  const size_t skipped = in_files - loaded;
  return "initialised " + std::to_string(loaded) + " parameters from " + where +
         (skipped ? " (" + std::to_string(skipped) + " tensors there are not parameters here)"
                  : std::string()) +
         (kept ? ", " + std::to_string(kept) + " (adapters) from their initialisers"
               : std::string());
}

}  // namespace tessera
