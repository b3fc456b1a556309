// Hugging Face tokenizer.json (data/tokenizer_json, data/pretokenize,
// data/bpe): the golden cases made with the tokenizers library
// (tests/data/bpe_tokenizer), both merge forms, ignore_merges, the
// post-processor's BOS, NFC, added-token matching, the Split behaviors, and
// the refusals of what is not a byte-level BPE.
#include <catch2/catch.hpp>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/pretokenize.hpp"
#include "data/tokenizer_json.hpp"
#include "support/fixture.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_tokenizer_json {

namespace {

namespace data = tessera::data;
using nlohmann::json;
using Ids = std::vector<uint32_t>;

json read_json(const std::string &relative) {
  std::ifstream in(tessera::test::data_path(relative));
  REQUIRE(in);
  return json::parse(in);
}

json golden_tokenizer() {
  return read_json("bpe_tokenizer/tokenizer.json");
}

data::TokenizerJson make(const json &j, const std::string &name = "t.json") {
  return data::TokenizerJson(j.dump(), name);
}

std::vector<std::string> split(const data::PreTokenizeStep &step, const std::string &text) {
  std::vector<std::string> pieces;
  data::pretokenize_each({step}, text, [&](std::string_view p) { pieces.emplace_back(p); });
  return pieces;
}

}  // namespace

TEST_CASE("tokenizer.json encodes and decodes the golden cases", "[tokens][tokenizer_json]") {
  auto tok = data::TokenizerJson::load(tessera::test::data_path("bpe_tokenizer"));
  CHECK(tok.vocab_size() == 400);
  CHECK(tok.token_id("<|end_of_text|>") == std::optional<uint32_t>(1));
  const json ref = read_json("bpe_tokenizer/reference.json");
  REQUIRE(ref.size() >= 10);
  for (const auto &c : ref) {
    const std::string text = c["text"];
    INFO(text);
    const Ids ids = c["ids"].get<Ids>();
    CHECK(tok.encode(text) == ids);
    CHECK(tok.decode(ids) == text);
  }
  // Special tokens are left out on request; an id past the end is refused.
  CHECK(tok.decode({0, 85, 1}, true) == "t");
  CHECK_THROWS_WITH(tok.decode({5, 400}),
                    Catch::Contains("id 400") && Catch::Contains("tokenizer.json"));
}

TEST_CASE("tokenizer.json: merges as pairs, ignore_merges, the BOS template",
          "[tokens][tokenizer_json]") {
  json j = golden_tokenizer();
  auto strings = make(j);
  const Ids hello = strings.encode("Hello world, the quick brown fox");
  json pairs = j;
  for (auto &m : pairs["model"]["merges"]) {
    if (m.is_string()) {
      const std::string s = m;
      m = json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
    } else {
      m = m[0].get<std::string>() + " " + m[1].get<std::string>();
    }
  }
  CHECK(make(pairs).encode("Hello world, the quick brown fox") == hello);

  // A word in the vocabulary that no merge makes: one token only with
  // ignore_merges (as Llama 3 sets it).
  json whole = j;
  whole["model"]["vocab"]["xxxx"] = 400;
  CHECK(make(whole).encode("xxxx") == Ids{89, 89, 89, 89});
  whole["model"]["ignore_merges"] = true;
  CHECK(make(whole).encode("xxxx") == Ids{400});
  CHECK(make(whole).decode({400}) == "xxxx");

  // Llama 3's post-processor: ByteLevel, then <|begin_of_text|> before the text.
  json bos = j;
  bos["post_processor"] = json::parse(R"({"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                  {"Sequence": {"id": "A", "type_id": 0}}],
       "pair": [], "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>",
                "ids": [0], "tokens": ["<|begin_of_text|>"]}}}]})");
  auto with_bos = make(bos);
  Ids expect{0};
  expect.insert(expect.end(), hello.begin(), hello.end());
  CHECK(with_bos.encode("Hello world, the quick brown fox") == expect);
  CHECK(with_bos.encode("Hello world, the quick brown fox", false) == hello);
  CHECK(with_bos.added_by_post_processor() == 1);
}

