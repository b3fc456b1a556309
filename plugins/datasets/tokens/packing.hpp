// Packing for the "tokens" dataset (`pack = true`, docs/data.md): whole
// examples of masked shards that record their starts (versions 2001/2007)
// share context windows, each with positions restarting at 0, so a model
// attends within each example only (ABI 1.8 positions, ops.h
// attention_packed_*).
//
// An example of L tokens gives L - 1 (input, target) pairs, so it fits a
// window of T when L - 1 <= T. A longer one is split into pieces of T
// pairs, as unpacked windows cut a stream (consecutive pieces share one
// token), the last piece holding the rest; each piece is an example of
// its own (its positions restart, it sees nothing of the pieces before).
// The pieces go into windows best fit decreasing (the longest first, each
// into the fullest window it fits, a new window when none), which is
// deterministic; a window's pieces are laid out in shard order. The tail of
// a window no piece fills is padding: input 0, target -100, position 0.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "token_file.hpp"

namespace tessera::tokens {

// Tokens [start, start + len] of shard `shard`: len (input, target) pairs.
struct Piece {
  uint32_t shard = 0;
  int64_t start = 0, len = 0;
};

struct Packing {
  std::vector<Piece> pieces;   // window after window
  std::vector<int64_t> first;  // window w holds pieces [first[w], first[w + 1])
  int64_t examples = 0;        // examples read from the shards
  int64_t split = 0;           // of them, longer than the context (split into pieces)
  int64_t dropped = 0;         // of them, a single token (no target to train)
  int64_t pairs = 0;           // (input, target) pairs over all windows

  int64_t windows() const { return first.empty() ? 0 : static_cast<int64_t>(first.size()) - 1; }
};

// The packing of every example of `shards` into windows of T pairs. Throws
// tessera::sdk::Error naming the file when a shard records no example
// starts (`section` words the message).
Packing plan_packing(const std::vector<std::unique_ptr<Shard>> &shards, int64_t T,
                     const std::string &section);

// Window w into x, y and pos (T each): the inputs, the next-token targets
// (-100 where the mask says not trained, and in the padding), and each
// token's position in its piece. Ids are checked below `limit` (vocab:
// for the message).
void read_packed(const Packing &p, const std::vector<std::unique_ptr<Shard>> &shards, int64_t w,
                 int64_t T, uint64_t limit, int64_t vocab, const std::string &section, int32_t *x,
                 int32_t *y, int32_t *pos);

}  // namespace tessera::tokens
