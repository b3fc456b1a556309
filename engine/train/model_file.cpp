#include "train/model_file.hpp"

#include <cstring>
#include <filesystem>

#include "ckpt/checkpoint.hpp"
#include "util/error.hpp"
#include "util/finite.hpp"
#include "util/safetensors.hpp"

namespace fs = std::filesystem;

namespace tessera {

namespace {

void from_safetensors(const std::string &file, const Layout &layout, float *flat) {
  SafetensorsFile f(file);
  for (const auto &slot : layout.params) {
    auto it = f.tensors().find(slot.name);
    if (it == f.tensors().end())
      throw Error(TSR_ERR_INVALID, file + ": missing parameter '" + slot.name + "'");
    const StTensor &t = it->second;
    if (t.shape != slot.shape)
      throw Error(TSR_ERR_INVALID, file + ": parameter '" + slot.name +
                                       "' has another shape than the model declares");
    const auto *d = static_cast<const char *>(t.data);
    float *out = flat + slot.offset;
    if (t.dtype == "F32") {
      std::memcpy(out, d, slot.numel * 4);
    } else if (t.dtype == "F64") {
      for (size_t i = 0; i < slot.numel; ++i) {
        double v;
        std::memcpy(&v, d + i * 8, 8);
        out[i] = static_cast<float>(v);
      }
    } else if (t.dtype == "BF16") {
      for (size_t i = 0; i < slot.numel; ++i) {
        uint32_t u = 0;
        std::memcpy(reinterpret_cast<char *>(&u) + 2, d + i * 2, 2);
        std::memcpy(&out[i], &u, 4);
      }
    } else {
      throw Error(TSR_ERR_UNSUPPORTED, file + ": parameter '" + slot.name + "' has dtype " +
                                           t.dtype + " (F32, F64 or BF16 expected)");
    }
    require_finite(out, slot.numel, file + ": parameter '" + slot.name + "'");
  }
}

}  // namespace

std::string load_model_params(const std::string &path, const Layout &layout, float *flat) {
  if (fs::is_regular_file(path)) {
    from_safetensors(path, layout, flat);
    return path;
  }
  std::string dir = resolve_checkpoint(path, path);
  if (dir.empty()) throw Error(TSR_ERR_IO, path + ": no checkpoint here");
  std::vector<float> canonical;
  nlohmann::json m;
  read_canonical_params(dir, &canonical, &m);
  const auto &table = m.at("params");
  if (table.size() != layout.params.size())
    throw Error(TSR_ERR_INVALID, dir + ": checkpoint has " + std::to_string(table.size()) +
                                     " parameters, the model declares " +
                                     std::to_string(layout.params.size()));
  size_t canon = 0;
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const auto &p = layout.params[i];
    if (table[i].at("name") != p.name ||
        table[i].at("shape").get<std::vector<int64_t>>() != p.shape)
      throw Error(TSR_ERR_INVALID, dir + ": parameter " + std::to_string(i) + " is '" +
                                       table[i].at("name").get<std::string>() +
                                       "' in the checkpoint but '" + p.name +
                                       "' (or another shape) in the model");
    std::memcpy(flat + p.offset, canonical.data() + canon, p.numel * 4);
    require_finite(flat + p.offset, p.numel, dir + ": parameter '" + p.name + "'");
    canon += p.numel;
  }
  return dir;
}

}  // namespace tessera
