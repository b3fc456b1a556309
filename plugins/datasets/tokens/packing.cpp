#include "packing.hpp"

#include <algorithm>
#include <numeric>
#include <set>
#include <tessera/cpp/plugin.hpp>
#include <utility>

namespace tessera::tokens {

namespace sdk = tessera::sdk;

namespace {

// A target the loss ignores (ops.h: targets < 0), as Hugging Face writes it.
constexpr int32_t kIgnoredTarget = -100;

// Every example of every shard as pieces of at most T pairs, in shard order.
std::vector<Piece> cut_examples(const std::vector<std::unique_ptr<Shard>> &shards, int64_t T,
                                const std::string &section, Packing &p) {
  std::vector<Piece> out;
  for (size_t s = 0; s < shards.size(); ++s) {
    const Shard &shard = *shards[s];
    if (shard.examples() < 0)
      throw sdk::Error(
          TSR_ERR_INVALID,
          "tokens: " + section + " pack = true: shard '" + shard.path() + "' " +
              (shard.masked() ? "(version 1001/1007)" : "(plain tokens)") +
              " records no example starts; packing needs shards written by `tessera data "
              "tokenize --format chat|prompt-completion` of this version (2001/2007): tokenize "
              "the JSONL again");
    const std::vector<int64_t> bounds = shard.example_bounds();
    for (size_t e = 0; e + 1 < bounds.size(); ++e) {
      ++p.examples;
      const int64_t pairs = bounds[e + 1] - bounds[e] - 1;
      if (pairs < 1) {
        ++p.dropped;
        continue;
      }
      if (pairs > T) ++p.split;
      for (int64_t at = 0; at < pairs; at += T)
        out.push_back(Piece{static_cast<uint32_t>(s), bounds[e] + at, std::min(T, pairs - at)});
    }
  }
  return out;
}

}  // namespace

Packing plan_packing(const std::vector<std::unique_ptr<Shard>> &shards, int64_t T,
                     const std::string &section) {
  Packing p;
  const std::vector<Piece> raw = cut_examples(shards, T, section, p);
  // Best fit decreasing: the longest pieces first (ties in shard order),
  // each into the open window with the least room that still takes it.
  std::vector<size_t> order(raw.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return raw[a].len > raw[b].len; });
  std::set<std::pair<int64_t, size_t>> room;  // (free pairs, window) of windows not yet full
  std::vector<std::vector<size_t>> windows;
  for (size_t i : order) {
    const int64_t len = raw[i].len;
    auto it = room.lower_bound({len, size_t{0}});
    size_t w;
    int64_t left;
    if (it == room.end()) {
      w = windows.size();
      windows.emplace_back();
      left = T;
    } else {
      w = it->second;
      left = it->first;
      room.erase(it);
    }
    windows[w].push_back(i);
    left -= len;
    if (left > 0) room.insert({left, w});
    p.pairs += len;
  }
  p.first.reserve(windows.size() + 1);
  p.pieces.reserve(raw.size());
  for (auto &w : windows) {
    std::sort(w.begin(), w.end());  // shard order within the window
    p.first.push_back(static_cast<int64_t>(p.pieces.size()));
    for (size_t i : w) p.pieces.push_back(raw[i]);
  }
  p.first.push_back(static_cast<int64_t>(p.pieces.size()));
  return p;
}

void read_packed(const Packing &p, const std::vector<std::unique_ptr<Shard>> &shards, int64_t w,
                 int64_t T, uint64_t limit, int64_t vocab, const std::string &section, int32_t *x,
                 int32_t *y, int32_t *pos) {
  std::fill(x, x + T, 0);
  std::fill(y, y + T, kIgnoredTarget);
  std::fill(pos, pos + T, 0);
  std::vector<int32_t> tok(static_cast<size_t>(T + 1));
  std::vector<uint8_t> mask(static_cast<size_t>(T + 1));
  int64_t at = 0;
  for (int64_t i = p.first[static_cast<size_t>(w)]; i < p.first[static_cast<size_t>(w) + 1]; ++i) {
    const Piece &c = p.pieces[static_cast<size_t>(i)];
    const Shard &shard = *shards[c.shard];
    shard.copy(c.start, c.len + 1, tok.data());
    shard.check_ids(tok.data(), c.start, c.len + 1, limit, vocab, section);
    shard.copy_mask(c.start, c.len + 1, mask.data());
    for (int64_t j = 0; j < c.len; ++j) {
      x[at + j] = tok[static_cast<size_t>(j)];
      y[at + j] =
          mask[static_cast<size_t>(j + 1)] ? tok[static_cast<size_t>(j + 1)] : kIgnoredTarget;
      pos[at + j] = static_cast<int32_t>(j);
    }
    at += c.len;
  }
}

}  // namespace tessera::tokens
