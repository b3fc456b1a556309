// tessera data tokenize: byte-level shards from small text files, the
// document split (one document per file, or --doc-separator), shard sizes,
// names, replacing earlier shards, and the errors a user meets. The shards
// are read back here byte by byte (the tokens plugin's own tests read what
// the same writer makes).
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "harness.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace itest_test_tokenize {

using namespace tessera::itest;

namespace {

struct ShardFile {
  int32_t magic = 0, version = 0, count = 0;
  std::vector<uint32_t> tokens;
  size_t bytes = 0;
};

ShardFile read_shard(const fs::path &p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> b((std::istreambuf_iterator<char>(in)), {});
  ShardFile s;
  s.bytes = b.size();
  REQUIRE(b.size() >= 1024);
  std::memcpy(&s.magic, b.data(), 4);
  std::memcpy(&s.version, b.data() + 4, 4);
  std::memcpy(&s.count, b.data() + 8, 4);
  const size_t width = s.magic == 20240801 ? 4 : 2;
  for (size_t at = 1024; at + width <= b.size(); at += width) {
    uint32_t v = 0;
    std::memcpy(&v, b.data() + at, width);
    s.tokens.push_back(v);
  }
  return s;
}

std::string as_text(const std::vector<uint32_t> &tokens) {
  std::string s;
  for (uint32_t t : tokens) s += static_cast<char>(t);
  return s;
}

}  // namespace

TEST_CASE("data tokenize writes byte-level shards of a text file", "[cli][tokenize]") {
  const std::string text = "The quick brown fox jumps over the lazy dog.\nAnd again.\n";
  write_text(scratch() / "a.txt", text);
  RunResult r = run_cli({"data", "tokenize", (scratch() / "a.txt").string(), "-o",
                         (scratch() / "out").string(), "--eval-fraction", "0"});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "byte-level, vocab 256, uint16"));
  CHECK(contains(r.out, "1 documents, " + std::to_string(text.size()) + " tokens, 1 shard(s)"));
  CHECK(entries(scratch() / "out", "out_") == std::vector<std::string>{"out_train_000000.bin"});
  const ShardFile s = read_shard(scratch() / "out" / "out_train_000000.bin");
  CHECK(s.magic == 20240520);
  CHECK(s.version == 1);
  CHECK(s.count == static_cast<int32_t>(text.size()));
  CHECK(s.bytes == 1024 + 2 * text.size());
  CHECK(as_text(s.tokens) == text);
}

TEST_CASE("data tokenize splits documents into train and eval, in shards", "[cli][tokenize]") {
  // 40 fortunes in two files; every 20th document (5%) goes to eval.
  std::string f1, f2, all_docs;
  std::vector<std::string> docs;
  for (int i = 0; i < 40; ++i) {
    std::string doc = "Fortune number " + std::to_string(i) + ".\nSecond line.\n";
    docs.push_back(doc);
    (i < 25 ? f1 : f2) += doc + "%\n";
  }
  write_text(scratch() / "f1", f1);
  write_text(scratch() / "f2", f2);
  RunResult r = run_cli({"data", "tokenize", (scratch() / "f1").string(),
                         (scratch() / "f2").string(), "-o", (scratch() / "out").string(),
                         "--doc-separator", "%", "--name", "fort", "--shard-tokens", "500"});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  // round((d+1)/20) > round(d/20): d = 9 and d = 29.
  std::string eval_text = docs[9] + "%\n" + docs[29] + "%\n", train_text;
  for (int i = 0; i < 40; ++i)
    if (i != 9 && i != 29) train_text += docs[static_cast<size_t>(i)] + "%\n";
  CHECK(contains(r.out, "38 documents, " + std::to_string(train_text.size()) + " tokens"));
  CHECK(contains(r.out, "2 documents, " + std::to_string(eval_text.size()) + " tokens"));
  const auto train = entries(scratch() / "out", "fort_train_");
  const auto eval = entries(scratch() / "out", "fort_eval_");
  REQUIRE(train.size() == (train_text.size() + 499) / 500);
  REQUIRE(eval.size() == 1);
  std::string got;
  for (size_t i = 0; i < train.size(); ++i) {
    const ShardFile s = read_shard(scratch() / "out" / train[i]);
    CHECK(s.count == static_cast<int32_t>(s.tokens.size()));
    if (i + 1 < train.size()) CHECK(s.count == 500);
    got += as_text(s.tokens);
  }
  CHECK(got == train_text);
  CHECK(as_text(read_shard(scratch() / "out" / eval[0]).tokens) == eval_text);

  // Again with larger shards: the earlier, extra shards are gone.
  r = run_cli({"data", "tokenize", (scratch() / "f1").string(), (scratch() / "f2").string(), "-o",
               (scratch() / "out").string(), "--doc-separator", "%", "--name", "fort"});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  CHECK(entries(scratch() / "out", "fort_train_").size() == 1);
  CHECK(entries(scratch() / "out", "fort_") ==
        std::vector<std::string>{"fort_eval_000000.bin", "fort_train_000000.bin"});
}

TEST_CASE("data tokenize errors name the file or the option", "[cli][tokenize]") {
  write_text(scratch() / "one.txt", "just one document\n");
  auto fails = [](const std::vector<std::string> &args) {
    RunResult r = run_cli(args);
    INFO(describe(r));
    CHECK(r.status != 0);
    CHECK(r.status < 128);
    return r.err;
  };
  const std::string out = (scratch() / "out").string();
  CHECK(contains(fails({"data", "tokenize", (scratch() / "missing.txt").string(), "-o", out}),
                 "missing.txt"));
  CHECK(contains(fails({"data", "tokenize", scratch().string(), "-o", out}), "directory"));
  CHECK(contains(fails({"data", "tokenize", (scratch() / "one.txt").string()}), "-o OUTDIR"));
  CHECK(contains(fails({"data", "tokenize", (scratch() / "one.txt").string(), "-o", out,
                        "--encoder", "e.json"}),
                 "--bpe"));
  CHECK(contains(fails({"data", "tokenize", (scratch() / "one.txt").string(), "-o", out,
                        "--eval-fraction", "1.5"}),
                 "--eval-fraction"));
  // One document cannot be split: say how to fix it.
  CHECK(contains(fails({"data", "tokenize", (scratch() / "one.txt").string(), "-o", out}),
                 "--doc-separator"));
  CHECK(contains(
      fails({"data", "tokenize", (scratch() / "one.txt").string(), "-o", out, "--encoder",
             (scratch() / "nope.json").string(), "--bpe", (scratch() / "nope.bpe").string()}),
      "nope.json"));
  CHECK(contains(fails({"data", "frobnicate"}), "unknown command"));

  RunResult help = run_cli({"data", "tokenize", "--help"});
  CHECK(help.status == 0);
  CHECK(contains(help.out, "--doc-separator"));
  CHECK(contains(help.out, "--encoder"));
  RunResult top = run_cli({"data", "--help"});
  CHECK(top.status == 0);
  CHECK(contains(top.out, "tokenize"));
}

}  // namespace itest_test_tokenize
