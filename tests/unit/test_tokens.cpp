// Token shards: the engine's writer (data/token_shard) read back by the
// "tokens" dataset plugin, both token widths, header validation, windows
// and targets, several shards by glob, the vocab check; GPT-2's
// pre-tokenizer and BPE (data/tokenizer_bpe) on a hand-made vocabulary,
// and against goldens made with OpenAI's GPT-2 encoder (tests/data/tokens)
// when GPT-2's encoder.json and vocab.bpe are at hand (tools/fetch-gpt2-vocab).
#include <stdlib.h>
#include <tessera/dataset.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tessera/cpp/plugin.hpp>
#include <thread>
#include <vector>

#include "data/token_shard.hpp"
#include "data/tokenizer_bpe.hpp"
#include "support/fixture.hpp"
#include "util/error.hpp"

namespace {

namespace fs = std::filesystem;
namespace sdk = tessera::sdk;
namespace data = tessera::data;
using tessera::test::Fixture;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tessera_tokens_XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path &path() const { return path_; }
  std::string file(const std::string &name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::vector<unsigned char> read_bytes(const fs::path &p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const fs::path &p, const std::vector<unsigned char> &b) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char *>(b.data()), static_cast<std::streamsize>(b.size()));
  REQUIRE(out.good());
}

int32_t header_int(const std::vector<unsigned char> &b, size_t i) {
  int32_t v;
  std::memcpy(&v, b.data() + 4 * i, 4);
  return v;
}

// A shard written by hand: header fields as given, `tokens` of `width` bytes.
std::vector<unsigned char> shard_bytes(int32_t magic, int32_t version, int32_t count,
                                       const std::vector<uint32_t> &tokens, int width) {
  std::vector<unsigned char> b(1024, 0);
  std::memcpy(b.data(), &magic, 4);
  std::memcpy(b.data() + 4, &version, 4);
  std::memcpy(b.data() + 8, &count, 4);
  for (uint32_t t : tokens) {
    unsigned char v[4];
    std::memcpy(v, &t, 4);
    b.insert(b.end(), v, v + width);
  }
  return b;
}

// Writes `tokens` as shards dir/prefix_NNNNNN.bin of at most `per_shard`.
std::vector<fs::path> write_shards(const fs::path &dir, const std::string &prefix,
                                   const std::vector<uint32_t> &tokens, int width,
                                   int64_t per_shard) {
  data::ShardWriter w(dir, prefix, width, per_shard);
  w.add(tokens);
  w.finish();
  CHECK(w.tokens() == static_cast<int64_t>(tokens.size()));
  return w.files();
}

struct Dataset {
  Dataset(Fixture &f, const std::string &toml, const char *split = "train") {
    vt = f.vtable<tsr_dataset_vtable>("dataset", "tokens");
    REQUIRE(vt != nullptr);
    tsr_config *cfg = f.config("dataset", "tokens", toml);
    status = vt->create(f.host.table(), cfg, split, &self);
    if (status == TSR_OK) REQUIRE(self != nullptr);
  }
  ~Dataset() {
    if (self) vt->destroy(self);
  }
  Dataset(const Dataset &) = delete;
  Dataset &operator=(const Dataset &) = delete;

  tsr_data_info info() const {
    auto d = sdk::make<tsr_data_info>();
    REQUIRE(vt->info(self, &d) == TSR_OK);
    return d;
  }

  const tsr_dataset_vtable *vt = nullptr;
  void *self = nullptr;
  tsr_status status = TSR_OK;
};

struct Batch {
  Batch(int64_t n, int64_t t)
      : x(static_cast<size_t>(n * t), -99), y(static_cast<size_t>(n * t), -99), T(t) {
    shape[0] = n;
    shape[1] = t;
    b = sdk::make<tsr_batch>();
    b.size = n;
    b.inputs = sdk::view(x.data(), DLDevice{kDLCPU, 0}, sdk::dtype_i32(), 2, shape);
    b.targets = sdk::view(y.data(), DLDevice{kDLCPU, 0}, sdk::dtype_i32(), 2, shape);
  }
  std::vector<int32_t> input(size_t i) const {
    return {x.begin() + static_cast<long>(i) * T, x.begin() + static_cast<long>(i + 1) * T};
  }
  std::vector<int32_t> target(size_t i) const {
    return {y.begin() + static_cast<long>(i) * T, y.begin() + static_cast<long>(i + 1) * T};
  }
  std::vector<int32_t> x, y;
  int64_t T;
  int64_t shape[2];
  tsr_batch b;
};

