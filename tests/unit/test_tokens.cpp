// Token shards: the engine's writer (data/token_shard) read back by the
// "tokens" dataset plugin, both token widths, header validation, windows
// and targets, several shards by glob, the vocab check, concurrent reads,
// and what `tessera data tokenize` writes (byte-level, and uint32 shards from
// a tokenizer.json of over 65536 ids). GPT-2's pre-tokenizer and BPE are in
// test_tokens_bpe.cpp, tokenizer.json in test_tokenizer_json.cpp.
#include <stdlib.h>
#include <tessera/dataset.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tessera/cpp/plugin.hpp>
#include <thread>
#include <vector>

#include "data/token_shard.hpp"
#include "support/fixture.hpp"
#include "support/temp_dir.hpp"
#include "util/error.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_tokens {

namespace {

namespace fs = std::filesystem;
namespace sdk = tessera::sdk;
namespace data = tessera::data;
using tessera::test::Fixture;

using TempDir = tessera::test::TempDir;

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

TEST_CASE("tokens reads the uint32 shards tokenize writes for a large vocabulary", "[tokens]") {
  // The golden tokenizer.json grown past 65536 ids: filler symbols no merge
  // makes, then an added token with id 70400.
  nlohmann::json j;
  {
    std::ifstream in(tessera::test::data_path("bpe_tokenizer/tokenizer.json"));
    REQUIRE(in);
    j = nlohmann::json::parse(in);
  }
  for (uint32_t id = 400; id < 70400; ++id) j["model"]["vocab"]["zzfill" + std::to_string(id)] = id;
  j["added_tokens"].push_back({{"id", 70400}, {"content", "<|big|>"}, {"special", true}});
  TempDir dir;
  {
    std::ofstream out(dir.file("tokenizer.json"), std::ios::binary);
    out << j.dump();
    std::ofstream text(dir.file("in.txt"), std::ios::binary);
    text << "Hello world<|big|>Hello world<|big|>";
  }
  const std::string cmd = std::string("'") + TESSERA_BINARY + "' data tokenize '" +
                          dir.file("in.txt") + "' -o '" + dir.file("out") + "' --tokenizer '" +
                          dir.file("tokenizer.json") + "' --eval-fraction 0 > /dev/null";
  REQUIRE(std::system(cmd.c_str()) == 0);
  const auto b = read_bytes(dir.file("out/out_train_000000.bin"));
  REQUIRE(b.size() >= 1024);
  CHECK(header_int(b, 0) == 20240801);  // uint32 tokens
  Fixture f;
  Dataset d(f, std::string("files = '") + dir.file("out/out_train_*.bin") +
                   "'\ncontext = 10\nvocab = 70401");
  INFO(f.host.last_error());
  REQUIRE(d.status == TSR_OK);
  REQUIRE(d.info().length == 2);  // 22 tokens: two windows of 10 + 1
  Batch batch(2, 10);
  REQUIRE(read(d, {0, 1}, batch) == TSR_OK);
  // "Hello world" is the golden ids 41 70 77 328 222 88 80 83 77 69.
  CHECK(batch.input(0) == std::vector<int32_t>{41, 70, 77, 328, 222, 88, 80, 83, 77, 69});
  CHECK(batch.target(0).back() == 70400);
  CHECK(batch.input(1).front() == 70400);
  CHECK(batch.target(1) == std::vector<int32_t>{41, 70, 77, 328, 222, 88, 80, 83, 77, 69});
}

}  // namespace unit_test_tokens

namespace unit_test_tokens {

// Issue 53, item 2: a shard truncated while a job reads it was read through
// a shared mapping, and the next window past the new end killed the rank
// with SIGBUS. Now it is an error naming the file and the rank; a shard
// renamed over while open is read as it was opened.
TEST_CASE("a token shard truncated or replaced under a reader: an error, never SIGBUS",
          "[tokens][security]") {
  TempDir dir;
  // Two shards of 4000 tokens (9024 bytes each, three pages): a window past
  // the first page of a shard cut to 1026 bytes was a SIGBUS through the
  // mapping (one inside the first page read zeros, silently).
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 8000; ++i) tokens.push_back(100 + i);
  const auto files = write_shards(dir.path(), "t_train", tokens, 2, 4000);
  REQUIRE(files.size() == 2);
  Fixture f;
  Dataset d(f, "files = ['" + dir.file("t_train_*.bin") + "']\ncontext = 3");
  REQUIRE(d.status == TSR_OK);
  Batch batch(1, 3);
  REQUIRE(read(d, {1335}, batch) == TSR_OK);  // window 2 of the second shard
  CHECK(batch.input(0) == slice(tokens, 4006, 3));
  // Replaced by a rename: the open shard is the old file, read whole.
  const fs::path other = dir.path() / "new.bin";
  write_bytes(other, shard_bytes(20240520, 1, 20, std::vector<uint32_t>(20, 7), 2));
  fs::rename(other, files[1]);
  REQUIRE(read(d, {1335}, batch) == TSR_OK);
  CHECK(batch.input(0) == slice(tokens, 4006, 3));
  // The first shard cut to its header and a token while open; window 1000
  // starts at token 3000, byte 7024.
  REQUIRE(::truncate(files[0].c_str(), 1024 + 2) == 0);
  CHECK(read(d, {1000}, batch) == TSR_ERR_IO);
  const std::string err = f.host.last_error();
  CHECK_THAT(err, Catch::Contains("shard '" + files[0].string() + "' (rank 0)") &&
                      Catch::Contains("9024 bytes when opened, 1026 bytes now") &&
                      Catch::Contains("truncated or rewritten in place"));
}

}  // namespace unit_test_tokens
