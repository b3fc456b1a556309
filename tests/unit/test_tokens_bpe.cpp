// GPT-2's pre-tokenizer and BPE (data/tokenizer_bpe): bytes_to_unicode,
// pre-tokenization by hand, BPE on a hand-made vocabulary, and both against
// goldens made with OpenAI's GPT-2 encoder (tests/data/tokens), the BPE when
// GPT-2's encoder.json and vocab.bpe are at hand (tools/fetch-gpt2-vocab).
// Token shards and the "tokens" dataset are in test_tokens.cpp.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "data/tokenizer_bpe.hpp"
#include "support/fixture.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_tokens_bpe {

namespace {

namespace fs = std::filesystem;
namespace data = tessera::data;

std::vector<std::string> pieces(const std::string &text) {
  std::vector<std::string> out;
  for (auto p : data::gpt2_pretokenize(text)) out.emplace_back(p);
  return out;
}

// A byte-level vocabulary: byte b is id b, then the merges below by rank.
std::string tiny_encoder() {
  nlohmann::json j = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) j[data::byte_to_unicode(static_cast<uint8_t>(b))] = b;
  const char *merged[] = {"ll", "he", "hell", "lo", "hello", "\xC4\xA0w", "or", "\xC4\xA0wor"};
  for (int i = 0; i < 8; ++i) j[merged[i]] = 256 + i;
  j["<|endoftext|>"] = 264;
  return j.dump();
}
const char *kTinyMerges =
    "#version: 0.2\n"
    "l l\n"            // 0 -> ll 256
    "h e\n"            // 1 -> he 257
    "he ll\n"          // 2 -> hell 258
    "l o\n"            // 3 -> lo 259
    "hell o\n"         // 4 -> hello 260
    "\xC4\xA0 w\n"     // 5 -> Ġw 261 (Ġ: the space byte)
    "o r\n"            // 6 -> or 262
    "\xC4\xA0w or\n";  // 7 -> Ġwor 263

fs::path gpt2_vocab_dir() {
  if (const char *env = std::getenv("TESSERA_GPT2_VOCAB_DIR")) return env;
  return fs::path(TESSERA_SOURCE_DIR) / "data" / "gpt2";
}

}  // namespace

TEST_CASE("GPT-2 bytes_to_unicode", "[tokens][bpe]") {
  CHECK(data::byte_to_unicode('a') == "a");
  CHECK(data::byte_to_unicode('!') == "!");
  CHECK(data::byte_to_unicode(' ') == "\xC4\xA0");   // U+0120 Ġ
  CHECK(data::byte_to_unicode('\n') == "\xC4\x8A");  // U+010A Ċ
  CHECK(data::byte_to_unicode(0) == "\xC4\x80");     // U+0100 Ā
  CHECK(data::byte_to_unicode(0xAD) == "\xC5\x83");  // U+0143, the last of the 68 moved
  CHECK(data::byte_to_unicode(0xE9) == "\xC3\xA9");  // é stays é
}

TEST_CASE("GPT-2 pre-tokenization by hand", "[tokens][bpe]") {
  using V = std::vector<std::string>;
  CHECK(pieces("Hello world") == V{"Hello", " world"});
  CHECK(pieces("a  b") == V{"a", " ", " b"});
  CHECK(pieces("x   ") == V{"x", "   "});
  CHECK(pieces("\n\nHi") == V{"\n", "\n", "Hi"});
  CHECK(pieces("it's 'll'x") == V{"it", "'s", " '", "ll", "'", "x"});
  CHECK(pieces("ab12!?  ") == V{"ab", "12", "!?", "  "});
  CHECK(pieces(" 42 !!") == V{" 42", " !!"});
  CHECK(pieces("caf\xC3\xA9 na\xC3\xAFve") == V{"caf\xC3\xA9", " na\xC3\xAFve"});
  // Invalid UTF-8 bytes are "other", one byte each, and lose nothing.
  CHECK(pieces("a\xFF\xFE b") == V{"a", "\xFF\xFE", " b"});
  CHECK(pieces("") == V{});
  CHECK(data::char_class(0x4E2D) == data::CharClass::kLetter);  // 中
  CHECK(data::char_class(0x0663) == data::CharClass::kNumber);  // ٣
  CHECK(data::char_class(0x00A0) == data::CharClass::kSpace);
  CHECK(data::char_class(0x00A9) == data::CharClass::kOther);   // ©
  CHECK(data::char_class(0x1F600) == data::CharClass::kOther);  // 😀
}