tsr_status read(Dataset &d, const std::vector<int64_t> &idx, Batch &batch) {
  return d.vt->read(d.self, idx.data(), &batch.b);
}

std::vector<int32_t> slice(const std::vector<uint32_t> &v, size_t from, size_t n) {
  return std::vector<int32_t>(v.begin() + static_cast<long>(from),
                              v.begin() + static_cast<long>(from + n));
}

// 'text', built without operator+(const char *, string&&), which trips
// GCC 12's -Wrestrict.
std::string quoted(const std::string &text) {
  std::string out(1, '\'');
  out += text;
  out += '\'';
  return out;
}

std::string create_error(Fixture &f, const std::string &toml, tsr_status expected) {
  Dataset d(f, toml);
  CHECK(d.status == expected);
  CHECK(d.self == nullptr);
  return f.host.last_error();
}

}  // namespace

TEST_CASE("token shard writer: header, uint16 tokens, shard sizes", "[tokens]") {
  TempDir dir;
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 25; ++i) tokens.push_back(i * 2621u % 65536u);
  const auto files = write_shards(dir.path(), "x_train", tokens, 2, 10);
  REQUIRE(files.size() == 3);
  CHECK(files[0].filename() == "x_train_000000.bin");
  CHECK(files[2].filename() == "x_train_000002.bin");
  CHECK(data::existing_shards(dir.path(), "x_train") == files);
  CHECK(data::existing_shards(dir.path(), "x").empty());
  size_t at = 0;
  for (size_t s = 0; s < files.size(); ++s) {
    const auto b = read_bytes(files[s]);
    const int32_t count = s < 2 ? 10 : 5;
    REQUIRE(b.size() == 1024 + 2 * static_cast<size_t>(count));
    CHECK(header_int(b, 0) == 20240520);
    CHECK(header_int(b, 1) == 1);
    CHECK(header_int(b, 2) == count);
    for (size_t i = 3; i < 256; ++i) CHECK(header_int(b, i) == 0);
    for (int32_t i = 0; i < count; ++i, ++at) {
      uint16_t v;
      std::memcpy(&v, b.data() + 1024 + 2 * i, 2);
      CHECK(v == tokens[at]);
    }
  }
  CHECK(data::token_width_for_vocab(256) == 2);
  CHECK(data::token_width_for_vocab(50257) == 2);
  CHECK(data::token_width_for_vocab(65536) == 2);
  CHECK(data::token_width_for_vocab(65537) == 4);
  CHECK(data::token_width_for_vocab(128256) == 4);
  // No token, no file; a token too large for uint16 is refused.
  data::ShardWriter empty(dir.path(), "empty", 2, 10);
  empty.finish();
  CHECK(empty.files().empty());
  data::ShardWriter narrow(dir.path(), "narrow", 2, 10);
  CHECK_THROWS_AS(narrow.add(70000u), tessera::Error);
}

TEST_CASE("tokens reads windows and next-token targets across shards", "[tokens]") {
  TempDir dir;
  // Shards of 10, 10 and 5 tokens; T = 3: windows per shard (10-1)/3 = 3,
  // 3 and (5-1)/3 = 1.
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 25; ++i) tokens.push_back(1000 + i);
  write_shards(dir.path(), "d_train", tokens, 2, 10);
  Fixture f;
  Dataset d(
      f, std::string("files = ['") + dir.file("d_train_*.bin") + "']\ncontext = 3\nvocab = 2000");
  INFO(f.host.last_error());
  REQUIRE(d.status == TSR_OK);
  const tsr_data_info info = d.info();
  CHECK(info.length == 7);
  CHECK(info.input_dtype.code == kDLInt);
  CHECK(info.input_dtype.bits == 32);
  CHECK(info.input_ndim == 1);
  CHECK(info.input_shape[0] == 3);
  CHECK(info.target_dtype.code == kDLInt);
  CHECK(info.target_dtype.bits == 32);
  CHECK(info.target_ndim == 1);
  CHECK(info.target_shape[0] == 3);
  CHECK(info.num_classes == 2000);

  // Window k of shard s starts at s * 10 + (k - first) * 3.
  const std::vector<int64_t> idx = {0, 2, 3, 5, 6, 0};
  const std::vector<size_t> start = {0, 6, 10, 16, 20, 0};
  Batch batch(6, 3);
  REQUIRE(read(d, idx, batch) == TSR_OK);
  for (size_t i = 0; i < idx.size(); ++i) {
    INFO("sample " << idx[i]);
    CHECK(batch.input(i) == slice(tokens, start[i], 3));
    CHECK(batch.target(i) == slice(tokens, start[i] + 1, 3));
  }

  Batch one(1, 3);
  CHECK(read(d, {7}, one) == TSR_ERR_INVALID);
  CHECK_THAT(f.host.last_error(), Catch::Contains("index 7"));
  CHECK(read(d, {-1}, one) == TSR_ERR_INVALID);
  Batch wrong(1, 4);
  CHECK(read(d, {0}, wrong) == TSR_ERR_INVALID);
  CHECK_THAT(f.host.last_error(), Catch::Contains("shape"));
}

