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

// A file mapped read-only into memory (mmap): a tensor's bytes are read
// from disk when first touched, so opening a checkpoint costs its header,
// not its size, and a reader that calls release() after each tensor holds
// at most one tensor's pages of it at a time (a model's checkpoint is never
// a second copy of the model in host memory). Every header field is checked
// against the file's real length before use. The file must not shrink while
// open (reading a truncated mapping faults, as reading any mmap'd file).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string &path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile &) = delete;
  SafetensorsFile &operator=(const SafetensorsFile &) = delete;
  const std::map<std::string, StTensor> &tensors() const { return tensors_; }
  const std::map<std::string, std::string> &metadata() const { return metadata_; }
  const StTensor &get(const std::string &name) const;
  const std::string &path() const { return path_; }
  // Drops the pages of bytes [data, data + bytes) of the mapping from this
  // process's memory (they are read again if touched again): what a reader
  // calls once it has copied a tensor out.
  void release(const void *data, size_t bytes) const;
  void release(const StTensor &t) const { release(t.data, t.bytes); }

 private:
  void parse();  // the header into tensors_ and metadata_
  std::string path_;
  const char *map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, StTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

inline size_t st_dtype_size(const std::string &dtype) {
  return formats::safetensors::dtype_size(dtype);
}

}  // namespace tessera
