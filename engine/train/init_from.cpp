#include "train/init_from.hpp"

#include <tessera/abi.h>

#include <cstring>
#include <filesystem>

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

}  // namespace

std::string init_from_safetensors(const std::string &given, const Layout &layout, float *flat) {
  std::string path = given;
  if (fs::is_directory(path)) path = (fs::path(path) / "model.safetensors").string();
  if (!fs::exists(path))
    throw Error(TSR_ERR_IO, "[model] init_from: " + path +
                                " does not exist (expected a "
                                "safetensors file or a directory holding model.safetensors)");
  SafetensorsFile file(path);
  size_t loaded = 0;
  for (const ParamSlot &p : layout.params) {
    auto it = file.tensors().find(p.name);
    if (it == file.tensors().end())
      throw Error(TSR_ERR_INVALID, "[model] init_from " + path + ": no tensor '" + p.name +
                                       "' (the model declares it with shape " + shape_str(p.shape) +
                                       ")");
    const StTensor &t = it->second;
    bool ok = t.shape.size() == p.shape.size() && !t.shape.empty();
    for (size_t d = 0; ok && d < t.shape.size(); ++d)
      ok = d == 0 ? (t.shape[0] <= p.shape[0] && t.shape[0] > 0) : t.shape[d] == p.shape[d];
    if (!ok)
      throw Error(TSR_ERR_INVALID,
                  "[model] init_from " + path + ": " + p.name + ": file " + shape_str(t.shape) +
                      ", model " + shape_str(p.shape) +
                      "; the file holds another model than [model] describes (only the "
                      "first dimension may be smaller in the file, as a padded vocabulary's)");
    size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    float *dst = flat + p.offset;
    if (t.dtype == "F32") {
      std::memcpy(dst, t.data, n * 4);
    } else if (t.dtype == "BF16" || t.dtype == "F16") {
      const auto *src = static_cast<const uint16_t *>(t.data);
      for (size_t i = 0; i < n; ++i) {
        if (t.dtype == "F16") {
          dst[i] = half_to_float(src[i]);
        } else {
          uint32_t u = static_cast<uint32_t>(src[i]) << 16;
          std::memcpy(&dst[i], &u, 4);
        }
      }
    } else if (t.dtype == "F64") {  // float64 checkpoints (references, some exports)
      const char *src = static_cast<const char *>(t.data);
      for (size_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, src + i * 8, 8);  // the data may be unaligned for double
        dst[i] = static_cast<float>(v);
      }
    } else {
      throw Error(TSR_ERR_UNSUPPORTED, "[model] init_from " + path + ": tensor '" + p.name +
                                           "' is " + t.dtype + "; F32, F16, BF16 or F64 expected");
    }
    require_finite(dst, n, "[model] init_from " + path + ": tensor '" + p.name + "'");
    ++loaded;
  }
  const size_t skipped = file.tensors().size() - loaded;
  return "initialised " + std::to_string(loaded) + " parameters from " + path +
         (skipped ? " (" + std::to_string(skipped) + " tensors there are not parameters here)"
                  : std::string());
}

}  // namespace tessera
