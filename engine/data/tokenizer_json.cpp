#include "data/tokenizer_json.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "util/error.hpp"
#include "util/regular_file.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace tessera::data {

namespace {

// Messages name the file and the section: "tokenizer file 'F': model: ...".
struct Where {
  std::string file;
  [[noreturn]] void fail(const std::string &at, const std::string &what,
                         tsr_status code = TSR_ERR_INVALID) const {
    throw Error(code, "tokenizer file '" + file + "': " + at + ": " + what);
  }
  [[noreturn]] void refuse(const std::string &at, const std::string &what) const {
    fail(at, what + "; tessera reads byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2/2.5/3)",
         TSR_ERR_UNSUPPORTED);
  }
};

std::string type_of(const json &j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : "";
}

bool flag(const json &j, const char *key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return j[key].is_boolean() ? j[key].get<bool>() : fallback;
}

// True when the normalizer is NFC, false when there is none.
bool parse_normalizer(const json &j, const std::string &at, const Where &w) {
  if (j.is_null()) return false;
  const std::string type = type_of(j);
  if (type == "NFC") return true;
  if (type == "Sequence" && j.contains("normalizers") && j["normalizers"].is_array()) {
    bool nfc = false;
    for (size_t i = 0; i < j["normalizers"].size(); ++i)
      nfc = parse_normalizer(j["normalizers"][i], at + ".normalizers[" + std::to_string(i) + "]",
                             w) ||
            nfc;
    return nfc;
  }
  w.refuse(at, "normalizer type '" + type + "' is not supported (none or NFC)");
}

void parse_pre_tokenizer(const json &j, const std::string &at, const Where &w,
                         std::vector<PreTokenizeStep> &steps) {
  const std::string type = type_of(j);
  if (type == "Sequence" && j.contains("pretokenizers") && j["pretokenizers"].is_array()) {
    for (size_t i = 0; i < j["pretokenizers"].size(); ++i)
      parse_pre_tokenizer(j["pretokenizers"][i], at + ".pretokenizers[" + std::to_string(i) + "]",
                          w, steps);
    return;
  }
  PreTokenizeStep step;
  const std::string where = "tokenizer file '" + w.file + "': " + at;
  if (type == "ByteLevel") {
    step.kind = PreTokenizeStep::Kind::kByteLevel;
    step.add_prefix_space = flag(j, "add_prefix_space", false);
    if (flag(j, "use_regex", true))
      step.regex = std::make_shared<Pcre2Regex>(kGpt2SplitPattern, false, where);
  } else if (type == "Split") {
    const json &pat = j.value("pattern", json());
    const bool literal = pat.contains("String");
    if (!pat.is_object() || !(literal || pat.contains("Regex")) ||
        !pat[literal ? "String" : "Regex"].is_string())
      w.fail(at, "Split needs a pattern {\"Regex\": ...} or {\"String\": ...}");
    step.regex = std::make_shared<Pcre2Regex>(pat[literal ? "String" : "Regex"].get<std::string>(),
                                              literal, where);
    step.behavior = split_behavior_from_name(j.value("behavior", std::string("Isolated")), where);
    step.invert = flag(j, "invert", false);
  } else {
    w.refuse(at, "pre-tokenizer type '" + type + "' is not supported (Sequence, Split, ByteLevel)");
  }
  steps.push_back(std::move(step));
}

std::vector<BpeMerge> parse_merges(const json &m, const Where &w) {
  std::vector<BpeMerge> merges;
  merges.reserve(m.size());
  for (size_t i = 0; i < m.size(); ++i) {
    const json &e = m[i];
    if (e.is_string()) {
      // "a b": exactly one space, as tokenizers reads them.
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        w.fail("model.merges[" + std::to_string(i) + "]", "expected \"A B\", got \"" + s + "\"");
      merges.push_back({s.substr(0, sp), s.substr(sp + 1)});
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      merges.push_back({e[0].get<std::string>(), e[1].get<std::string>()});
    } else {
      w.fail("model.merges[" + std::to_string(i) + "]",
             "expected \"A B\" or [\"A\", \"B\"], got " + e.dump());
    }
  }
  return merges;
}

std::unique_ptr<BpeModel> parse_model(const json &m, const Where &w) {
  if (!m.is_object()) w.fail("model", "missing or not an object");
  const std::string type = type_of(m);
  if (!type.empty() && type != "BPE")
    w.refuse("model", "model type '" + type + "' is not supported");
  if (flag(m, "byte_fallback", false))
    w.refuse("model",
             "BPE with byte_fallback (a SentencePiece conversion, as Llama 2's) is not "
             "supported");
  for (const char *key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(key) && !m[key].is_null() && m[key] != "")
      w.refuse("model", std::string(key) + " " + m[key].dump() + " is not supported");
  if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() > 0)
    w.refuse("model", "BPE dropout " + m["dropout"].dump() + " is not supported");
  if (!m.contains("vocab") || !m["vocab"].is_object() || m["vocab"].empty())
    w.fail("model.vocab", "missing, empty or not an object of token -> id");
  if (!m.contains("merges") || !m["merges"].is_array())
    w.fail("model.merges", "missing or not an array");
  std::unordered_map<std::string, uint32_t> vocab;
  vocab.reserve(m["vocab"].size());
  for (const auto &[key, value] : m["vocab"].items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > INT32_MAX)
      w.fail("model.vocab",
             "token '" + key + "' has id " + value.dump() + ", expected an integer in [0, 2^31)");
    vocab.emplace(key, value.get<uint32_t>());
  }
  auto model = std::make_unique<BpeModel>(std::move(vocab), parse_merges(m["merges"], w),
                                          "tokenizer file '" + w.file + "'",
                                          flag(m, "ignore_merges", false));
  if (auto b = model->missing_byte())
    w.refuse("model.vocab", "no token for byte " + std::to_string(*b) +
                                " (not a byte-level vocabulary, which has all 256)");
  if (auto u = model->unmade_merge())
    w.fail("model.merges", "merge \"" + *u + "\" makes a token the vocabulary lacks");
  return model;
}

