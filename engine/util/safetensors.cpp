#include "util/safetensors.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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

// The JSON header of a safetensors file mapped at `bytes` (`size` long);
// *data_start: where the tensors' bytes begin.
nlohmann::json read_header(const char *bytes, size_t size, const std::string &path,
                           size_t *data_start) {
  if (size < 8) throw Error(TSR_ERR_INVALID, path + ": too short for a safetensors file");
  uint64_t hlen;
  std::memcpy(&hlen, bytes, 8);
  if (hlen > size - 8 || hlen > (100u << 20))
    throw Error(TSR_ERR_INVALID, path + ": header length " + std::to_string(hlen) +
                                     " exceeds the file (" + std::to_string(size) + " bytes)");
  *data_start = 8 + hlen;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(bytes + 8, bytes + *data_start);
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
  // Mapped, not read (the tensors point into the mapping); a regular file
  // only (a FIFO or a device has no length to map).
  RegularFile f = open_regular(path, "safetensors file");
  if (f.size < 8) throw Error(TSR_ERR_INVALID, path + ": too short for a safetensors file");
  if (f.size > std::numeric_limits<size_t>::max())
    throw Error(TSR_ERR_INVALID, path + ": larger than the address space");
  size_ = static_cast<size_t>(f.size);
  void *m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, f.fd, 0);
  if (m == MAP_FAILED)
    throw Error(TSR_ERR_IO, path + ": cannot map the safetensors file: " + std::strerror(errno));
  map_ = static_cast<const char *>(m);
  try {
    parse();
  } catch (...) {
    ::munmap(m, size_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<char *>(map_), size_);
}

void SafetensorsFile::release(const void *data, size_t bytes) const {
  const char *p = static_cast<const char *>(data);
  if (!map_ || bytes == 0 || p < map_ || p + bytes > map_ + size_) return;
  // Whole pages only outward-rounded: the neighbours' bytes in a shared
  // edge page are read again from the file if touched (the mapping is
  // read-only, so nothing is lost).
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t e = reinterpret_cast<uintptr_t>(p + bytes);
  ::madvise(reinterpret_cast<void *>(b), e - b, MADV_DONTNEED);
}

void SafetensorsFile::parse() {
  const std::string &path = path_;
  size_t data_start = 0;
  const nlohmann::json j = read_header(map_, size_, path, &data_start);
  const size_t data_len = size_ - data_start;
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
    st.data = map_ + data_start + offset;
    tensors_[name] = std::move(st);
  }
  check_no_overlap(path, ranges);
  release(map_, data_start);  // the header, parsed
}

const StTensor &SafetensorsFile::get(const std::string &name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    throw Error(TSR_ERR_INVALID, path_ + ": no tensor named '" + name + "'");
  return it->second;
}

}  // namespace tessera
