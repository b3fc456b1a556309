// Reading token shards (llm.c's format: tessera/cpp/formats/token_shard.hpp,
// docs/data.md), memory-mapped read-only. The file must hold exactly its
// header and the tokens it declares.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <tessera/cpp/formats/token_shard.hpp>

namespace tessera::tokens {

inline constexpr size_t kHeaderBytes = formats::token_shard::kHeaderBytes;

class Shard {
 public:
  // Maps `path` and checks its header against its length. Throws
  // tessera::sdk::Error naming the file: TSR_ERR_IO when it cannot be opened
  // or mapped, TSR_ERR_INVALID when it is not a valid shard.
  explicit Shard(std::string path);
  ~Shard();
  Shard(const Shard &) = delete;
  Shard &operator=(const Shard &) = delete;

  const std::string &path() const { return path_; }
  int64_t count() const { return count_; }
  int width() const { return width_; }  // bytes per token: 2 or 4
  // A masked shard (tessera's versions 1001/1007) carries a loss-mask byte
  // per token, nonzero where the token is a trained target.
  bool masked() const { return mask_ != nullptr; }
  // Token `i` (0 <= i < count()).
  uint32_t at(int64_t i) const;
  // Copies tokens [from, from + n) into `out` as int32.
  void copy(int64_t from, int64_t n, int32_t *out) const;
  // Copies mask bytes [from, from + n) into `out`; a shard without a mask
  // trains every token (all 1).
  void copy_mask(int64_t from, int64_t n, uint8_t *out) const;

 private:
  std::string path_;
  void *map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char *tokens_ = nullptr;
  const unsigned char *mask_ = nullptr;  // after the tokens, in a masked shard
  int64_t count_ = 0;
  int width_ = 2;
};

}  // namespace tessera::tokens