std::vector<TokenizerJson::AddedToken> parse_added(const json &a, const Where &w) {
  std::vector<TokenizerJson::AddedToken> out;
  if (a.is_null()) return out;
  if (!a.is_array()) w.fail("added_tokens", "not an array");
  for (size_t i = 0; i < a.size(); ++i) {
    const json &t = a[i];
    const std::string at = "added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
        t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() > INT32_MAX ||
        !t.contains("content") || !t["content"].is_string() || t["content"] == "")
      w.fail(at, "needs an id in [0, 2^31) and a non-empty content, got " + t.dump());
    if (flag(t, "single_word", false))
      w.refuse(at,
               "single_word tokens ('" + t["content"].get<std::string>() + "') are not supported");
    out.push_back({t["content"].get<std::string>(), t["id"].get<uint32_t>(),
                   flag(t, "special", false), flag(t, "lstrip", false), flag(t, "rstrip", false)});
  }
  return out;
}

// The ids a TemplateProcessing's `single` puts before and after the text.
void parse_template(const json &p, const std::string &at, const Where &w,
                    std::vector<uint32_t> &prefix, std::vector<uint32_t> &suffix) {
  if (!p.contains("single") || !p["single"].is_array())
    w.fail(at, "TemplateProcessing needs 'single'");
  bool seen_sequence = false;
  for (const json &item : p["single"]) {
    if (item.contains("Sequence")) {
      if (item["Sequence"].value("id", std::string()) != "A" || seen_sequence)
        w.fail(at, "the single template must hold sequence A once, got " + p["single"].dump());
      seen_sequence = true;
    } else if (item.contains("SpecialToken")) {
      const std::string id = item["SpecialToken"].value("id", std::string());
      const json &st = p.value("special_tokens", json::object());
      if (!st.contains(id) || !st[id].contains("ids") || !st[id]["ids"].is_array())
        w.fail(at, "special token '" + id + "' of the template is not in its special_tokens");
      for (const json &v : st[id]["ids"]) {
        if (!v.is_number_unsigned() || v.get<uint64_t>() > INT32_MAX)
          w.fail(at, "special token '" + id + "' has id " + v.dump());
        (seen_sequence ? suffix : prefix).push_back(v.get<uint32_t>());
      }
    } else {
      w.fail(at, "unknown template item " + item.dump());
    }
  }
}

