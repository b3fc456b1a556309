#include "data/pretokenize.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>

#include "util/error.hpp"

namespace tessera::data {

const char *const kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Pcre2Regex::Impl {
  pcre2_code *code = nullptr;
  pcre2_match_data *match = nullptr;
  std::string where;
  ~Impl() {
    pcre2_match_data_free(match);
    pcre2_code_free(code);
  }
};

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof buf) < 0)
    return "PCRE2 error " + std::to_string(code);
  return reinterpret_cast<const char *>(buf);
}

// The offset after the character at `at` (one byte if it is not UTF-8).
size_t next_char(std::string_view text, size_t at) {
  size_t i = at + 1;
  while (i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80 && i - at < 4) ++i;
  return i;
}

struct Segment {
  size_t begin, end;
  bool is_match;
};

// Hugging Face's Split (tokenizers' NormalizedString::split) as a stream:
// the segments (the matches and the text between them, in order) come in
// one by one, and what `behavior` makes of them goes out as soon as it is
// known, holding back at most one segment.
class SplitStream {
 public:
  SplitStream(SplitBehavior behavior, const std::function<void(const Segment &)> &out)
      : behavior_(behavior), out_(out) {}

  void feed(const Segment &s) {
    switch (behavior_) {
      case SplitBehavior::kIsolated:
        return out_(s);
      case SplitBehavior::kRemoved:
        if (!s.is_match) out_(s);
        return;
      case SplitBehavior::kContiguous:  // runs of matches, runs of the rest
        if (held_ && s.is_match == previous_match_)
          last_.end = s.end;
        else
          hold(s);
        break;
      case SplitBehavior::kMergedWithPrevious:  // a match ends the piece before it
        if (held_ && s.is_match && !previous_match_)
          last_.end = s.end;
        else
          hold(s);
        break;
      case SplitBehavior::kMergedWithNext:  // a match starts the piece after it
        if (held_ && !s.is_match) {
          last_.end = s.end;
          out_(last_);
          held_ = false;
        } else if (s.is_match) {
          hold(s);
        } else {
          out_(s);
        }
        break;
    }
    previous_match_ = s.is_match;
  }
  void finish() {
    if (held_) out_(last_);
    held_ = false;
  }

 private:
  void hold(const Segment &s) {
    if (held_) out_(last_);
    last_ = s;
    held_ = true;
  }
  SplitBehavior behavior_;
  const std::function<void(const Segment &)> &out_;
  Segment last_{0, 0, false};
  bool held_ = false, previous_match_ = false;
};

// Step i and those after it on `piece`; `prefixed`: ByteLevel's prefix
// space is already there.
void run_step(const std::vector<PreTokenizeStep> &steps, size_t i, std::string_view piece,
              const std::function<void(std::string_view)> &fn, bool prefixed = false) {
  if (piece.empty()) return;
  if (i == steps.size()) return fn(piece);
  const PreTokenizeStep &step = steps[i];
  if (step.kind == PreTokenizeStep::Kind::kByteLevel && step.add_prefix_space && !prefixed &&
      piece[0] != ' ') {
    const std::string with_space = " " + std::string(piece);
    return run_step(steps, i, with_space, fn, true);
  }
  if (!step.regex) return run_step(steps, i + 1, piece, fn);
  const std::function<void(const Segment &)> emit = [&](const Segment &s) {
    run_step(steps, i + 1, piece.substr(s.begin, s.end - s.begin), fn);
  };
  SplitStream stream(step.behavior, emit);
  size_t prev = 0;
  step.regex->for_each_match(piece, [&](const Pcre2Regex::Match &m) {
    if (m.begin > prev) stream.feed({prev, m.begin, step.invert});
    stream.feed({m.begin, m.end, !step.invert});
    prev = m.end;
  });
  if (prev < piece.size()) stream.feed({prev, piece.size(), step.invert});
  stream.finish();
}

}  // namespace

Pcre2Regex::Pcre2Regex(const std::string &pattern, bool literal, const std::string &where)
    : impl_(std::make_unique<Impl>()) {
  impl_->where = where;
  int err = 0;
  PCRE2_SIZE err_at = 0;
  // UCP (Unicode properties for \s, \w, \d) means nothing to a literal,
  // and PCRE2 refuses the two together.
  const uint32_t options =
      PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                              &err, &err_at, nullptr);
  if (!impl_->code)
    throw Error(TSR_ERR_INVALID,
                where + ": the regex does not compile (PCRE2): " + pcre2_message(err) +
                    " at offset " + std::to_string(err_at) + " of '" + pattern + "'");
  // JIT is an optimisation: without it (a platform PCRE2 lacks it for) the
  // interpreter matches the same.
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
  impl_->match = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  if (!impl_->match) throw Error(TSR_ERR_NO_MEMORY, where + ": cannot allocate PCRE2 match data");
}

Pcre2Regex::~Pcre2Regex() = default;

void Pcre2Regex::for_each_match(std::string_view text,
                                const std::function<void(const Match &)> &fn) const {
  const auto *subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t at = 0;
  while (at < text.size()) {
    const int rc = pcre2_match(impl_->code, subject, text.size(), at, 0, impl_->match, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0)
      throw Error(TSR_ERR_INVALID,
                  impl_->where + ": matching the regex failed (PCRE2): " + pcre2_message(rc));
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(impl_->match);
    if (ov[1] > ov[0]) {
      int group = 0;
      for (int g = 1; g < rc && !group; ++g)
        if (ov[2 * g] != PCRE2_UNSET) group = g;
      const Match m{ov[0], ov[1], group};
      at = ov[1];  // before fn: it may not use the match data
      fn(m);
    } else {
      at = next_char(text, ov[1]);  // an empty match: go on after it
    }
  }
}

SplitBehavior split_behavior_from_name(const std::string &name, const std::string &where) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  throw Error(TSR_ERR_INVALID, where + ": unknown Split behavior '" + name +
                                   "' (Removed, Isolated, MergedWithPrevious, MergedWithNext "
                                   "or Contiguous)");
}

void pretokenize_each(const std::vector<PreTokenizeStep> &steps, std::string_view text,
                      const std::function<void(std::string_view)> &fn) {
  run_step(steps, 0, text, fn);
}

std::string nfc_normalize(std::string_view text) {
  if (text.empty()) return {};
  // ASCII is its own NFC: most text takes this path.
  bool ascii = true;
  for (unsigned char c : text) ascii = ascii && c < 0x80;
  if (ascii) return std::string(text);
  utf8proc_uint8_t *out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t *>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &out,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(text);  // not valid UTF-8
  std::string result(reinterpret_cast<const char *>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

}  // namespace tessera::data
