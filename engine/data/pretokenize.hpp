// What Hugging Face tokenizers do to text before the BPE model sees it, for
// tokenizer.json (tokenizer_json): the NFC normalizer (utf8proc), the Split
// pre-tokenizer with its regex evaluated by PCRE2 (UTF mode, Unicode
// properties for \s \w \d and POSIX classes), and the ByteLevel
// pre-tokenizer (its prefix space and GPT-2's regex). Pieces stay raw bytes:
// the byte-to-character mapping is the BPE model's (data/bpe.hpp).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::data {

// GPT-2's pre-tokenization regex, which ByteLevel applies with use_regex.
extern const char *const kGpt2SplitPattern;

// A PCRE2 pattern compiled once (JIT where the platform has it). Text that is
// not valid UTF-8 is matched as far as it is valid: an invalid byte never
// matches (PCRE2_MATCH_INVALID_UTF).
class Pcre2Regex {
 public:
  // `literal`: `pattern` is a plain string (Split's {"String": ...}).
  // Throws tessera::Error naming `where` when the pattern does not compile.
  Pcre2Regex(const std::string &pattern, bool literal, const std::string &where);
  ~Pcre2Regex();
  Pcre2Regex(const Pcre2Regex &) = delete;
  Pcre2Regex &operator=(const Pcre2Regex &) = delete;

  struct Match {
    size_t begin, end;  // bytes [begin, end) of the text
    int group;          // the first capture group that took part; 0 if none
  };
  // Calls `fn` with the successive non-overlapping, non-empty matches in
  // `text`, as they are found. Not thread-safe (one match buffer), and not
  // reentrant: `fn` must not match with this same regex.
  void for_each_match(std::string_view text, const std::function<void(const Match &)> &fn) const;
  std::vector<Match> find_all(std::string_view text) const {
    std::vector<Match> out;
    for_each_match(text, [&](const Match &m) { out.push_back(m); });
    return out;
  }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Hugging Face's SplitDelimiterBehavior: what becomes of the matches.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// The behavior named `name` ("Isolated", ...); throws naming `where` for an
// unknown one.
SplitBehavior split_behavior_from_name(const std::string &name, const std::string &where);

struct PreTokenizeStep {
  enum class Kind { kSplit, kByteLevel } kind = Kind::kSplit;
  std::shared_ptr<Pcre2Regex> regex;  // Split's pattern; ByteLevel's with use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;            // Split: the matches are the pieces
  bool add_prefix_space = false;  // ByteLevel: a piece not starting with ' ' gets one
};

// Applies `steps` in order to `text` and calls `fn` with each non-empty
// piece they make, in order. Streams: a piece goes through all the steps
// as soon as the first has split it off, so memory does not grow with the
// text (a corpus file may be one document of gigabytes).
void pretokenize_each(const std::vector<PreTokenizeStep> &steps, std::string_view text,
                      const std::function<void(std::string_view)> &fn);

// Unicode NFC of UTF-8 `text`. Text that is not valid UTF-8 is returned as it
// is (normalization is defined on characters; Python could not hold it).
std::string nfc_normalize(std::string_view text);

}  // namespace tessera::data