TEST_CASE("GPT-2 BPE on a hand-made vocabulary", "[tokens][bpe]") {
  data::Gpt2Bpe bpe(tiny_encoder(), "tiny.json", kTinyMerges, "tiny.bpe");
  CHECK(bpe.vocab_size() == 265);
  CHECK(bpe.merges() == 8);
  REQUIRE(bpe.end_of_text().has_value());
  CHECK(*bpe.end_of_text() == 264);
  using V = std::vector<uint32_t>;
  // h e l l o: ll (rank 0), then he (1), he+ll (2), hell+o (4).
  CHECK(bpe.encode("hello") == V{260});
  // Ġ w o r l d: Ġw (5), or (6), Ġw+or (7); l and d stay bytes.
  CHECK(bpe.encode("hello world") == V{260, 263, 'l', 'd'});
  // l l o: ll (rank 0) beats lo (rank 3), and "ll o" is no merge.
  CHECK(bpe.encode("llo") == V{256, 'o'});
  CHECK(bpe.encode("lo") == V{259});
  // Every occurrence of the best pair merges in one round: l l l l -> ll ll.
  CHECK(bpe.encode("llll") == V{256, 256});
  // "he's": pieces "he" and "'s".
  CHECK(bpe.encode("he's") == V{257, '\'', 's'});
  // Non-ASCII: é is bytes C3 A9, ids 195 and 169.
  CHECK(bpe.encode("\xC3\xA9") == V{0xC3, 0xA9});
  CHECK(bpe.encode(" w") == V{261});
  CHECK(bpe.encode("") == V{});
  // Cached pieces give the same ids again.
  CHECK(bpe.encode("hello hello") == V{260, ' ', 260});
  // decode inverts encode, byte for byte; an unknown id decodes to nothing.
  for (const char *text : {"hello world", "llll", "he's", "\xC3\xA9 w", "a\xFF\n\x01"})
    CHECK(bpe.decode(bpe.encode(text)) == text);
  CHECK(bpe.decode(263) == " wor");
  CHECK(bpe.decode(264) == "<|endoftext|>");
  CHECK(bpe.decode(0xC3) == "\xC3");
  CHECK(bpe.decode(9999).empty());

  CHECK_THROWS_WITH(data::Gpt2Bpe("[1, 2]", "bad.json", kTinyMerges, "tiny.bpe"),
                    Catch::Contains("bad.json"));
  CHECK_THROWS_WITH(data::Gpt2Bpe("{\"a\": 0}", "few.json", kTinyMerges, "tiny.bpe"),
                    Catch::Contains("few.json") && Catch::Contains("byte"));
  CHECK_THROWS_WITH(
      data::Gpt2Bpe(tiny_encoder(), "tiny.json", "#version: 0.2\nl l\nh e x\n", "bad.bpe"),
      Catch::Contains("bad.bpe") && Catch::Contains("line 3"));
  // A merge whose result the encoder lacks.
  data::Gpt2Bpe odd(tiny_encoder(), "tiny.json", "x y\n", "odd.bpe");
  CHECK_THROWS_WITH(odd.encode("xy"), Catch::Contains("tiny.json"));
}

TEST_CASE("GPT-2 pre-tokenization matches Python's regex on the goldens", "[tokens][bpe]") {
  std::ifstream in(tessera::test::data_path("tokens/gpt2_golden.json"));
  REQUIRE(in);
  const auto golden = nlohmann::json::parse(in);
  REQUIRE(golden.size() >= 10);
  for (const auto &g : golden) {
    const std::string text = g["text"];
    INFO(text);
    CHECK(pieces(text) == g["pieces"].get<std::vector<std::string>>());
  }
}

TEST_CASE("GPT-2 BPE matches OpenAI's encoder on the goldens", "[tokens][bpe]") {
  const fs::path dir = gpt2_vocab_dir();
  if (!fs::exists(dir / "encoder.json") || !fs::exists(dir / "vocab.bpe")) {
    WARN("skipped: no GPT-2 encoder.json and vocab.bpe in " << dir.string()
                                                            << " (tools/fetch-gpt2-vocab)");
    return;
  }
  auto bpe = data::Gpt2Bpe::load(dir / "encoder.json", dir / "vocab.bpe");
  CHECK(bpe.vocab_size() == 50257);
  CHECK(bpe.merges() == 50000);
  CHECK(bpe.end_of_text() == std::optional<uint32_t>(50256));
  std::ifstream in(tessera::test::data_path("tokens/gpt2_golden.json"));
  REQUIRE(in);
  for (const auto &g : nlohmann::json::parse(in)) {
    const std::string text = g["text"];
    INFO(text);
    CHECK(bpe.encode(text) == g["ids"].get<std::vector<uint32_t>>());
    CHECK(bpe.decode(g["ids"].get<std::vector<uint32_t>>()) == text);
  }
}

}  // namespace unit_test_tokens_bpe
