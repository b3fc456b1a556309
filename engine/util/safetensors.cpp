#include "util/safetensors.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "util/error.hpp"
#include "util/regular_file.hpp"

namespace tessera {

namespace {

// The JSON header of a safetensors file held in `bytes`; *data_start: where
// the tensors' bytes begin.
nlohmann::json read_header(const std::string &bytes, const std::string &path, size_t *data_start) {
  const size_t size = bytes.size();
  if (size < 8) throw Error(TSR_ERR_INVALID, path + ": too short for a safetensors file");
  uint64_t hlen;
  std::memcpy(&hlen, bytes.data(), 8);
  if (hlen > size - 8 || hlen > (100u << 20))
    throw Error(TSR_ERR_INVALID, path + ": header length " + std::to_string(hlen) +
                                     " exceeds the file (" + std::to_string(size) + " bytes)");
  *data_start = 8 + hlen;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(bytes.begin() + 8,
                              bytes.begin() + static_cast<ptrdiff_t>(*data_start));
  } catch (const nlohmann::json::exception &e) {
    throw Error(TSR_ERR_INVALID, path + ": header is not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(TSR_ERR_INVALID, path + ": header is not a JSON object");
  return j;
}

// The byte range [begin, end) of the data a tensor reads.
struct ByteRange {
  size_t begin, end;
  std::string name;
};

// Tensor `name`'s header entry, checked against the data's `data_len`
// bytes: a known dtype, at most 16 dims each no larger than the data, and
// offsets inside the data that match shape and dtype. Its range, if not
// empty, is added to `ranges`; st.data is left to the caller.
StTensor read_tensor_entry(const std::string &path, const std::string &name,
                           const nlohmann::json &t, size_t data_len, size_t *offset,
                           std::vector<ByteRange> &ranges) {
  auto bad = [&](const std::string &why) {
    throw Error(TSR_ERR_INVALID, path + ": tensor '" + name + "': " + why);
  };
  if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
    bad("needs dtype, shape and data_offsets");
  StTensor st;
  st.name = name;
  if (!t["dtype"].is_string()) bad("dtype is not a string");
  st.dtype = t["dtype"].get<std::string>();
  size_t esize = st_dtype_size(st.dtype);
  if (esize == 0) bad("unknown dtype " + st.dtype);
  if (!t["shape"].is_array() || t["shape"].size() > 16)
    bad("shape must be an array of at most 16 dims");
  size_t numel = 1;
  for (const auto &d : t["shape"]) {
    // A dimension is a non-negative integer no larger than the data: the
    // element count can then neither overflow nor exceed the file.
    if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
      bad("bad dimension");
    const uint64_t v = d.get<uint64_t>();
    if (v > data_len) bad("dimension " + std::to_string(v) + " is larger than the file");
    if (v > 0 && numel > data_len / v) bad("shape larger than the file");
    numel *= static_cast<size_t>(v);
    st.shape.push_back(static_cast<int64_t>(v));
  }
  const auto &off = t["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned())
    bad("data_offsets must be two non-negative integers");
  size_t b = off[0].get<size_t>(), e = off[1].get<size_t>();
  if (b > e || e > data_len)
    bad("data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
        ") fall outside the data (" + std::to_string(data_len) + " bytes)");
  if (e - b != numel * esize) bad("byte range does not match shape and dtype");
  st.bytes = e - b;
  *offset = b;
  if (e > b) ranges.push_back({b, e, name});
  return st;
}

// Two tensors over the same bytes: a crafted file that loads one tensor's
// values into another (the format writes each tensor's bytes once).
void check_no_overlap(const std::string &path, std::vector<ByteRange> &ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const ByteRange &x, const ByteRange &y) { return x.begin < y.begin; });
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].begin < ranges[i - 1].end)
      throw Error(TSR_ERR_INVALID,
                  path + ": tensors '" + ranges[i - 1].name + "' and '" + ranges[i].name +
                      "' overlap: data_offsets [" + std::to_string(ranges[i - 1].begin) + ", " +
                      std::to_string(ranges[i - 1].end) + ") and [" +
                      std::to_string(ranges[i].begin) + ", " + std::to_string(ranges[i].end) + ")");
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string &path) : path_(path) {
  // Held in memory whole (the tensors point into it): as large as the
  // file, which must be a regular one (a FIFO or /dev/zero would never end).
  bytes_ = read_regular(path, "safetensors file", std::numeric_limits<uint64_t>::max());
  size_t data_start = 0;
  const nlohmann::json j = read_header(bytes_, path, &data_start);
  const size_t data_len = bytes_.size() - data_start;
  std::vector<ByteRange> ranges;
  for (auto &item : j.items()) {
    const std::string name = item.key();
    const auto &t = item.value();
    if (name == "__metadata__") {
      if (t.is_object())
        for (auto &[k, v] : t.items())
          if (v.is_string()) metadata_[k] = v.get<std::string>();
      continue;
    }
    size_t offset = 0;
    StTensor st = read_tensor_entry(path, name, t, data_len, &offset, ranges);
    st.data = bytes_.data() + data_start + offset;
    tensors_[name] = std::move(st);
  }
  check_no_overlap(path, ranges);
}

const StTensor &SafetensorsFile::get(const std::string &name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    throw Error(TSR_ERR_INVALID, path_ + ": no tensor named '" + name + "'");
  return it->second;
}

}  // namespace tessera
