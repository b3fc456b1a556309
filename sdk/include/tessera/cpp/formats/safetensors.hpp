// Writing safetensors files, header-only, for both sides: the engine
// (checkpoint shards, `tessera ckpt export --format tessera`) and model
// plugins that export their weights for another framework (the gpt2
// plugin's Hugging Face export). A file is an 8-byte little-endian header
// length, a JSON header naming each tensor's dtype, shape and byte range
// (and an optional "__metadata__" object of strings), then the raw data.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tessera/cpp/error.hpp>
#include <tessera/cpp/synced_file.hpp>
#include <vector>

namespace tessera::formats::safetensors {

struct Tensor {
  std::string name;
  std::string dtype;  // "F32", "F64", "I32", "I64", "BF16", "F16", "U8"
  std::vector<int64_t> shape;
  const void *data = nullptr;  // for writing
  size_t bytes = 0;
};

// Bytes per element of a dtype name, 0 for a name the format does not have.
inline size_t dtype_size(const std::string &d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "U8" || d == "I8" || d == "BOOL") return 1;
  return 0;
}

// The bytes a file starts with (the header length and the JSON header,
// padded with spaces so that its size, the data's offset, is a multiple of
// `align`, at least 8); tensor i's bytes follow those of the tensors
// before it. `data` is not read.
inline std::string prefix(const std::vector<Tensor> &tensors,
                          const std::map<std::string, std::string> &metadata, size_t align = 8) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto &t : tensors) {
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string h = header.dump();
  // Trailing spaces are part of the format's header: they pad the data
  // section to the alignment asked for (8 for the data's dtypes, 4 KiB for
  // O_DIRECT writes).
  if (align < 8) align = 8;
  while ((h.size() + 8) % align != 0) h.push_back(' ');
  std::string out(8, '\0');
  const uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  return out + h;
}

// Writes the tensors (in the given order) to `path` through PATH.tmp,
// fsync'd and renamed into place, so a crash leaves the old file or the
// new. Returns the data's offset in the file. Throws sdk::Error
// (TSR_ERR_IO) naming the file.
inline size_t write(const std::string &path, const std::vector<Tensor> &tensors,
                    const std::map<std::string, std::string> &metadata = {}) {
  const std::string head = prefix(tensors, metadata, 8);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw sdk::Error(TSR_ERR_IO, tmp + ": cannot open for writing");
    out.write(head.data(), static_cast<std::streamsize>(head.size()));
    for (const auto &t : tensors)
      out.write(static_cast<const char *>(t.data), static_cast<std::streamsize>(t.bytes));
    out.flush();
    if (!out) throw sdk::Error(TSR_ERR_IO, tmp + ": write failed (disk full?)");
  }
  sdk::fsync_path(tmp, false);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw sdk::Error(TSR_ERR_IO, path + ": cannot rename into place: " + ec.message());
  return head.size();
}

}  // namespace tessera::formats::safetensors
