// safetensors files: an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the raw data.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tessera/cpp/formats/safetensors.hpp>
#include <vector>

namespace tessera {

// The writer is the SDK's (tessera/cpp/formats/safetensors.hpp), shared
// with model plugins' exports.
using StTensor = formats::safetensors::Tensor;

// Writes tensors (in the given order) to `path` via a temporary file that is
// renamed into place once complete and synced. Returns the byte offset in
// the file where the data section starts (tensor i's bytes follow the ones
// before it in order).
inline size_t safetensors_write(const std::string &path, const std::vector<StTensor> &tensors,
                                const std::map<std::string, std::string> &metadata = {}) {
  return formats::safetensors::write(path, tensors, metadata);
}

// The bytes a safetensors file starts with (the 8-byte header length and
// the JSON header, padded with spaces so that its size, the data's offset,
// is a multiple of `align`, at least 8); tensor i's bytes follow those of
// the tensors before it. `data` is not read.
inline std::string safetensors_prefix(const std::vector<StTensor> &tensors,
                                      const std::map<std::string, std::string> &metadata,
                                      size_t align = 8) {
  return formats::safetensors::prefix(tensors, metadata, align);
}

// A file read into memory; every header field is checked against the file's
// real length before use.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string &path);
  const std::map<std::string, StTensor> &tensors() const { return tensors_; }
  const std::map<std::string, std::string> &metadata() const { return metadata_; }
  const StTensor &get(const std::string &name) const;
  const std::string &path() const { return path_; }

 private:
  std::string path_;
  std::string bytes_;
  std::map<std::string, StTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

inline size_t st_dtype_size(const std::string &dtype) {
  return formats::safetensors::dtype_size(dtype);
}

}  // namespace tessera