void parse_post_processor(const json &p, const std::string &at, const Where &w,
                          std::vector<uint32_t> &prefix, std::vector<uint32_t> &suffix) {
  if (p.is_null()) return;
  const std::string type = type_of(p);
  if (type == "ByteLevel") return;  // it only adjusts offsets
  if (type == "TemplateProcessing") return parse_template(p, at, w, prefix, suffix);
  if (type == "Sequence" && p.contains("processors") && p["processors"].is_array()) {
    for (size_t i = 0; i < p["processors"].size(); ++i)
      parse_post_processor(p["processors"][i], at + ".processors[" + std::to_string(i) + "]", w,
                           prefix, suffix);
    return;
  }
  w.refuse(at, "post-processor type '" + type +
                   "' is not supported (ByteLevel, TemplateProcessing, Sequence)");
}

void check_decoder(const json &d, const std::string &at, const Where &w) {
  const std::string type = type_of(d);
  if (type == "ByteLevel") return;
  if (type == "Sequence" && d.contains("decoders") && d["decoders"].is_array() &&
      !d["decoders"].empty()) {
    for (size_t i = 0; i < d["decoders"].size(); ++i)
      check_decoder(d["decoders"][i], at + ".decoders[" + std::to_string(i) + "]", w);
    return;
  }
  w.refuse(at, "decoder type '" + (d.is_null() ? std::string("null") : type) +
                   "' is not supported (ByteLevel)");
}

