// tessera data encode / decode / tokenize --tokenizer with a Hugging Face
// tokenizer.json: the golden cases (tests/data/bpe_tokenizer, made with the
// tokenizers library) through the command line, the refusal of a file that
// is not a byte-level BPE, and, where Python's `tokenizers` is importable,
// Llama 3-, Qwen2- and GPT-2-shaped tokenizers against that library
// (tokenizers_compare.py).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace itest_test_tokenizer_cli {

using namespace tessera::itest;
using nlohmann::json;

namespace {

const std::string kGoldenDir = std::string(TESSERA_SOURCE_DIR) + "/tests/data/bpe_tokenizer";

struct Piped {
  int status = -1;
  std::string out, err;
};

// Runs `tessera data ARGS` with `input` on stdin (run_cli has no stdin).
Piped pipe_cli(const std::string &args, const std::string &input) {
  const fs::path in = scratch() / "stdin", out = scratch() / "stdout", err = scratch() / "stderr";
  write_text(in, input);
  const std::string cmd = std::string("'") + TESSERA_BINARY + "' data " + args + " < '" +
                          in.string() + "' > '" + out.string() + "' 2> '" + err.string() + "'";
  const int rc = std::system(cmd.c_str());
  Piped p;
  p.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
  p.out = read_text(out);
  p.err = read_text(err);
  return p;
}

json golden_cases() {
  std::ifstream in(kGoldenDir + "/reference.json");
  REQUIRE(in);
  return json::parse(in);
}

std::vector<uint32_t> shard_tokens(const fs::path &p) {
  const std::string b = read_text(p);
  REQUIRE(b.size() >= 1024);
  int32_t magic = 0;
  std::memcpy(&magic, b.data(), 4);
  const size_t width = magic == 20240801 ? 4 : 2;
  std::vector<uint32_t> out;
  for (size_t at = 1024; at + width <= b.size(); at += width) {
    uint32_t v = 0;
    std::memcpy(&v, b.data() + at, width);
    out.push_back(v);
  }
  return out;
}

}  // namespace

TEST_CASE("data encode and decode give the golden ids and texts", "[cli][tokenizer]") {
  for (const auto &c : golden_cases()) {
    const std::string text = c["text"];
    INFO(text);
    Piped enc = pipe_cli("encode --tokenizer '" + kGoldenDir + "/tokenizer.json'", text);
    INFO(enc.err);
    REQUIRE(enc.status == 0);
    CHECK(json::parse(enc.out) == c["ids"]);
    Piped dec = pipe_cli("decode --tokenizer '" + kGoldenDir + "'", c["ids"].dump());
    INFO(dec.err);
    REQUIRE(dec.status == 0);
    CHECK(dec.out == text);
  }
  Piped skip =
      pipe_cli("decode --skip-special-tokens --tokenizer '" + kGoldenDir + "'", "[0, 85, 1]");
  CHECK(skip.out == "t");
}

TEST_CASE("data encode/decode: help, bad input, unsupported tokenizers", "[cli][tokenizer]") {
  for (const char *cmd : {"encode", "decode"}) {
    RunResult help = run_cli({"data", cmd, "--help"});
    CHECK(help.status == 0);
    CHECK(contains(help.out, "--tokenizer"));
  }
  CHECK(contains(run_cli({"data", "--help"}).out, "encode"));
  Piped none = pipe_cli("encode", "hi");
  CHECK(none.status == 2);
  CHECK(contains(none.err, "--tokenizer"));
  Piped bad_ids = pipe_cli("decode --tokenizer '" + kGoldenDir + "'", "[1, -2]");
  CHECK(bad_ids.status == 1);
  CHECK(contains(bad_ids.err, "element 1"));
  Piped big_id = pipe_cli("decode --tokenizer '" + kGoldenDir + "'", "[5, 123456]");
  CHECK(big_id.status == 1);
  CHECK(contains(big_id.err, "123456"));

  std::ifstream in(kGoldenDir + "/tokenizer.json");
  json unigram = json::parse(in);
  unigram["model"] = {{"type", "Unigram"}, {"unk_id", 0}, {"vocab", json::array()}};
  write_text(scratch() / "unigram" / "tokenizer.json", unigram.dump());
  Piped refused = pipe_cli("encode --tokenizer '" + (scratch() / "unigram").string() + "'", "hi");
  CHECK(refused.status == 1);
  CHECK(contains(refused.err, "'Unigram'"));
  CHECK(contains(refused.err, "unigram/tokenizer.json"));
  RunResult tok = run_cli({"data", "tokenize", kGoldenDir + "/reference.json", "-o",
                           (scratch() / "out").string(), "--eval-fraction", "0", "--tokenizer",
                           (scratch() / "unigram").string()});
  CHECK(tok.status == 1);
  CHECK(contains(tok.err, "'Unigram'"));
}

