// llm.c's token shard format (docs/data.md), header-only, for both sides:
// the writer (`tessera data`, engine/data/token_shard.cpp) and the reader
// (the `tokens` dataset plugin). A shard is a 1024-byte header of 256
// little-endian int32 (magic, version, token count, then zeros) followed by
// exactly `count` tokens:
//   magic 20240520, version 1: uint16 tokens (llm.c's GPT-2 shards)
//   magic 20240801, version 7: uint32 tokens (llm.c's Llama-3 shards)
// and tessera's masked forms, which add a loss mask after the tokens:
// `count` bytes, one per token, 1 where the token is a trained target and 0
// where it is context only (a prompt, a chat header; docs/data.md):
//   magic 20240520, version 1001: uint16 tokens, then the mask
//   magic 20240801, version 1007: uint32 tokens, then the mask
// Versions far from llm.c's keep an llm.c reader from taking a masked shard
// for a plain one (it refuses the version). Masked shards with example
// boundaries (packing, docs/data.md) add, after the mask, the start of
// every example: header int32 [3] = E, then E little-endian int32 token
// offsets, the first 0, strictly increasing, each below `count`:
//   magic 20240520, version 2001: uint16 tokens, the mask, the starts
//   magic 20240801, version 2007: uint32 tokens, the mask, the starts
#pragma once

#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace tessera::formats::token_shard {

inline constexpr int32_t kMagicU16 = 20240520;
inline constexpr int32_t kVersionU16 = 1;
inline constexpr int32_t kMagicU32 = 20240801;
inline constexpr int32_t kVersionU32 = 7;
inline constexpr int32_t kVersionU16Masked = 1001;
inline constexpr int32_t kVersionU32Masked = 1007;
inline constexpr int32_t kVersionU16Examples = 2001;
inline constexpr int32_t kVersionU32Examples = 2007;
inline constexpr size_t kHeaderInts = 256;
inline constexpr size_t kHeaderBytes = kHeaderInts * sizeof(int32_t);
// The count is an int32 in the header.
inline constexpr int64_t kMaxTokens = INT32_MAX;

// The header of a shard of `count` tokens (<= kMaxTokens) of `width` bytes
// (2 or 4), with a loss mask after them when `masked`, and the starts of
// `examples` examples after the mask when examples >= 0 (masked only).
inline std::array<int32_t, kHeaderInts> header(int width, int64_t count, bool masked = false,
                                               int64_t examples = -1) {
  std::array<int32_t, kHeaderInts> h{};
  h[0] = width == 2 ? kMagicU16 : kMagicU32;
  if (masked && examples >= 0)
    h[1] = width == 2 ? kVersionU16Examples : kVersionU32Examples;
  else
    h[1] = width == 2 ? (masked ? kVersionU16Masked : kVersionU16)
                      : (masked ? kVersionU32Masked : kVersionU32);
  h[2] = static_cast<int32_t>(count);
  h[3] = masked && examples >= 0 ? static_cast<int32_t>(examples) : 0;
  return h;
}

// What a shard's header says, checked against the file's size.
struct Parsed {
  int width = 0;          // bytes per token, 2 or 4
  int64_t count = 0;      // tokens
  bool masked = false;    // a loss mask of `count` bytes follows the tokens
  int64_t examples = -1;  // example starts after the mask (versions 2001/2007); -1: none
  std::string error;      // "" when valid; else what is wrong, to follow the file's name
};

// `head` holds the file's first bytes (at least 16; the caller has checked
// file_bytes >= kHeaderBytes).
inline Parsed parse(const void *head, uint64_t file_bytes) {
  Parsed p;
  int32_t h[4];
  std::memcpy(h, head, sizeof h);
  const int32_t magic = h[0], count = h[2];
  int32_t version = h[1];
  // Versions 2001/2007: the masked form with example starts.
  const bool with_examples = version == kVersionU16Examples || version == kVersionU32Examples;
  if (with_examples) {
    if (h[3] < 0) {
      p.error = "has a negative example count " + std::to_string(h[3]);
      return p;
    }
    p.examples = h[3];
    version -= kVersionU16Examples - kVersionU16Masked;
  }
  const auto fail = [&](std::string why) {
    p.error = std::move(why);
    return p;
  };
  if (magic == kMagicU16) {
    if (version != kVersionU16 && version != kVersionU16Masked)
      return fail("has magic " + std::to_string(magic) + " (uint16 tokens) but version " +
                  std::to_string(h[1]) + ", expected " + std::to_string(kVersionU16) + ", " +
                  std::to_string(kVersionU16Masked) + " (with a loss mask) or " +
                  std::to_string(kVersionU16Examples) + " (a loss mask and example starts)");
    p.width = 2;
    p.masked = version == kVersionU16Masked;
  } else if (magic == kMagicU32) {
    if (version != kVersionU32 && version != kVersionU32Masked)
      return fail("has magic " + std::to_string(magic) + " (uint32 tokens) but version " +
                  std::to_string(h[1]) + ", expected " + std::to_string(kVersionU32) + ", " +
                  std::to_string(kVersionU32Masked) + " (with a loss mask) or " +
                  std::to_string(kVersionU32Examples) + " (a loss mask and example starts)");
    p.width = 4;
    p.masked = version == kVersionU32Masked;
  } else {
    return fail("has magic " + std::to_string(magic) + ", expected " + std::to_string(kMagicU16) +
                " (uint16 tokens) or " + std::to_string(kMagicU32) +
                " (uint32 tokens): not a token shard");
  }
  if (count < 0) return fail("has a negative token count " + std::to_string(count));
  const uint64_t per_token = uint64_t(p.width) + (p.masked ? 1 : 0);
  const uint64_t starts = p.examples > 0 ? static_cast<uint64_t>(p.examples) * 4 : 0;
  const uint64_t expect = kHeaderBytes + static_cast<uint64_t>(count) * per_token + starts;
  if (file_bytes < expect)
    return fail("is truncated: its header says " + std::to_string(count) + " tokens of " +
                std::to_string(p.width) + " bytes" + (p.masked ? " and their loss mask" : "") +
                (p.examples >= 0 ? " and " + std::to_string(p.examples) + " example starts" : "") +
                " (" + std::to_string(expect) + " bytes with the header), the file has " +
                std::to_string(file_bytes) + " bytes");
  if (file_bytes > expect)
    return fail("has " + std::to_string(file_bytes - expect) + " bytes after the " +
                std::to_string(count) + " tokens its header declares (" + std::to_string(expect) +
                " bytes expected): wrong count or a damaged file");
  p.count = count;
  return p;
}

}  // namespace tessera::formats::token_shard
