// The byte-level BPE model shared by GPT-2's own files (tokenizer_bpe) and
// Hugging Face's tokenizer.json (tokenizer_json): a word's UTF-8 bytes become
// one symbol each (GPT-2's bytes_to_unicode form), then the lowest-ranked
// pair that a merge applies to is merged, the leftmost of equals first,
// until none applies; the symbols are the ids. Results are cached per word,
// since a corpus repeats its words.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tessera::data {

// GPT-2's bytes_to_unicode: the character (UTF-8) that stands for byte b in
// a byte-level vocabulary.
const std::string &byte_to_unicode(uint8_t b);

// The bytes a byte-level symbol stands for: each character mapped back
// through bytes_to_unicode; a character outside its image (or bytes that are
// not UTF-8) stands for its own bytes.
std::string byte_level_decode(std::string_view symbol);

struct BpeMerge {
  std::string left, right;
};

class BpeModel {
 public:
  // `vocab`: symbol (bytes_to_unicode form) -> id; `merges` by rank (the
  // first of two equal pairs wins). `vocab_name` names the vocabulary's file
  // in messages. With `ignore_merges` (Llama 3), a word that is itself in the
  // vocabulary is that one token, merges or not.
  BpeModel(std::unordered_map<std::string, uint32_t> vocab, const std::vector<BpeMerge> &merges,
           std::string vocab_name, bool ignore_merges);

  // Appends the ids of word `bytes` (one pre-token, raw bytes). Throws
  // tessera::Error when a merge makes a symbol the vocabulary lacks. Not
  // thread-safe (it caches).
  void encode(std::string_view bytes, std::vector<uint32_t> &out);

  const std::unordered_map<std::string, uint32_t> &vocab() const { return vocab_; }
  size_t merges() const { return merge_count_; }
  // The first byte with no token: a byte-level vocabulary has all 256.
  std::optional<uint8_t> missing_byte() const;
  // The first merge (by rank) whose result the vocabulary lacks, as "A B".
  std::optional<std::string> unmade_merge() const { return first_unmade_; }

 private:
  struct Rule {
    uint32_t rank, merged;
  };
  static uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t{a} << 32) | b; }
  void merge_word(std::vector<uint32_t> &word) const;

  std::unordered_map<std::string, uint32_t> vocab_;
  std::unordered_map<uint64_t, Rule> rules_;          // (left id, right id) -> rule
  std::unordered_map<uint64_t, std::string> unmade_;  // rules whose result is missing
  struct Hash {  // lets the cache be searched with a string_view
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  std::unordered_map<std::string, std::vector<uint32_t>, Hash, std::equal_to<>> cache_;
  uint32_t byte_ids_[256];
  std::string vocab_name_;
  std::optional<std::string> first_unmade_;
  size_t merge_count_ = 0;
  bool ignore_merges_ = false;
};

}  // namespace tessera::data