TEST_CASE("data tokenize --tokenizer writes the tokenizer's ids", "[cli][tokenizer]") {
  const json cases = golden_cases();
  const std::string text = cases[0]["text"];  // "Hello world"
  write_text(scratch() / "a.txt", text);
  RunResult r =
      run_cli({"data", "tokenize", (scratch() / "a.txt").string(), "-o",
               (scratch() / "out").string(), "--eval-fraction", "0", "--tokenizer", kGoldenDir});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "uint16 tokens"));
  CHECK(contains(r.out, "vocab = 400"));
  // The golden tokenizer has no template and no <|endoftext|>: the ids alone.
  CHECK(shard_tokens(scratch() / "out" / "out_train_000000.bin") ==
        cases[0]["ids"].get<std::vector<uint32_t>>());
}

TEST_CASE("data encode/decode equal Hugging Face tokenizers (where importable)",
          "[cli][tokenizer]") {
  const std::string cmd = "python3 '" + std::string(TESSERA_SOURCE_DIR) +
                          "/tests/integration/tokenizers_compare.py' '" + TESSERA_BINARY + "' '" +
                          (scratch() / "hf").string() + "' > '" +
                          (scratch() / "compare.log").string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  const int status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
  if (status == 77) {
    WARN("skipped: Python's tokenizers is not importable here (pip install tokenizers)");
    return;
  }
  INFO(read_text(scratch() / "compare.log"));
  CHECK(status == 0);
}

TEST_CASE("generate --tokenizer encodes the prompt and stops at the model's eos",
          "[cli][tokenizer][generate]") {
  // A tiny gpt2 over the golden tokenizer's 400 ids, trained two steps on
  // shards that tokenize writes with it.
  std::string text;
  for (int i = 0; i < 40; ++i)
    for (const auto &c : golden_cases()) text += c["text"].get<std::string>() + "\n";
  write_text(scratch() / "corpus.txt", text);
  RunResult r =
      run_cli({"data", "tokenize", (scratch() / "corpus.txt").string(), "-o",
               (scratch() / "data").string(), "--eval-fraction", "0", "--tokenizer", kGoldenDir});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  const fs::path run_dir = scratch() / "run", cfg = scratch() / "tiny.toml";
  write_text(cfg, "[run]\nname = \"tiny\"\ndevice = \"cpu\"\nseed = 7\nsteps = 2\ndir = \"" +
                      run_dir.string() +
                      "\"\n\n[batch]\nmicro = 2\n\n[model]\nplugin = \"gpt2\"\nlayers = 1\n"
                      "heads = 2\nwidth = 32\ncontext = 16\nvocab = 400\n\n[data.train]\n"
                      "plugin = \"tokens\"\nfiles = \"" +
                      (scratch() / "data" / "data_train_*.bin").string() +
                      "\"\ncontext = 16\nvocab = 400\n\n[optimizer]\nplugin = \"adamw\"\n"
                      "lr = 0.001\n\n[log]\nplot = false\n");
  r = run_cli({"run", cfg.string()}, RunOptions{{}, {}, {}, 120});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  // The tokenizer's directory, with the eos id the model stops at.
  write_text(scratch() / "tok" / "tokenizer.json", read_text(kGoldenDir + "/tokenizer.json"));
  write_text(scratch() / "tok" / "generation_config.json", "{\"eos_token_id\": [1]}");
  r = run_cli({"generate", "--ckpt", (run_dir / "ckpt").string(), "--prompt", "Hello world",
               "--max-tokens", "12", "--seed", "3", "--tokenizer", (scratch() / "tok").string()});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  CHECK(r.out.rfind("Hello world", 0) == 0);
  // "Hello world" is 10 tokens of this tokenizer (11 bytes).
  CHECK(contains(r.err, "after a prompt of 10"));
  r = run_cli({"generate", "--ckpt", (run_dir / "ckpt").string(), "--prompt", "x", "--tokenizer",
               kGoldenDir, "--encoder", "e.json", "--bpe", "v.bpe"});
  CHECK(r.status == 2);
  CHECK(contains(r.err, "not both"));
}

}  // namespace itest_test_tokenizer_cli
