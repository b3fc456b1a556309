#include "token_file.hpp"

#include <fcntl.h>
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

Shard::Shard(std::string path, std::string who) : path_(std::move(path)), who_(std::move(who)) {
  const std::string where = "tokens: shard '" + path_ + "'";
  // Checked before opening (and on the descriptor): open(2) on a FIFO
  // would wait for a writer.
  sdk::RegularFile f = sdk::open_regular_file(path_);
  if (f.refused) throw sdk::Error(TSR_ERR_INVALID, where + " " + f.why);
  if (!f) throw sdk::Error(TSR_ERR_IO, "tokens: cannot open shard '" + path_ + "': " + f.why);
  size_ = f.size;
  if (size_ < kHeaderBytes)
    throw sdk::Error(TSR_ERR_INVALID, where + " is " + std::to_string(size_) +
                                          " bytes, too short for the 1024-byte header");
  fd_ = f.release();
  try {
    unsigned char head[kHeaderBytes];
    read_at(head, sizeof head, 0);
    const auto parsed = formats::token_shard::parse(head, size_);
    if (!parsed.error.empty()) throw sdk::Error(TSR_ERR_INVALID, where + " " + parsed.error);
    width_ = parsed.width;
    count_ = parsed.count;
    masked_ = parsed.masked;
    examples_ = parsed.examples;
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

Shard::~Shard() {
  if (fd_ >= 0) ::close(fd_);
}

void Shard::read_at(void *dst, size_t bytes, uint64_t offset) const {
  auto *p = static_cast<unsigned char *>(dst);
  size_t got = 0;
  while (got < bytes) {
    const ssize_t r = ::pread(fd_, p + got, bytes - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    // A short read: the file is shorter than when it was opened.
    struct stat st {};
    const std::string now =
        ::fstat(fd_, &st) == 0 ? std::to_string(st.st_size) + " bytes now" : "its size unknown";
    throw sdk::Error(TSR_ERR_IO,
                     "tokens: shard '" + path_ + "'" + (who_.empty() ? "" : " (" + who_ + ")") +
                         ": " +
                         (r < 0 ? std::string("read failed: ") + std::strerror(errno)
                                : "bytes [" + std::to_string(offset) + ", " +
                                      std::to_string(offset + bytes) + ") are gone") +
                         "; it held " + std::to_string(size_) + " bytes when opened, " + now +
                         ": the file was truncated or rewritten in place while this job read it. "
                         "Replace a shard by writing a new file and renaming it over the old, "
                         "never by rewriting it");
  }
}

uint32_t Shard::at(int64_t i) const {
  int32_t v = 0;
  copy(i, 1, &v);
  return static_cast<uint32_t>(v);
}

void Shard::copy(int64_t from, int64_t n, int32_t *out) const {
  const size_t w = static_cast<size_t>(width_);
  // Read into `out` itself (n * 4 bytes hold n tokens of either width),
  // then widen uint16 in place from the back.
  read_at(out, static_cast<size_t>(n) * w, kHeaderBytes + static_cast<uint64_t>(from) * w);
  if (width_ == 2) {
    const auto *p = reinterpret_cast<const unsigned char *>(out);
    for (int64_t k = n - 1; k >= 0; --k) {
      uint16_t v;
      std::memcpy(&v, p + k * 2, 2);
      out[k] = v;
    }
  }
  // uint32 ids above INT32_MAX would wrap: the dataset rejects them.
}

void Shard::copy_mask(int64_t from, int64_t n, uint8_t *out) const {
  if (!masked_) {
    std::memset(out, 1, static_cast<size_t>(n));
    return;
  }
  // The mask follows all the tokens.
  const uint64_t mask_at = kHeaderBytes + static_cast<uint64_t>(count_) * uint64_t(width_);
  read_at(out, static_cast<size_t>(n), mask_at + static_cast<uint64_t>(from));
}

std::vector<int64_t> Shard::example_bounds() const {
  std::vector<int64_t> out;
  if (examples_ < 0) return out;
  std::vector<int32_t> raw(static_cast<size_t>(examples_));
  const uint64_t at = kHeaderBytes + static_cast<uint64_t>(count_) * uint64_t(width_ + 1);
  read_at(raw.data(), raw.size() * sizeof(int32_t), at);
  out.reserve(raw.size() + 1);
  for (size_t e = 0; e < raw.size(); ++e) {
    const int64_t v = raw[e];
    const bool ok = e == 0 ? v == 0 : v > out.back() && v < count_;
    if (!ok)
      throw sdk::Error(TSR_ERR_INVALID,
                       "tokens: shard '" + path_ + "': example start " + std::to_string(e) +
                           " is " + std::to_string(v) + (e == 0 ? ", expected 0" : "") +
                           "; the starts must rise strictly from 0 and stay below the " +
                           std::to_string(count_) + " tokens (a damaged file)");
    out.push_back(v);
  }
  if (out.empty() && count_ > 0)
    throw sdk::Error(TSR_ERR_INVALID, "tokens: shard '" + path_ + "' holds " +
                                          std::to_string(count_) +
                                          " tokens but records no example start (a damaged file)");
  out.push_back(count_);
  return out;
}

void Shard::check_ids(const int32_t *ids, int64_t from, int64_t n, uint64_t limit, int64_t vocab,
                      const std::string &section) const {
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t v = static_cast<uint32_t>(ids[j]);
    if (static_cast<uint64_t>(v) < limit) continue;
    const int64_t pos = from + j;
    throw sdk::Error(TSR_ERR_INVALID,
                     "tokens: " + section + " shard '" + path_ + "': token " + std::to_string(v) +
                         " at token offset " + std::to_string(pos) + " (byte offset " +
                         std::to_string(kHeaderBytes + uint64_t(pos) * uint64_t(width_)) + ") is " +
                         (vocab > 0 ? "not below vocab = " + std::to_string(vocab)
                                    : std::string("above 2^31 - 1")));
  }
}

}  // namespace tessera::tokens
