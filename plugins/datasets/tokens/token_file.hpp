// Reading token shards (llm.c's format, docs/data.md), memory-mapped
// read-only. A shard is a 1024-byte header of 256 little-endian int32 --
// magic, version, token count, then zeros -- followed by the tokens:
//   magic 20240520, version 1: uint16 tokens (llm.c's GPT-2 shards)
//   magic 20240801, version 7: uint32 tokens (llm.c's Llama-3 shards)
// The file must hold exactly 1024 + count * width bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera::tokens {

inline constexpr int32_t kMagicU16 = 20240520;
inline constexpr int32_t kVersionU16 = 1;
inline constexpr int32_t kMagicU32 = 20240801;
inline constexpr int32_t kVersionU32 = 7;
inline constexpr size_t kHeaderBytes = 256 * sizeof(int32_t);

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
  // Token `i` (0 <= i < count()).
  uint32_t at(int64_t i) const;
  // Copies tokens [from, from + n) into `out` as int32.
  void copy(int64_t from, int64_t n, int32_t *out) const;

 private:
  std::string path_;
  void *map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char *tokens_ = nullptr;
  int64_t count_ = 0;
  int width_ = 2;
};

}  // namespace tessera::tokens