TEST_CASE("tokens limit keeps windows spread evenly", "[tokens]") {
  TempDir dir;
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 25; ++i) tokens.push_back(i);
  write_shards(dir.path(), "l", tokens, 2, 10);  // 3 + 3 + 1 = 7 windows of T = 3
  Fixture f;
  Dataset d(f, std::string("files = '") + dir.file("l_*.bin") + "'\ncontext = 3\nlimit = 3");
  REQUIRE(d.status == TSR_OK);
  CHECK(d.info().length == 3);
  // Sample j is window floor(j * 7 / 3): 0, 2, 4, starting at tokens 0, 6 and 13.
  Batch b(3, 3);
  REQUIRE(read(d, {0, 1, 2}, b) == TSR_OK);
  CHECK(b.input(0) == std::vector<int32_t>{0, 1, 2});
  CHECK(b.input(1) == std::vector<int32_t>{6, 7, 8});
  CHECK(b.input(2) == std::vector<int32_t>{13, 14, 15});
  Batch one(1, 3);
  CHECK(read(d, {3}, one) == TSR_ERR_INVALID);
  Dataset all(f, std::string("files = '") + dir.file("l_*.bin") + "'\ncontext = 3\nlimit = 70");
  REQUIRE(all.status == TSR_OK);
  CHECK(all.info().length == 7);
}

TEST_CASE("tokens files: one pattern or several, sorted and deduplicated", "[tokens]") {
  TempDir dir;
  write_shards(dir.path(), "b", {10, 11, 12, 13, 14}, 2, 100);  // b_000000.bin
  write_shards(dir.path(), "a", {1, 2, 3, 4, 5}, 2, 100);       // a_000000.bin
  Fixture f;
  // A single string is a pattern; the matches of all patterns are sorted.
  const std::string one = quoted(dir.file("*.bin"));
  const std::string several = std::string("[") + quoted(dir.file("b_*.bin")) + ", " +
                              quoted(dir.file("a_000000.bin")) + ", " + quoted(dir.file("*.bin")) +
                              "]";
  for (const std::string &files : {one, several}) {
    INFO(files);
    Dataset d(f, std::string("files = ") + files + "\ncontext = 2");
    INFO(f.host.last_error());
    REQUIRE(d.status == TSR_OK);
    CHECK(d.info().length == 4);  // (5-1)/2 = 2 per shard
    CHECK(d.info().num_classes == 0);
    Batch batch(4, 2);
    REQUIRE(read(d, {0, 1, 2, 3}, batch) == TSR_OK);
    CHECK(batch.input(0) == std::vector<int32_t>{1, 2});
    CHECK(batch.target(1) == std::vector<int32_t>{4, 5});
    CHECK(batch.input(2) == std::vector<int32_t>{10, 11});
    CHECK(batch.target(3) == std::vector<int32_t>{13, 14});
  }
  CHECK_THAT(create_error(f, std::string("files = '") + dir.file("c_*.bin") + "'\ncontext = 2",
                          TSR_ERR_CONFIG),
             Catch::Contains("matches no file") && Catch::Contains("c_*.bin"));
  CHECK_THAT(create_error(f, std::string("files = '") + dir.file("none.bin") + "'\ncontext = 2",
                          TSR_ERR_CONFIG),
             Catch::Contains("no such file") && Catch::Contains("none.bin"));
  CHECK_THAT(create_error(f, std::string("files = '") + dir.file("a_*.bin") + "'\ncontext = 5",
                          TSR_ERR_INVALID),
             Catch::Contains("no window") && Catch::Contains("a_000000.bin"));
  CHECK_THROWS(f.config("dataset", "tokens", "context = 4"));  // files is required
  CHECK_THROWS(f.config("dataset", "tokens", "files = 'x'"));  // and context
}