TEST_CASE("tokenizer.json: NFC, added tokens' strip flags", "[tokens][tokenizer_json]") {
  json j = golden_tokenizer();
  const std::string composed = "caf\xC3\xA9", decomposed = "cafe\xCC\x81";
  CHECK(make(j).encode(composed) != make(j).encode(decomposed));
  j["normalizer"] = {{"type", "NFC"}};
  auto nfc = make(j);
  CHECK(nfc.encode(decomposed) == nfc.encode(composed));
  CHECK(data::nfc_normalize(decomposed) == composed);
  CHECK(data::nfc_normalize("\xFF"
                            "e\xCC\x81") ==
        "\xFF"
        "e\xCC\x81");  // not UTF-8: as it is

  // rstrip: the token takes the white space after it.
  json strip = golden_tokenizer();
  const Ids plain = make(strip).encode("<|end_of_text|>  x");
  strip["added_tokens"][1]["rstrip"] = true;
  const Ids stripped = make(strip).encode("<|end_of_text|>  x");
  CHECK(plain.size() > stripped.size());
  Ids expect{1};
  for (uint32_t id : make(strip).encode("x")) expect.push_back(id);
  CHECK(stripped == expect);
}

TEST_CASE("Split behaviors and ByteLevel's prefix space", "[tokens][tokenizer_json]") {
  using B = data::SplitBehavior;
  data::PreTokenizeStep s;
  s.regex = std::make_shared<data::Pcre2Regex>("-", true, "test");
  using V = std::vector<std::string>;
  const std::string text = "the-final--countdown";
  s.behavior = B::kRemoved;
  CHECK(split(s, text) == V{"the", "final", "countdown"});
  s.behavior = B::kIsolated;
  CHECK(split(s, text) == V{"the", "-", "final", "-", "-", "countdown"});
  s.behavior = B::kMergedWithPrevious;
  CHECK(split(s, text) == V{"the-", "final-", "-", "countdown"});
  s.behavior = B::kMergedWithNext;
  CHECK(split(s, text) == V{"the", "-final", "-", "-countdown"});
  s.behavior = B::kContiguous;
  CHECK(split(s, text) == V{"the", "-", "final", "--", "countdown"});
  s.behavior = B::kRemoved;
  s.invert = true;  // the matches are the content; the rest is the delimiter
  s.regex = std::make_shared<data::Pcre2Regex>("-+", false, "test");
  CHECK(split(s, text) == V{"-", "--"});

  data::PreTokenizeStep bl;
  bl.kind = data::PreTokenizeStep::Kind::kByteLevel;
  bl.add_prefix_space = true;
  bl.regex = std::make_shared<data::Pcre2Regex>(data::kGpt2SplitPattern, false, "test");
  CHECK(split(bl, "Hello world's") == V{" Hello", " world", "'s"});
  CHECK_THROWS_WITH(data::Pcre2Regex("(unclosed", false, "tok.json: pre_tokenizer"),
                    Catch::Contains("tok.json: pre_tokenizer") && Catch::Contains("PCRE2"));
}

TEST_CASE("GPT-2's regex through PCRE2 splits the goldens as Python does",
          "[tokens][tokenizer_json]") {
  data::PreTokenizeStep bl;
  bl.kind = data::PreTokenizeStep::Kind::kByteLevel;
  bl.regex = std::make_shared<data::Pcre2Regex>(data::kGpt2SplitPattern, false, "test");
  for (const auto &g : read_json("tokens/gpt2_golden.json")) {
    const std::string text = g["text"];
    INFO(text);
    CHECK(split(bl, text) == g["pieces"].get<std::vector<std::string>>());
  }
}

TEST_CASE("tokenizer.json that is not a byte-level BPE is refused by name",
          "[tokens][tokenizer_json]") {
  const json j = golden_tokenizer();
  auto refused = [&](const char *pointer, const json &value, const std::string &needle) {
    json bad = j;
    bad[json::json_pointer(pointer)] = value;
    INFO(pointer << " = " << value.dump());
    CHECK_THROWS_WITH(make(bad, "llama2/tokenizer.json"),
                      Catch::Contains("llama2/tokenizer.json") && Catch::Contains(needle));
  };
  refused("/model/type", "Unigram", "'Unigram'");
  refused("/model/type", "WordPiece", "'WordPiece'");
  refused("/model/byte_fallback", true, "byte_fallback");
  refused("/normalizer", {{"type", "NFKC"}}, "'NFKC'");
  refused("/pre_tokenizer", {{"type", "Metaspace"}}, "'Metaspace'");
  refused("/pre_tokenizer", nullptr, "ByteLevel");
  refused("/decoder", {{"type", "WordPiece"}}, "'WordPiece'");
  refused("/post_processor", {{"type", "BertProcessing"}}, "'BertProcessing'");
  refused("/added_tokens/0/single_word", true, "single_word");
  json gone = j;
  gone["model"]["vocab"].erase("\xC4\xA0");  // the space byte's token
  CHECK_THROWS_WITH(make(gone), Catch::Contains("byte 32"));
  CHECK_THROWS_WITH(data::TokenizerJson("{\"model\": 1", "x.json"),
                    Catch::Contains("x.json") && Catch::Contains("not valid JSON"));
}

}  // namespace unit_test_tokenizer_json
