// `tessera eval` beyond one process and one checkpoint: -n N (every rank a
// share, the sums met) against the one-process result, and --init-from a
// Hugging Face directory with no checkpoint, against the reference logits
// that transformers computed for the golden llama (tests/data).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <tessera/cpp/formats/token_shard.hpp>

#include "harness.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace itest_test_eval {

using namespace tessera::itest;
using json = nlohmann::json;

namespace {

const fs::path kLlama = fs::path(TESSERA_SOURCE_DIR) / "tests/data/llama3_L2_C64";

// The result eval prints last (one JSON object), and its line before.
json eval_result(const RunResult &r) {
  const std::vector<std::string> ls = lines(r.out);
  REQUIRE(ls.size() >= 2);
  CHECK(starts_with(ls[ls.size() - 2], "eval | loss "));
  return json::parse(ls.back());
}

// Tensor `name` of a safetensors file as doubles (F64 or I64).
std::vector<double> read_tensor(const fs::path &file, const std::string &name) {
  const std::string bytes = read_text(file);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const json h = json::parse(bytes.substr(8, n));
  const json &t = h.at(name);
  const size_t begin = t.at("data_offsets")[0], end = t.at("data_offsets")[1];
  const char *data = bytes.data() + 8 + n + begin;
  std::vector<double> out((end - begin) / 8);
  for (size_t i = 0; i < out.size(); ++i) {
    if (t.at("dtype") == "F64") {
      std::memcpy(&out[i], data + 8 * i, 8);
    } else {
      int64_t v = 0;
      std::memcpy(&v, data + 8 * i, 8);
      out[i] = static_cast<double>(v);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("eval -n N gives the one-process result", "[eval]") {
  Setup s = setup();
  RunResult r = run_cli({"run", s.config.string(), "--set", "run.steps=6"});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  const std::string ckpt = (s.run_dir / "ckpt").string();
  RunResult one = run_cli({"eval", s.config.string(), "--ckpt", ckpt});
  INFO(describe(one));
  REQUIRE(one.status == 0);
  const json want = eval_result(one);
  REQUIRE(want.at("samples") == 256);
  // 3 ranks: shares of 86, 85 and 85 samples in batches of 32, 32 and 22 or
  // 21 -- a mean of per-rank (or per-batch) means would differ.
  for (const char *n : {"2", "3"}) {
    RunResult many =
        run_cli({"eval", "-n", n, s.config.string(), "--ckpt", ckpt}, {{}, {}, {}, 120});
    INFO("-n " << n << "\n" << describe(many));
    REQUIRE(many.status == 0);
    const json got = eval_result(many);
    CHECK(got.at("samples") == want.at("samples"));
    CHECK(got.at("eval_accuracy") == want.at("eval_accuracy"));
    CHECK(got.at("eval_loss").get<double>() ==
          Approx(want.at("eval_loss").get<double>()).epsilon(1e-6));
    CHECK(got.at("checkpoint") == want.at("checkpoint"));
    CHECK_FALSE(contains(lines(many.out).back(), "[rank"));
  }
}

TEST_CASE("eval --init-from a Hugging Face directory, without a checkpoint", "[eval][llama]") {
  // The reference's two rows of input ids back to back and one more token:
  // the tokens dataset's windows (context 48) are then exactly those rows,
  // each target the next token of the shard.
  const std::vector<double> ids = read_tensor(kLlama / "reference.safetensors", "input_ids");
  const std::vector<double> logits = read_tensor(kLlama / "reference.safetensors", "logits");
  const size_t T = 48, V = 256;
  REQUIRE(ids.size() == 2 * T);
  REQUIRE(logits.size() == 2 * T * V);
  std::vector<uint16_t> tokens;
  for (double v : ids) tokens.push_back(static_cast<uint16_t>(v));
  tokens.push_back(7);
  const fs::path shard = scratch() / "hf_eval" / "tok_000000.bin";
  fs::create_directories(shard.parent_path());
  {
    const auto header =
        tessera::formats::token_shard::header(2, static_cast<int64_t>(tokens.size()));
    std::ofstream out(shard, std::ios::binary);
    out.write(reinterpret_cast<const char *>(header.data()), sizeof header);
    out.write(reinterpret_cast<const char *>(tokens.data()),
              static_cast<std::streamsize>(tokens.size() * 2));
  }
  // The expected mean cross entropy from transformers' float64 logits.
  double want = 0;
  for (size_t p = 0; p < 2 * T; ++p) {
    const double *z = logits.data() + p * V;
    double m = z[0], sum = 0;
    for (size_t v = 0; v < V; ++v) m = std::max(m, z[v]);
    for (size_t v = 0; v < V; ++v) sum += std::exp(z[v] - m);
    want += m + std::log(sum) - z[tokens[p + 1]];
  }
  want /= static_cast<double>(2 * T);
  const fs::path cfg = scratch() / "hf_eval" / "eval.toml";
  write_text(cfg, "[run]\ndevice = \"cpu\"\ndir = \"" + (scratch() / "hf_eval" / "run").string() +
                      "\"\n\n[batch]\nmicro = 2\n\n[model]\nplugin = \"llama\"\n\n"
                      "[data.train]\nplugin = \"tokens\"\nfiles = \"" +
                      shard.string() + "\"\ncontext = 48\nvocab = 256\n");
  RunResult r = run_cli({"eval", cfg.string(), "--init-from", kLlama.string()});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  const json got = eval_result(r);
  CHECK(got.at("samples") == 2 * T);  // what eval counts: targets
  CHECK(got.at("init_from") == kLlama.string());
  CHECK(contains(r.out, "| " + kLlama.string()));
  const double tolerance = 1e-4;
  CHECK(std::fabs(got.at("eval_loss").get<double>() - want) < tolerance);
  // The same architecture from random initial weights is far from it: the
  // comparison above tells the weights apart.
  // (A training run's first loss is the one way to a random model's loss
  // without a checkpoint: its batch of 2 is both windows, before any update.)
  RunResult fresh = run_cli(
      {"run", cfg.string(), "--set", "model.hf_config='" + (kLlama / "config.json").string() + "'",
       "--set", "optimizer.plugin=sgd", "--set", "run.steps=1", "--set", "log.plot=false"});
  INFO(describe(fresh));
  REQUIRE(fresh.status == 0);
  double first = -1;
  for (const auto &m : read_jsonl(scratch() / "hf_eval" / "run" / "metrics.jsonl"))
    if (m.value("type", "") == "train") {
      first = m.at("loss").get<double>();
      break;
    }
  REQUIRE(first > 0);
  CHECK(std::fabs(first - want) > 10 * tolerance);
}

TEST_CASE("eval wants one of --ckpt and --init-from, and a model that takes init_from",
          "[eval][errors]") {
  Setup s = setup();
  RunResult none = run_cli({"eval", s.config.string()});
  CHECK(none.status == 2);
  CHECK(contains(none.err, "--ckpt PATH or --init-from HF_DIR is required"));
  RunResult both = run_cli({"eval", s.config.string(), "--ckpt", "a", "--init-from", "b"});
  CHECK(both.status == 2);
  CHECK(contains(both.err, "exclude each other"));
  // mlp declares no init_from: the message names the key and the option.
  RunResult mlp = run_cli({"eval", s.config.string(), "--init-from", kLlama.string()});
  INFO(describe(mlp));
  CHECK(mlp.status == 1);
  CHECK(contains(mlp.err, "init_from"));
  CHECK(contains(mlp.err, "--init-from"));
}

}  // namespace itest_test_eval
