#include "token_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <tessera/cpp/plugin.hpp>
#include <tessera/cpp/regular_file.hpp>

namespace tessera::tokens {

namespace sdk = tessera::sdk;

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian; this reader assumes a little-endian host");

Shard::Shard(std::string path) : path_(std::move(path)) {
  const std::string where = "tokens: shard '" + path_ + "'";
  // Checked before opening (and on the descriptor): open(2) on a FIFO
  // would wait for a writer.
  sdk::RegularFile f = sdk::open_regular_file(path_);
  if (f.refused) throw sdk::Error(TSR_ERR_INVALID, where + " " + f.why);
  if (!f) throw sdk::Error(TSR_ERR_IO, "tokens: cannot open shard '" + path_ + "': " + f.why);
  const uint64_t size = f.size;
  if (size < kHeaderBytes)
    throw sdk::Error(TSR_ERR_INVALID, where + " is " + std::to_string(size) +
                                          " bytes, too short for the 1024-byte header");
  void *m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, f.fd, 0);
  if (m == MAP_FAILED)
    throw sdk::Error(TSR_ERR_IO,
                     "tokens: cannot map shard '" + path_ + "': " + std::strerror(errno));
  map_ = m;
  map_bytes_ = size;
  try {
    const auto parsed = formats::token_shard::parse(map_, size);
    if (!parsed.error.empty()) throw sdk::Error(TSR_ERR_INVALID, where + " " + parsed.error);
    width_ = parsed.width;
    count_ = parsed.count;
    tokens_ = static_cast<const unsigned char *>(map_) + kHeaderBytes;
    if (parsed.masked) mask_ = tokens_ + static_cast<size_t>(count_) * static_cast<size_t>(width_);
  } catch (...) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw;
  }
}

Shard::~Shard() {
  if (map_) ::munmap(map_, map_bytes_);
}

uint32_t Shard::at(int64_t i) const {
  if (width_ == 2) {
    uint16_t v;
    std::memcpy(&v, tokens_ + static_cast<size_t>(i) * 2, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, tokens_ + static_cast<size_t>(i) * 4, 4);
  return v;
}

void Shard::copy(int64_t from, int64_t n, int32_t *out) const {
  const unsigned char *p = tokens_ + static_cast<size_t>(from) * static_cast<size_t>(width_);
  if (width_ == 2) {
    for (int64_t k = 0; k < n; ++k) {
      uint16_t v;
      std::memcpy(&v, p + k * 2, 2);
      out[k] = v;
    }
  } else {
    // uint32 ids above INT32_MAX would wrap: the dataset rejects them.
    for (int64_t k = 0; k < n; ++k) {
      uint32_t v;
      std::memcpy(&v, p + k * 4, 4);
      out[k] = static_cast<int32_t>(v);
    }
  }
}

void Shard::copy_mask(int64_t from, int64_t n, uint8_t *out) const {
  if (!mask_) {
    std::memset(out, 1, static_cast<size_t>(n));
    return;
  }
  std::memcpy(out, mask_ + from, static_cast<size_t>(n));
}

}  // namespace tessera::tokens
