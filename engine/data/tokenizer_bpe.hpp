// GPT-2's byte-level BPE tokenizer, written from its definition (OpenAI's
// encoder.py): text is split by GPT-2's pre-tokenization regex, each piece's
// UTF-8 bytes are mapped to printable characters (bytes_to_unicode), and the
// merges of vocab.bpe are applied by rank until none applies; the resulting
// symbols are looked up in encoder.json. The merging is data/bpe.hpp's, which
// Hugging Face's tokenizer.json (data/tokenizer_json.hpp) shares.
//
// The regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// is matched by hand. \s is Unicode White_Space; \p{L} and \p{N} come from a
// table of Unicode 14 letter and number ranges (unassigned code points inside
// a range count as that range's class), so characters added after Unicode 14
// may split differently from Python's regex module. Bytes that are not valid
// UTF-8 are pieces of class "other", one byte each, and still tokenize
// (every byte has a token).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/bpe.hpp"

namespace tessera::data {

enum class CharClass { kLetter, kNumber, kSpace, kOther };

// The class of Unicode code point `cp` as the pre-tokenizer sees it.
CharClass char_class(uint32_t cp);

// GPT-2's pre-tokenization of UTF-8 `text`: the pieces, in order, that
// together are exactly `text`.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

class Gpt2Bpe {
 public:
  // Reads encoder.json (token string -> id) and vocab.bpe (a "#version"
  // line, then one merge "A B" per line, by rank). Throws tessera::Error
  // naming the file when either cannot be read or is malformed.
  static Gpt2Bpe load(const std::filesystem::path &encoder_json,
                      const std::filesystem::path &vocab_bpe);
  // The same from the files' contents; `encoder_name` and `bpe_name` name
  // them in messages.
  Gpt2Bpe(const std::string &encoder_json_text, const std::string &encoder_name,
          const std::string &vocab_bpe_text, const std::string &bpe_name);

  // Appends the ids of `text` to `out`. Not thread-safe (it caches).
  void encode(std::string_view text, std::vector<uint32_t> &out);
  std::vector<uint32_t> encode(std::string_view text) {
    std::vector<uint32_t> out;
    encode(text, out);
    return out;
  }

  // The bytes token `id` stands for (encoder.json's symbol mapped back
  // through bytes_to_unicode; "<|endoftext|>" as its own text); empty for
  // an id the encoder does not have. A token may end inside a UTF-8
  // sequence: concatenate before showing text.
  std::string_view decode(uint32_t id) const {
    return id < decoded_.size() ? std::string_view(decoded_[id]) : std::string_view();
  }
  std::string decode(const std::vector<uint32_t> &ids) const {
    std::string out;
    for (uint32_t id : ids) out += decode(id);
    return out;
  }

  // The largest id plus one.
  int64_t vocab_size() const { return vocab_size_; }
  // The id of "<|endoftext|>" (50256 in GPT-2), if the encoder has one.
  std::optional<uint32_t> end_of_text() const { return eot_; }
  size_t merges() const { return model_->merges(); }

 private:
  std::unique_ptr<BpeModel> model_;   // encoder.json's symbols, vocab.bpe's merges
  std::vector<std::string> decoded_;  // id -> bytes
  int64_t vocab_size_ = 0;
  std::optional<uint32_t> eot_;
};

}  // namespace tessera::data
