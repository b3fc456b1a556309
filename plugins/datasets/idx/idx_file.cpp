#include "idx_file.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <tessera/cpp/plugin.hpp>
#include <tessera/cpp/regular_file.hpp>
#include <type_traits>

namespace tessera::idx {
namespace {

struct GzCloser {
  void operator()(gzFile f) const {
    if (f) gzclose(f);
  }
};
using GzPtr = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

std::string hex(uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*x", digits, v);
  return buf;
}

class Reader {
 public:
  Reader(const std::string &path, const std::string &role) : path_(path), role_(role) {
    // A regular file only: gzopen on a FIFO would wait for a writer.
    sdk::RegularFile f = sdk::open_regular_file(path);
    if (f.refused) throw sdk::Error(TSR_ERR_INVALID, "idx: " + where() + " " + f.why);
    if (!f)
      throw sdk::Error(TSR_ERR_IO, "idx: cannot open " + role + " file '" + path + "': " + f.why);
    file_.reset(gzdopen(f.fd, "rb"));
    if (!file_)
      throw sdk::Error(TSR_ERR_NO_MEMORY, "idx: cannot open " + where() + ": out of memory");
    f.release();  // gzclose closes it
    gzbuffer(file_.get(), 1u << 20);
  }

  std::string where() const { return role_ + " file '" + path_ + "'"; }

  // Reads up to `n` bytes; returns how many were read (fewer only at the end).
  size_t read(void *dst, size_t n) {
    size_t done = 0;
    while (done < n) {
      const size_t chunk = std::min<size_t>(n - done, 1u << 30);
      const int got =
          gzread(file_.get(), static_cast<char *>(dst) + done, static_cast<unsigned>(chunk));
      if (got < 0) fail_read();
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    // A gzip stream cut short reads as a short count plus an error.
    int err = Z_OK;
    gzerror(file_.get(), &err);
    if (err != Z_OK && err != Z_STREAM_END) fail_read();
    return done;
  }

 private:
  [[noreturn]] void fail_read() {
    const int saved_errno = errno;
    int err = Z_OK;
    const char *msg = gzerror(file_.get(), &err);
    const std::string reason = msg && *msg ? msg : "read error";
    if (err == Z_ERRNO)
      throw sdk::Error(TSR_ERR_IO,
                       "idx: cannot read " + where() + ": " + std::strerror(saved_errno));
    // The file reads, but its gzip stream is cut short or corrupt.
    const char *what = err == Z_BUF_ERROR ? "truncated gzip stream" : "corrupt gzip stream";
    throw sdk::Error(TSR_ERR_INVALID, "idx: " + where() + ": " + what + " (" + reason + ")");
  }

  std::string path_, role_;
  GzPtr file_;
};

uint32_t be32(const uint8_t *p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

IdxArray read_idx_u8(const std::string &path, const std::string &role, uint32_t ndim) {
  Reader in(path, role);
  const uint32_t expected_magic = 0x00000800u | ndim;

  uint8_t head[4];
  const size_t got_head = in.read(head, sizeof head);
  if (got_head < sizeof head)
    throw sdk::Error(TSR_ERR_INVALID, "idx: " + in.where() + " is too short for an IDX header (" +
                                          std::to_string(got_head) + " bytes)");
  const uint32_t magic = be32(head);
  if (magic != expected_magic) {
    std::string why;
    if (head[0] != 0 || head[1] != 0)
      why = "not an IDX file";
    else if (head[2] != 0x08)
      why = "element type " + hex(head[2], 2) + " is not unsigned byte (0x08)";
    else
      why = std::to_string(head[3]) + " dimensions, expected " + std::to_string(ndim);
    throw sdk::Error(TSR_ERR_INVALID, "idx: " + in.where() + " has magic " + hex(magic, 8) +
                                          ", expected " + hex(expected_magic, 8) + ": " + why);
  }

  IdxArray out;
  out.dims.resize(ndim);
  uint64_t total = 1;
  for (uint32_t d = 0; d < ndim; ++d) {
    uint8_t b[4];
    if (in.read(b, 4) < 4)
      throw sdk::Error(TSR_ERR_INVALID, "idx: " + in.where() + " is truncated inside its header");
    out.dims[d] = be32(b);
    total *= out.dims[d];  // at most 3 dims of 2^32: checked against the cap below
    if (total > kMaxIdxBytes)
      throw sdk::Error(TSR_ERR_INVALID, "idx: " + in.where() + " declares more than " +
                                            std::to_string(kMaxIdxBytes >> 30) + " GiB of data");
  }
  if (total == 0)
    throw sdk::Error(TSR_ERR_INVALID, "idx: " + in.where() + " holds no data (a dimension is 0)");

  // Grow with what the file actually holds, never more than the header
  // says: read through a fixed buffer, so that memory follows the data that
  // arrives rather than the header's number (a gzip stream's length is not
  // known before it is read).
  const size_t chunk = size_t{1} << 20;
  std::unique_ptr<uint8_t[]> buf(new uint8_t[chunk]);
  size_t have = 0;
  while (have < total) {
    const size_t want = std::min<size_t>(chunk, total - have);
    const size_t got = in.read(buf.get(), want);
    out.data.insert(out.data.end(), buf.get(), buf.get() + got);
    have += got;
    if (got < want) {
      throw sdk::Error(TSR_ERR_INVALID, "idx: " + in.where() + " is truncated: its header says " +
                                            std::to_string(total) + " bytes of data, it holds " +
                                            std::to_string(have));
    }
  }
  uint8_t extra[4096];
  const size_t trailing = in.read(extra, sizeof extra);
  if (trailing > 0)
    throw sdk::Error(TSR_ERR_INVALID, "idx: " + in.where() + " has data after the " +
                                          std::to_string(total) +
                                          " bytes its header declares (wrong header?)");
  return out;
}

}  // namespace tessera::idx
