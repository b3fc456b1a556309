// Hugging Face tokenizer.json, the byte-level BPE kind that GPT-2, Llama 3
// and Qwen2/2.5/3 ship, encoded as `tokenizers.Tokenizer.encode(text)` does
// (add_special_tokens on) and decoded as its `decode(ids)` does:
//
//   added tokens   split off first (leftmost, longest), each its own id
//   normalizer     none, or NFC (utf8proc)
//   pre_tokenizer  Sequence of Split (a regex, PCRE2) and ByteLevel
//   model          BPE: vocab, merges ("a b" or ["a", "b"]), ignore_merges
//   post_processor none, ByteLevel, TemplateProcessing (e.g. Llama 3's BOS)
//   decoder        ByteLevel
//
// Anything else (Unigram, WordPiece, WordLevel, a BPE with byte_fallback as
// SentencePiece-converted files such as Llama 2's have, other normalizers or
// pre-tokenizers) is refused when the file is read, naming what and where.
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
#include "data/pretokenize.hpp"

namespace tessera::data {

class TokenizerJson {
 public:
  // Reads `path`: a tokenizer.json, or a directory holding one. Throws
  // tessera::Error naming the file when it cannot be read or is refused.
  static TokenizerJson load(const std::filesystem::path &path);
  // The same from the file's contents; `name` names it in messages.
  TokenizerJson(const std::string &json_text, const std::string &name);

  // Appends the ids of `text`; with `add_special_tokens`, the
  // post-processor's tokens (e.g. <|begin_of_text|>) too. Not thread-safe.
  void encode(std::string_view text, std::vector<uint32_t> &out, bool add_special_tokens = true);
  std::vector<uint32_t> encode(std::string_view text, bool add_special_tokens = true) {
    std::vector<uint32_t> out;
    encode(text, out, add_special_tokens);
    return out;
  }

  // The bytes of `ids` concatenated (Python shows invalid UTF-8 as U+FFFD;
  // this keeps the bytes). Throws naming an id outside the vocabulary.
  std::string decode(const std::vector<uint32_t> &ids, bool skip_special_tokens = false) const;

  // The bytes of token `id`; empty for an id no token has.
  std::string_view token_bytes(uint32_t id) const {
    return id < decoded_.size() ? std::string_view(decoded_[id]) : std::string_view();
  }
  // The largest id (model or added token) plus one.
  int64_t vocab_size() const { return static_cast<int64_t>(decoded_.size()); }
  // The id of token `content` (an added token or a vocabulary symbol).
  std::optional<uint32_t> token_id(const std::string &content) const;
  // How many ids the post-processor adds to one sequence.
  size_t added_by_post_processor() const { return prefix_.size() + suffix_.size(); }
  const std::string &name() const { return name_; }
  // One line for summaries: "byte-level BPE, 400 ids, NFC, ...".
  std::string describe() const;

  struct AddedToken {
    std::string content;
    uint32_t id = 0;
    bool special = false, lstrip = false, rstrip = false;
  };

 private:
  void build_tables();
  void encode_segment(std::string_view text, std::vector<uint32_t> &out);

  std::string name_;
  std::unique_ptr<BpeModel> model_;
  std::vector<AddedToken> added_;
  std::unordered_map<std::string, uint32_t> added_ids_;
  std::unique_ptr<Pcre2Regex> added_regex_;  // the added tokens, longest first
  std::vector<uint32_t> added_order_;        // capture group i+1 -> id
  bool nfc_ = false;
  std::vector<PreTokenizeStep> steps_;
  std::vector<uint32_t> prefix_, suffix_;  // TemplateProcessing's single form
  std::vector<std::string> decoded_;       // id -> bytes
  std::vector<bool> special_;              // id -> an added token marked special
  std::vector<bool> known_;                // id -> some token has it
  std::string description_;
};

}  // namespace tessera::data
