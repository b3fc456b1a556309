// safetensors files: an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the raw data.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tessera {

struct StTensor {
  std::string name;
  std::string dtype;  // "F32", "F64", "I32", "I64", "BF16", "F16", "U8"
  std::vector<int64_t> shape;
  const void *data = nullptr;  // for writing
  size_t bytes = 0;
};

// Writes tensors (in the given order) to `path` via a temporary file that is
// renamed into place once complete and synced. Returns the byte offset in
// the file where the data section starts (tensor i's bytes follow the ones
// before it in order).
size_t safetensors_write(const std::string &path, const std::vector<StTensor> &tensors,
                         const std::map<std::string, std::string> &metadata = {});

// The bytes a safetensors file starts with (the 8-byte header length and
// the JSON header, padded with spaces so that its size, the data's offset,
// is a multiple of `align`, at least 8); tensor i's bytes follow those of
// the tensors before it. `data` is not read.
std::string safetensors_prefix(const std::vector<StTensor> &tensors,
                               const std::map<std::string, std::string> &metadata,
                               size_t align = 8);

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

size_t st_dtype_size(const std::string &dtype);

}  // namespace tessera
