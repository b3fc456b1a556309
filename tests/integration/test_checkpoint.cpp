// Checkpoints end to end through the real launcher: resume equivalence at
// the same and at another world size and stage, a crash during a save, a
// damaged shard, SIGTERM (save and exit 0), elastic restarts, the ckpt tools.
#include <signal.h>

#include <catch2/catch.hpp>
#include <cmath>

#include "harness.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace itest_test_checkpoint {

using namespace tessera::itest;

namespace {

// Every checkpoint every 10 steps; 60 steps of 64 samples (2 ranks x 32).
const char *kCkpt = "\n[checkpoint]\nevery = 10\nkeep = 3\n";

std::vector<std::string> run_args(const Setup &s, int n,
                                  const std::vector<std::string> &extra = {}) {
  std::vector<std::string> a = {"run"};
  if (n > 1) {
    a.push_back("-n");
    a.push_back(std::to_string(n));
  }
  a.push_back(s.config.string());
  for (const auto &e : extra) a.push_back(e);
  return a;
}

// The final parameters of a run, exported from its latest checkpoint.
std::map<std::string, F32Tensor> final_params(const fs::path &run_dir, const std::string &name) {
  fs::path out = scratch() / (name + ".safetensors");
  RunResult r = run_cli({"ckpt", "export", (run_dir / "ckpt").string(), "-o", out.string()});
  REQUIRE(r.status == 0);
  return read_safetensors_f32(out);
}

// Largest |a - b| / max(|b|, floor) over every parameter.
double max_rel_diff(const std::map<std::string, F32Tensor> &a,
                    const std::map<std::string, F32Tensor> &b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (const auto &[name, t] : b) {
    auto it = a.find(name);
    REQUIRE(it != a.end());
    REQUIRE(it->second.data.size() == t.data.size());
    for (size_t i = 0; i < t.data.size(); ++i)
      worst = std::max(worst, std::abs(double(it->second.data[i]) - t.data[i]) /
                                  std::max(std::abs(double(t.data[i])), 1e-3));
  }
  return worst;
}

RunOptions opts(double timeout_s, std::map<std::string, std::string> env = {}) {
  RunOptions o;
  o.timeout_s = timeout_s;
  o.env = std::move(env);
  return o;
}

bool bitwise_equal(const std::map<std::string, F32Tensor> &a,
                   const std::map<std::string, F32Tensor> &b) {
  if (a.size() != b.size()) return false;
  for (const auto &[name, t] : b) {
    auto it = a.find(name);
    if (it == a.end() || it->second.data != t.data) return false;
  }
  return true;
}

std::string latest_of(const fs::path &run_dir) {
  std::string s = read_text(run_dir / "ckpt" / "latest");
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

TEST_CASE("a run killed by SIGKILL and resumed ends bitwise equal to the uninterrupted run",
          "[checkpoint]") {
  Setup ref = setup(std::string(kCkpt) + "\n[zero]\nplugin = \"stage2\"\n", "reference");
  RunResult a = run_cli(run_args(ref, 2), opts(120));
  REQUIRE(a.status == 0);

  Setup s = setup(std::string(kCkpt) + "\n[zero]\nplugin = \"stage2\"\n", "killed");
  RunResult killed = run_cli(run_args(s, 2), opts(120, {{"TESSERA_TEST_CRASH", "rank=1,step=30"}}));
  CHECK(killed.status != 0);
  CHECK_THAT(killed.err, Catch::Contains("rank 1") && Catch::Contains("SIGKILL"));
  // The step-30 checkpoint was not written (the crash comes first): 20 is latest.
  CHECK(latest_of(s.run_dir) == "step_00000020");

  RunResult resumed = run_cli(run_args(s, 2, {"--set", "checkpoint.resume=\"auto\""}), opts(120));
  REQUIRE(resumed.status == 0);
  CHECK_THAT(resumed.out, Catch::Contains("resumed from") && Catch::Contains("at step 20"));
  CHECK(bitwise_equal(final_params(s.run_dir, "resumed"), final_params(ref.run_dir, "reference")));
  // The logged losses match the reference's, the whole history: steps 10
  // and 20 from before the kill are kept, 30..60 come from the resumed run
  // (issue 23: a resume appends to metrics.jsonl).
  auto ra = train_losses(read_jsonl(ref.run_dir / "metrics.jsonl"));
  auto rb = train_losses(read_jsonl(s.run_dir / "metrics.jsonl"));
  REQUIRE(ra.size() == 6);
  REQUIRE(rb.size() == 6);
  CHECK(rb == ra);
}

TEST_CASE("a checkpoint resumes at another world size and ZeRO stage", "[checkpoint]") {
  Setup ref = setup(std::string(kCkpt) + "\n[zero]\nplugin = \"stage1\"\n", "ref2");
  REQUIRE(run_cli(run_args(ref, 2), opts(120)).status == 0);
  // Stop a 2-rank stage-1 run at step 30, continue on 1 rank with stage 3 and
  // on 4 ranks (micro 16) with stage 0.
  for (auto [n, stage, micro] : {std::tuple{1, "stage3", 64}, std::tuple{4, "stage0", 16}}) {
    Setup s = setup(std::string(kCkpt) + "\n[zero]\nplugin = \"stage1\"\n",
                    std::string("cross_") + stage);
    REQUIRE(run_cli(run_args(s, 2, {"--set", "run.steps=30"}), opts(120)).status == 0);
    RunResult r =
        run_cli(run_args(s, n,
                         {"--set", "checkpoint.resume=\"auto\"", "--set",
                          std::string("zero.plugin=\"") + stage + "\"", "--set",
                          "batch.micro=" + std::to_string(micro), "--set", "batch.global=64"}),
                opts(120));
    REQUIRE(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("at step 30"));
    INFO("world " << n << ", " << stage);
    CHECK(max_rel_diff(final_params(s.run_dir, std::string("x") + stage),
                       final_params(ref.run_dir, "ref2")) < 1e-5);
  }
}

TEST_CASE("a worker killed while a checkpoint is written leaves the previous one as latest",
          "[checkpoint]") {
  Setup s = setup(kCkpt, "save_crash");
  RunResult r =
      run_cli(run_args(s, 2), opts(120, {{"TESSERA_TEST_CRASH", "rank=1,step=40,at=save"}}));
  CHECK(r.status != 0);
  CHECK(latest_of(s.run_dir) == "step_00000030");
  // The half-written step 40 never became a checkpoint.
  CHECK_FALSE(fs::exists(s.run_dir / "ckpt" / "step_00000040" / "manifest.json"));
  RunResult resumed = run_cli(run_args(s, 2, {"--set", "checkpoint.resume=\"auto\""}), opts(120));
  REQUIRE(resumed.status == 0);
  CHECK_THAT(resumed.out, Catch::Contains("at step 30"));
  CHECK(run_cli({"ckpt", "verify", (s.run_dir / "ckpt").string()}).status == 0);
}

TEST_CASE("one flipped byte in a shard is refused, naming the file and tensor", "[checkpoint]") {
  Setup s = setup(kCkpt, "flipped");
  REQUIRE(run_cli(run_args(s, 2, {"--set", "run.steps=20"}), opts(120)).status == 0);
  fs::path shard = s.run_dir / "ckpt" / "step_00000020" / "rank_00001.safetensors";
  REQUIRE(fs::exists(shard));
  std::string bytes = read_text(shard);
  size_t at = bytes.size() - 17;  // inside the last tensor's data
  bytes[at] = static_cast<char>(bytes[at] ^ 0x40);
  write_text(shard, bytes);
  RunResult v = run_cli({"ckpt", "verify", (s.run_dir / "ckpt").string()});
  CHECK(v.status == 1);
  CHECK_THAT(v.err, Catch::Contains("rank_00001.safetensors") && Catch::Contains("tensor '"));
  RunResult r = run_cli(run_args(s, 2, {"--set", "checkpoint.resume=\"auto\""}), opts(120));
  CHECK(r.status != 0);
  CHECK_THAT(r.err,
             Catch::Contains("rank_00001.safetensors") && Catch::Contains("fails its checksum"));
}

TEST_CASE("SIGTERM saves a checkpoint and exits 0, the run resumes to the same end",
          "[checkpoint]") {
  Setup ref = setup(kCkpt, "term_ref");
  // A longer run so the signal lands mid-training.
  REQUIRE(run_cli(run_args(ref, 2, {"--set", "run.steps=400", "--set", "checkpoint.every=0"}),
                  opts(180))
              .status == 0);
  Setup s = setup(kCkpt, "term");
  Process p = start_cli(run_args(s, 2, {"--set", "run.steps=400", "--set", "checkpoint.every=0"}),
                        opts(180));
  REQUIRE(wait_for_text(p, "step  50/400", 60));
  ::kill(p.pid, SIGTERM);
  RunResult r = p.wait();
  INFO(describe(r));
  CHECK(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("stopped by a signal"));
  nlohmann::json summary = read_json(s.run_dir / "summary.json");
  CHECK(summary["status"] == "stopped");
  int64_t stopped_at = summary["steps"].get<int64_t>();
  CHECK(stopped_at < 400);
  RunResult resumed = run_cli(run_args(s, 2,
                                       {"--set", "run.steps=400", "--set", "checkpoint.every=0",
                                        "--set", "checkpoint.resume=\"auto\""}),
                              opts(180));
  REQUIRE(resumed.status == 0);
  CHECK(bitwise_equal(final_params(s.run_dir, "term"), final_params(ref.run_dir, "term_ref")));
}

TEST_CASE("elastic: --max-restarts restarts every worker from the latest checkpoint",
          "[checkpoint]") {
  Setup ref = setup(kCkpt, "elastic_ref");
  REQUIRE(run_cli(run_args(ref, 2), opts(120)).status == 0);
  Setup s = setup(kCkpt, "elastic");
  RunResult r =
      run_cli(run_args(s, 2, {"--max-restarts", "2", "--set", "checkpoint.resume=\"auto\""}),
              opts(180, {{"TESSERA_TEST_CRASH", "rank=1,step=25"}}));
  INFO(describe(r));
  REQUIRE(r.status == 0);
  CHECK_THAT(r.err, Catch::Contains(
                        "restarting every worker from the latest checkpoint (restart 1 of 2)"));
  CHECK_THAT(r.out, Catch::Contains("at step 20"));
  CHECK(
      bitwise_equal(final_params(s.run_dir, "elastic"), final_params(ref.run_dir, "elastic_ref")));
}

TEST_CASE("ckpt inspect and export describe and consolidate a checkpoint", "[checkpoint]") {
  Setup s = setup(kCkpt, "tools");
  REQUIRE(run_cli(run_args(s, 2, {"--set", "run.steps=20"}), opts(120)).status == 0);
  RunResult i = run_cli({"ckpt", "inspect", (s.run_dir / "ckpt").string()});
  REQUIRE(i.status == 0);
  CHECK_THAT(i.out, Catch::Contains("step 20") && Catch::Contains("saved by 2 ranks") &&
                        Catch::Contains("0.weight") && Catch::Contains("checksums: all sound"));
  auto p = final_params(s.run_dir, "tools");
  CHECK(p.count("0.weight") == 1);
  CHECK(p.at("0.weight").shape == std::vector<int64_t>{16, 64});
  // Evaluating the export and the checkpoint gives the same numbers.
  RunResult e1 = run_cli({"eval", s.config.string(), "--ckpt", (s.run_dir / "ckpt").string()});
  RunResult e2 =
      run_cli({"eval", s.config.string(), "--ckpt", (scratch() / "tools.safetensors").string()});
  REQUIRE(e1.status == 0);
  REQUIRE(e2.status == 0);
  auto j1 = nlohmann::json::parse(lines(e1.out).back()),
       j2 = nlohmann::json::parse(lines(e2.out).back());
  CHECK(j1["eval_loss"] == j2["eval_loss"]);
}

}  // namespace itest_test_checkpoint
