// Reading token shards (llm.c's format: tessera/cpp/formats/token_shard.hpp,
// docs/data.md). The file must hold exactly its header and the tokens it
// declares. Tokens are read with pread(2) into the caller's buffer, not
// through a memory map: a shard truncated while a job reads it then gives
// a short read and an error naming the file and the rank, where a mapping
// would kill the process with SIGBUS (a handler for that would be
// process-wide, shared with the engine and every other plugin, and would
// have to jump out of a memcpy). One pread per window of T + 1 tokens costs
// about a microsecond from the page cache, against milliseconds of model
// work per window, and the kernel's readahead serves sequential windows as
// it served the mapping. The descriptor stays open for the shard's life: a
// shard replaced (renamed over) while a job reads it is read as it was
// opened, consistently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <tessera/cpp/formats/token_shard.hpp>
#include <vector>

namespace tessera::tokens {

inline constexpr size_t kHeaderBytes = formats::token_shard::kHeaderBytes;

class Shard {
 public:
  // Opens `path` and checks its header against its length. Throws
  // tessera::sdk::Error naming the file: TSR_ERR_IO when it cannot be
  // opened or read, TSR_ERR_INVALID when it is not a valid shard. `who`
  // ("rank 1") is named in the errors of later reads.
  explicit Shard(std::string path, std::string who = "");
  ~Shard();
  Shard(const Shard &) = delete;
  Shard &operator=(const Shard &) = delete;

  const std::string &path() const { return path_; }
  int64_t count() const { return count_; }
  int width() const { return width_; }  // bytes per token: 2 or 4
  // A masked shard (tessera's versions 1001/1007) carries a loss-mask byte
  // per token, nonzero where the token is a trained target.
  bool masked() const { return masked_; }
  // Token `i` (0 <= i < count()).
  uint32_t at(int64_t i) const;
  // Copies tokens [from, from + n) into `out` as int32. Throws
  // tessera::sdk::Error (TSR_ERR_IO) naming the file and `who` when the
  // file no longer holds them (truncated since it was opened).
  void copy(int64_t from, int64_t n, int32_t *out) const;
  // Copies mask bytes [from, from + n) into `out`; a shard without a mask
  // trains every token (all 1).
  void copy_mask(int64_t from, int64_t n, uint8_t *out) const;
  // Versions 2001/2007 record where each example starts: the number of
  // them, -1 for a shard without the record.
  int64_t examples() const { return examples_; }
  // The example starts, checked (the first 0, strictly increasing, below
  // count()), with count() appended: example e is tokens [s[e], s[e + 1]).
  // Throws tessera::sdk::Error naming the file when the record is
  // inconsistent.
  std::vector<int64_t> example_bounds() const;
  // Throws naming the file, the token and its offsets unless every id of
  // tokens [from, from + n) (read into `ids`) is below `limit`; `vocab`
  // (0: none) and `section` word the message.
  void check_ids(const int32_t *ids, int64_t from, int64_t n, uint64_t limit, int64_t vocab,
                 const std::string &section) const;

 private:
  // Reads `bytes` bytes at `offset` into dst, or throws naming the file.
  void read_at(void *dst, size_t bytes, uint64_t offset) const;

  std::string path_, who_;
  int fd_ = -1;
  uint64_t size_ = 0;
  int64_t count_ = 0;
  int width_ = 2;
  bool masked_ = false;    // a loss mask of count_ bytes follows the tokens
  int64_t examples_ = -1;  // example starts after the mask (int32 each), -1: none
};

}  // namespace tessera::tokens