TEST_CASE("tokens reads the uint32 variant (magic 20240801, version 7)", "[tokens]") {
  TempDir dir;
  const std::vector<uint32_t> tokens = {70000, 5, 128255, 65536, 99999, 1, 2};
  const auto files = write_shards(dir.path(), "big", tokens, 4, 1000);
  REQUIRE(files.size() == 1);
  const auto b = read_bytes(files[0]);
  REQUIRE(b.size() == 1024 + 4 * tokens.size());
  CHECK(header_int(b, 0) == 20240801);
  CHECK(header_int(b, 1) == 7);
  CHECK(header_int(b, 2) == 7);
  // A uint16 shard alongside it reads too.
  write_shards(dir.path(), "small", {7, 8, 9, 10}, 2, 1000);
  Fixture f;
  Dataset d(f, std::string("files = ['") + files[0].string() + "', '" + dir.file("small_*.bin") +
                   "']\ncontext = 3\nvocab = 128256");
  INFO(f.host.last_error());
  REQUIRE(d.status == TSR_OK);
  CHECK(d.info().length == 3);  // (7-1)/3 + (4-1)/3
  Batch batch(3, 3);
  REQUIRE(read(d, {0, 1, 2}, batch) == TSR_OK);
  CHECK(batch.input(0) == std::vector<int32_t>{70000, 5, 128255});
  CHECK(batch.target(0) == std::vector<int32_t>{5, 128255, 65536});
  CHECK(batch.input(1) == std::vector<int32_t>{65536, 99999, 1});
  CHECK(batch.target(1) == std::vector<int32_t>{99999, 1, 2});
  CHECK(batch.input(2) == std::vector<int32_t>{7, 8, 9});
}

TEST_CASE("tokens checks every header field against the file", "[tokens]") {
  TempDir dir;
  const std::vector<uint32_t> t = {1, 2, 3, 4, 5, 6};
  struct Case {
    const char *name;
    std::vector<unsigned char> bytes;
    std::vector<std::string> expect;
  };
  std::vector<unsigned char> short_file(100, 0);
  const std::vector<Case> cases = {
      {"magic", shard_bytes(12345, 1, 6, t, 2), {"magic 12345", "20240520", "20240801"}},
      {"version16", shard_bytes(20240520, 2, 6, t, 2), {"version 2", "expected 1"}},
      {"version32", shard_bytes(20240801, 1, 6, t, 4), {"version 1", "expected 7"}},
      {"negative", shard_bytes(20240520, 1, -3, t, 2), {"negative token count"}},
      {"truncated", shard_bytes(20240520, 1, 9, t, 2), {"truncated", "9 tokens", "1036 bytes"}},
      {"truncated32", shard_bytes(20240801, 7, 6, t, 2), {"truncated", "6 tokens of 4 bytes"}},
      {"trailing", shard_bytes(20240520, 1, 4, t, 2), {"4 bytes after the 4 tokens"}},
      {"short", short_file, {"100 bytes", "too short", "header"}},
  };
  Fixture f;
  for (const auto &c : cases) {
    INFO(c.name);
    const std::string path = dir.file(std::string(c.name) + ".bin");
    write_bytes(path, c.bytes);
    const std::string msg =
        create_error(f, std::string("files = '") + path + "'\ncontext = 2", TSR_ERR_INVALID);
    CHECK_THAT(msg, Catch::Contains(path));
    for (const auto &e : c.expect) CHECK_THAT(msg, Catch::Contains(e));
  }
  // A good shard next to a bad one: still an error naming the bad one.
  write_bytes(dir.file("good.bin"), shard_bytes(20240520, 1, 6, t, 2));
  const std::string msg = create_error(
      f, std::string("files = '") + dir.file("*.bin") + "'\ncontext = 2", TSR_ERR_INVALID);
  CHECK_THAT(msg, Catch::Contains(std::string("shard '") + dir.file("magic.bin") + "'"));
}

