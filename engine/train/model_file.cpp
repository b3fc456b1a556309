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
      throw Error(TSR_ERR_INVALID,
                  file + ": " + slot.name + ": file " + shape_text(t.shape) + ", model " +
                      shape_text(slot.shape) +
                      "; the config describes another model than the one saved (compare "
                      "[model] with the one it was trained with)");
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
  if (std::string why = params_mismatch(m.at("params"), layout); !why.empty())
    throw Error(TSR_ERR_INVALID, dir + ": " + why);
  size_t canon = 0;
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const auto &p = layout.params[i];
    std::memcpy(flat + p.offset, canonical.data() + canon, p.numel * 4);
    require_finite(flat + p.offset, p.numel, dir + ": parameter '" + p.name + "'");
    canon += p.numel;
  }
  return dir;
}

}  // namespace tessera