// A PCRE2 pattern that matches `s` literally (UTF-8 passes through).
std::string quote_pattern(const std::string &s) {
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7F) {
      char buf[12];
      std::snprintf(buf, sizeof buf, "\\x{%02x}", c);
      out += buf;
    } else if (c < 0x80 && !std::isalnum(c)) {
      out += '\\';
      out += static_cast<char>(c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace

TokenizerJson TokenizerJson::load(const fs::path &path) {
  std::error_code ec;
  const fs::path file = fs::is_directory(path, ec) ? path / "tokenizer.json" : path;
  if (fs::is_directory(path, ec) && !fs::exists(file, ec))
    throw Error(TSR_ERR_IO, "tokenizer directory '" + path.string() +
                                "' has no tokenizer.json (a Hugging Face model directory has one)");
  return TokenizerJson(read_regular(file.string(), "tokenizer file"), file.string());
}

TokenizerJson::TokenizerJson(const std::string &json_text, const std::string &name) : name_(name) {
  const Where w{name};
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception &e) {
    throw Error(TSR_ERR_INVALID, "tokenizer file '" + name + "' is not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("model"))
    w.fail("(top level)", "not a Hugging Face tokenizer.json (no 'model')");
  // The model first: its type is what an unsupported file is refused by.
  model_ = parse_model(j["model"], w);
  added_ = parse_added(j.value("added_tokens", json()), w);
  nfc_ = parse_normalizer(j.value("normalizer", json()), "normalizer", w);
  const json pre = j.value("pre_tokenizer", json());
  if (!pre.is_null()) parse_pre_tokenizer(pre, "pre_tokenizer", w, steps_);
  if (std::none_of(steps_.begin(), steps_.end(), [](const PreTokenizeStep &s) {
        return s.kind == PreTokenizeStep::Kind::kByteLevel;
      }))
    w.refuse("pre_tokenizer", "no ByteLevel step, so not a byte-level BPE");
  parse_post_processor(j.value("post_processor", json()), "post_processor", w, prefix_, suffix_);
  check_decoder(j.value("decoder", json()), "decoder", w);
  build_tables();
}

void TokenizerJson::build_tables() {
  int64_t size = 0;
  for (const auto &[sym, id] : model_->vocab()) size = std::max<int64_t>(size, int64_t{id} + 1);
  for (const AddedToken &t : added_) size = std::max<int64_t>(size, int64_t{t.id} + 1);
  const size_t count = model_->vocab().size() + added_.size();
  // One table entry per id up to the largest: ids far beyond the token count
  // would size it by a number from the file alone.
  if (static_cast<uint64_t>(size) > 4 * uint64_t{count} + 1024)
    throw Error(TSR_ERR_INVALID, "tokenizer file '" + name_ + "': the largest id is " +
                                     std::to_string(size - 1) + " for " + std::to_string(count) +
                                     " tokens; ids must be (nearly) dense");
  decoded_.assign(static_cast<size_t>(size), std::string());
  special_.assign(static_cast<size_t>(size), false);
  known_.assign(static_cast<size_t>(size), false);
  for (const auto &[sym, id] : model_->vocab()) {
    decoded_[id] = byte_level_decode(sym);
    known_[id] = true;
  }
  // The decoder is ByteLevel for every token, added ones included, as in
  // tokenizers: ASCII contents such as <|endoftext|> map to themselves.
  for (const AddedToken &t : added_) {
    decoded_[t.id] = byte_level_decode(t.content);
    special_[t.id] = t.special;
    known_[t.id] = true;
    added_ids_.emplace(t.content, t.id);
  }
  if (!added_.empty()) {
    // Longest first: PCRE2 takes the first alternative that matches at the
    // leftmost position, so this finds the leftmost-longest token as the
    // Aho-Corasick matcher of tokenizers does. Group i+1 is sorted[i].
    std::vector<const AddedToken *> sorted;
    for (const AddedToken &t : added_) sorted.push_back(&t);
    std::stable_sort(sorted.begin(), sorted.end(), [](const AddedToken *a, const AddedToken *b) {
      return a->content.size() > b->content.size();
    });
    std::string pattern;
    for (const AddedToken *t : sorted) {
      if (!pattern.empty()) pattern += '|';
      pattern += t->lstrip ? "(\\s*" : "(";
      pattern += quote_pattern(t->content);
      pattern += t->rstrip ? "\\s*)" : ")";
      added_order_.push_back(t->id);
    }
    added_regex_ = std::make_unique<Pcre2Regex>(pattern, false,
                                                "tokenizer file '" + name_ + "': added_tokens");
  }
  description_ = "byte-level BPE, " + std::to_string(size) + " ids (" +
                 std::to_string(model_->vocab().size()) + " in the vocabulary, " +
                 std::to_string(added_.size()) + " added), " + std::to_string(model_->merges()) +
                 " merges" + (nfc_ ? ", NFC" : "");
  if (!prefix_.empty() || !suffix_.empty())
    description_ += ", " + std::to_string(prefix_.size() + suffix_.size()) +
                    " special token(s) around each text";
}

void TokenizerJson::encode_segment(std::string_view text, std::vector<uint32_t> &out) {
  if (text.empty()) return;
  std::string normalized;
  if (nfc_) {
    normalized = nfc_normalize(text);
    text = normalized;
  }
  pretokenize_each(steps_, text, [&](std::string_view piece) { model_->encode(piece, out); });
}

void TokenizerJson::encode(std::string_view text, std::vector<uint32_t> &out,
                           bool add_special_tokens) {
  if (add_special_tokens) out.insert(out.end(), prefix_.begin(), prefix_.end());
  size_t prev = 0;
  if (added_regex_) {
    for (const Pcre2Regex::Match &m : added_regex_->find_all(text)) {
      encode_segment(text.substr(prev, m.begin - prev), out);
      out.push_back(added_order_.at(static_cast<size_t>(m.group - 1)));
      prev = m.end;
    }
  }
  encode_segment(text.substr(prev), out);
  if (add_special_tokens) out.insert(out.end(), suffix_.begin(), suffix_.end());
}

std::string TokenizerJson::decode(const std::vector<uint32_t> &ids,
                                  bool skip_special_tokens) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t id = ids[i];
    if (id >= decoded_.size() || !known_[id])
      throw Error(TSR_ERR_INVALID, "id " + std::to_string(id) + " (at " + std::to_string(i) +
                                       ") is not a token of '" + name_ + "' (" +
                                       std::to_string(decoded_.size()) + " ids)");
    if (skip_special_tokens && special_[id]) continue;
    out += decoded_[id];
  }
  return out;
}

std::optional<uint32_t> TokenizerJson::token_id(const std::string &content) const {
  if (auto it = added_ids_.find(content); it != added_ids_.end()) return it->second;
  if (auto it = model_->vocab().find(content); it != model_->vocab().end()) return it->second;
  return std::nullopt;
}

std::string TokenizerJson::describe() const {
  return description_;
}

}  // namespace tessera::data