TEST_CASE("tokens checks tokens against vocab as windows are read", "[tokens]") {
  TempDir dir;
  // Window 1 (tokens 3..6) holds 300 at token offset 5.
  write_bytes(dir.file("v.bin"), shard_bytes(20240520, 1, 9, {1, 2, 3, 4, 5, 300, 7, 8, 9}, 2));
  Fixture f;
  Dataset d(f, std::string("files = '") + dir.file("v.bin") + "'\ncontext = 3\nvocab = 256");
  REQUIRE(d.status == TSR_OK);  // lazily: create does not scan
  Batch ok(1, 3);
  CHECK(read(d, {0}, ok) == TSR_OK);
  Batch bad(2, 3);
  CHECK(read(d, {0, 1}, bad) == TSR_ERR_INVALID);
  const std::string msg = f.host.last_error();
  CHECK_THAT(msg, Catch::Contains(dir.file("v.bin")));
  CHECK_THAT(msg, Catch::Contains("token 300"));
  CHECK_THAT(msg, Catch::Contains("token offset 5"));
  CHECK_THAT(msg, Catch::Contains("byte offset 1034"));
  CHECK_THAT(msg, Catch::Contains("vocab = 256"));
  // Without vocab, nothing to check.
  Dataset open(f, std::string("files = '") + dir.file("v.bin") + "'\ncontext = 3");
  REQUIRE(open.status == TSR_OK);
  CHECK(read(open, {0, 1}, bad) == TSR_OK);
  CHECK(bad.input(1) == std::vector<int32_t>{4, 5, 300});
}

TEST_CASE("tokens reads concurrently", "[tokens]") {
  TempDir dir;
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 4097; ++i) tokens.push_back(i % 50000);
  write_shards(dir.path(), "c", tokens, 2, 1 << 20);
  Fixture f;
  Dataset d(f, std::string("files = '") + dir.file("c_*.bin") + "'\ncontext = 16");
  REQUIRE(d.status == TSR_OK);
  REQUIRE(d.info().length == 256);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Batch b(64, 16);
      std::vector<int64_t> idx;
      for (int64_t i = 0; i < 64; ++i) idx.push_back((i * 4 + t) % 256);
      if (d.vt->read(d.self, idx.data(), &b.b) != TSR_OK) ++bad;
      for (size_t i = 0; i < 64; ++i)
        if (b.x[i * 16] != static_cast<int32_t>(idx[i] * 16) || b.y[i * 16] != b.x[i * 16] + 1)
          ++bad;
    });
  }
  for (auto &th : threads) th.join();
  CHECK(bad == 0);
}

// ---- GPT-2 pre-tokenization and BPE ---------------------------------------

namespace {

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

TEST_CASE("tokens reads what tessera data tokenize writes", "[tokens]") {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 30; ++i) text += "fortune " + std::to_string(i) + "\n%\n";
  {
    std::ofstream out(dir.file("in.txt"), std::ios::binary);
    out << text;
  }
  const std::string cmd = std::string("'") + TESSERA_BINARY + "' data tokenize '" +
                          dir.file("in.txt") + "' -o '" + dir.file("out") +
                          "' --doc-separator % --eval-fraction 0.1 > /dev/null";
  REQUIRE(std::system(cmd.c_str()) == 0);
  Fixture f;
  for (const char *split : {"train", "eval"}) {
    INFO(split);
    Dataset d(f,
              std::string("files = '") + dir.file("out") + "/out_" + split +
                  "_*.bin'\ncontext = 8\nvocab = 256",
              split);
    INFO(f.host.last_error());
    REQUIRE(d.status == TSR_OK);
    const int64_t n = d.info().length;
    REQUIRE(n > 0);
    Batch b(n, 8);
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    REQUIRE(read(d, idx, b) == TSR_OK);
    std::string got;
    for (int64_t i = 0; i < n; ++i)
      for (int32_t t : b.input(static_cast<size_t>(i))) got += static_cast<char>(t);
    // Byte-level: the windows spell the documents with their '%' lines.
    CHECK(got.rfind(split == std::string("train") ? "fortune 0\n%\nfortune 1\n" : "fortune 4\n%\n",
                    0) == 0);
  }
}
