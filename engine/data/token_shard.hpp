// Writing token shards in llm.c's format (tessera/cpp/formats/token_shard.hpp,
// docs/data.md): uint16 tokens for vocabularies up to 65536 ids, uint32
// beyond. The reader is the `tokens` dataset plugin.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <tessera/cpp/formats/token_shard.hpp>
#include <vector>

namespace tessera::data {

inline constexpr int64_t kShardMaxTokens = formats::token_shard::kMaxTokens;

// Bytes per token a vocabulary of `vocab` ids needs in a shard: 2 up to
// 65536 ids, 4 beyond.
int token_width_for_vocab(int64_t vocab);

// Writes one split as a series of shards DIR/PREFIX_000000.bin,
// PREFIX_000001.bin, ..., each holding at most `shard_tokens` tokens. A
// shard is written under a temporary name and renamed when complete, so a
// file with the final name is always whole. Throws tessera::Error naming the
// file on any I/O failure. A `masked` writer writes tessera's masked form:
// each token with a loss-mask byte (1: a trained target), the mask after the
// shard's tokens. With `examples` too it takes whole examples
// (add_example) and writes each shard's example starts after its mask
// (versions 2001/2007): an example never spans two shards.
class ShardWriter {
 public:
  ShardWriter(std::filesystem::path dir, std::string prefix, int width, int64_t shard_tokens,
              bool masked = false, bool examples = false);
  ~ShardWriter();
  ShardWriter(const ShardWriter &) = delete;
  ShardWriter &operator=(const ShardWriter &) = delete;

  void add(uint32_t token, bool trained = true);
  void add(const std::vector<uint32_t> &tokens) {
    for (uint32_t t : tokens) add(t);
  }
  // `tokens` with their mask (same length; nonzero: trained).
  void add(const std::vector<uint32_t> &tokens, const std::vector<uint8_t> &mask);
  // One whole example with its mask (an `examples` writer): it starts a new
  // shard when it does not fit in the current one; one longer than
  // shard_tokens is an error.
  void add_example(const std::vector<uint32_t> &tokens, const std::vector<uint8_t> &mask);
  // Completes the last shard. With no token written at all, writes no file.
  void finish();

  int64_t tokens() const { return total_; }
  int64_t trained_tokens() const { return trained_; }
  bool masked() const { return masked_; }
  const std::vector<std::filesystem::path> &files() const { return files_; }

 private:
  void open_next();
  void flush_buffer();
  void close_current();

  std::filesystem::path dir_;
  std::string prefix_;
  int width_;
  int64_t shard_tokens_;
  std::FILE *file_ = nullptr;
  std::filesystem::path tmp_path_, final_path_;
  bool masked_ = false, examples_ = false;
  int64_t in_shard_ = 0, total_ = 0, trained_ = 0;
  std::vector<unsigned char> buffer_;
  std::vector<uint8_t> mask_;    // the current shard's, written at its end
  std::vector<int32_t> starts_;  // the current shard's example starts, after the mask
  std::vector<std::filesystem::path> files_;
};

// The shard files DIR/PREFIX_NNNNNN.bin (six digits) that exist now, sorted.
std::vector<std::filesystem::path> existing_shards(const std::filesystem::path &dir,
                                                   const std::string &prefix);

}  // namespace tessera::data
