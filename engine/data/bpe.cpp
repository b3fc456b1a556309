#include "data/bpe.hpp"

#include <utf8proc.h>

#include <array>
#include <functional>
#include <limits>
#include <queue>

#include "util/error.hpp"

namespace tessera::data {

namespace {

constexpr uint32_t kNoId = std::numeric_limits<uint32_t>::max();

// bytes_to_unicode's image lies below U+0144 (256 + the 68 bytes remapped).
constexpr uint32_t kImageEnd = 0x144;

// The byte that code point cp stands for, or -1 when cp is outside the image.
int byte_of_code_point(uint32_t cp) {
  static const std::array<int16_t, kImageEnd> table = [] {
    std::array<int16_t, kImageEnd> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) {
      const std::string &s = byte_to_unicode(static_cast<uint8_t>(b));
      utf8proc_int32_t cp = 0;
      utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t *>(s.data()),
                       static_cast<utf8proc_ssize_t>(s.size()), &cp);
      t[static_cast<size_t>(cp)] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return cp < kImageEnd ? table[cp] : -1;
}

}  // namespace

const std::string &byte_to_unicode(uint8_t b) {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    uint32_t next = 256;
    for (uint32_t v = 0; v < 256; ++v) {
      const bool printable =
          (v >= '!' && v <= '~') || (v >= 0xA1 && v <= 0xAC) || (v >= 0xAE && v <= 0xFF);
      utf8proc_uint8_t buf[4];
      const auto n =
          utf8proc_encode_char(static_cast<utf8proc_int32_t>(printable ? v : next++), buf);
      t[v].assign(reinterpret_cast<const char *>(buf), static_cast<size_t>(n));
    }
    return t;
  }();
  return table[b];
}

std::string byte_level_decode(std::string_view symbol) {
  std::string out;
  out.reserve(symbol.size());
  const auto *p = reinterpret_cast<const utf8proc_uint8_t *>(symbol.data());
  size_t i = 0;
  while (i < symbol.size()) {
    utf8proc_int32_t cp = -1;
    utf8proc_ssize_t len =
        utf8proc_iterate(p + i, static_cast<utf8proc_ssize_t>(symbol.size() - i), &cp);
    if (len < 1) len = 1;  // not UTF-8: the byte stands for itself
    const int b = cp >= 0 ? byte_of_code_point(static_cast<uint32_t>(cp)) : -1;
    if (b >= 0)
      out += static_cast<char>(b);
    else
      out.append(symbol.substr(i, static_cast<size_t>(len)));
    i += static_cast<size_t>(len);
  }
  return out;
}

BpeModel::BpeModel(std::unordered_map<std::string, uint32_t> vocab,
                   const std::vector<BpeMerge> &merges, std::string vocab_name, bool ignore_merges)
    : vocab_(std::move(vocab)),
      vocab_name_(std::move(vocab_name)),
      merge_count_(merges.size()),
      ignore_merges_(ignore_merges) {
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(byte_to_unicode(static_cast<uint8_t>(b)));
    byte_ids_[b] = it == vocab_.end() ? kNoId : it->second;
  }
  rules_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const BpeMerge &m = merges[rank];
    auto l = vocab_.find(m.left), r = vocab_.find(m.right);
    // A merge of a symbol the vocabulary lacks can never apply: such a
    // symbol only comes from a merge, and that merge fails first.
    if (l == vocab_.end() || r == vocab_.end()) continue;
    const uint64_t key = pair_key(l->second, r->second);
    if (rules_.count(key)) continue;
    auto made = vocab_.find(m.left + m.right);
    if (made == vocab_.end()) {
      unmade_.emplace(key, m.left + m.right);
      if (!first_unmade_) first_unmade_ = m.left + " " + m.right;
    }
    rules_.emplace(key,
                   Rule{static_cast<uint32_t>(rank), made == vocab_.end() ? kNoId : made->second});
  }
}

std::optional<uint8_t> BpeModel::missing_byte() const {
  for (int b = 0; b < 256; ++b)
    if (byte_ids_[b] == kNoId) return static_cast<uint8_t>(b);
  return std::nullopt;
}

// The lowest-ranked pair first, the leftmost of equals, until none applies:
// what GPT-2's encoder (all occurrences of the best pair, left to right) and
// tokenizers (a priority queue) both compute for a trained vocabulary, where
// a merge's result only pairs into merges of higher rank. The queue keeps a
// long word (a megabyte without a space) at O(n log n) where rescanning the
// word for every merge would be O(n^2).
void BpeModel::merge_word(std::vector<uint32_t> &word) const {
  const int n = static_cast<int>(word.size());
  if (n < 2) return;
  std::vector<int> next(static_cast<size_t>(n)), prev(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    next[static_cast<size_t>(i)] = i + 1 < n ? i + 1 : -1;
    prev[static_cast<size_t>(i)] = i - 1;
  }
  struct Candidate {
    uint32_t rank;
    int pos;  // the left symbol's index
    uint32_t left, right;
    bool operator>(const Candidate &o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](int i) {
    const int j = i < 0 ? -1 : next[static_cast<size_t>(i)];
    if (j < 0) return;
    const uint32_t a = word[static_cast<size_t>(i)], b = word[static_cast<size_t>(j)];
    if (auto it = rules_.find(pair_key(a, b)); it != rules_.end())
      queue.push({it->second.rank, i, a, b});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    const auto i = static_cast<size_t>(c.pos);
    const int j = next[i];
    // Stale: one of the two symbols has merged since the pair was queued.
    if (word[i] != c.left || j < 0 || word[static_cast<size_t>(j)] != c.right) continue;
    const Rule &rule = rules_.at(pair_key(c.left, c.right));
    if (rule.merged == kNoId)
      throw Error(TSR_ERR_INVALID, "'" + vocab_name_ + "' has no token '" +
                                       unmade_.at(pair_key(c.left, c.right)) +
                                       "' that the merges make (vocabulary and merges do not "
                                       "belong together?)");
    word[i] = rule.merged;
    word[static_cast<size_t>(j)] = kNoId;  // gone
    next[i] = next[static_cast<size_t>(j)];
    if (next[i] >= 0) prev[static_cast<size_t>(next[i])] = c.pos;
    consider(prev[i]);
    consider(c.pos);
  }
  size_t to = 0;
  for (int i = 0; i >= 0; i = next[static_cast<size_t>(i)])
    word[to++] = word[static_cast<size_t>(i)];
  word.resize(to);
}

void BpeModel::encode(std::string_view bytes, std::vector<uint32_t> &out) {
  if (bytes.empty()) return;
  if (auto it = cache_.find(bytes); it != cache_.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  std::vector<uint32_t> word;
  if (ignore_merges_) {
    std::string symbol;
    for (unsigned char b : bytes) symbol += byte_to_unicode(b);
    if (auto it = vocab_.find(symbol); it != vocab_.end()) word.push_back(it->second);
  }
  if (word.empty()) {
    word.reserve(bytes.size());
    for (unsigned char b : bytes) {
      if (byte_ids_[b] == kNoId)
        throw Error(TSR_ERR_INVALID, "'" + vocab_name_ + "' has no token for byte " +
                                         std::to_string(b) +
                                         " (a byte-level BPE vocabulary has all 256)");
      word.push_back(byte_ids_[b]);
    }
    merge_word(word);
  }
  out.insert(out.end(), word.begin(), word.end());
  if (cache_.size() >= (size_t{1} << 18)) cache_.clear();
  cache_.emplace(std::string(bytes), std::move(word));
}

}  // namespace tessera::data
