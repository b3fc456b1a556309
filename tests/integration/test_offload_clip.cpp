// Exact gradient clipping with the speculative offload update (issue 52):
// offload cpu steps each range before the global norm is known and redoes
// the ranges already stepped when clipping changes the update. After 30
// steps its parameters equal offload none's with the same clipping bit for
// bit, at stage 0 on one rank (the update starts during backward) and at
// stages 1-3 on two ranks through the launcher (as each bucket's
// reduction is final, during backward), with and without a GPU share
// (ratio 0.5, which on the CPU is stepped on the compute thread), in three
// regimes: a max norm so low that every step clips, so high that none does,
// and one from the observed norms where steps go both ways.
//
// That the speculative path ran, and redid exactly the clipped steps, is
// read from the breakdown (log.breakdown): every step is "speculated", and
// a step is "redone" where a range had been stepped ahead of a norm that
// clipped. How far the CPU gets before the norm is a race, so the runs
// that count redone steps exactly set speculation_worst_case (the verdict
// waits until every range has been stepped ahead): there the redone steps
// are those whose logged grad_norm exceeds the max norm (speculation =
// "always"), or those of them that follow a step that did not clip
// ("adaptive", the default: after a clipped step the next waits for its
// norm rather than stepping ahead what would likely be redone). A plain run is
// held to the same bits and to redoing no more than the clipped steps.
// fp16 (whose overflow would undo a speculative step) does not run on the
// CPU; the GPU tests cover the bf16 path.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <string>

#include "harness.hpp"
#include "offload_support.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace itest_test_offload_clip {

using namespace tessera::itest;
using namespace tessera::itest::offload_support;

namespace {

constexpr int kSteps = 30;

struct Trained {
  std::map<std::string, F32Tensor> params;
  std::vector<double> norms;  // grad_norm of each step
  int64_t speculated = 0, redone = 0;
  int64_t in_backward = 0;  // ranges handed over before backward ended
  double redo_s = -1, held_s = -1;
  std::string log;  // the run's output
};

// One run of `stage` on `world` ranks with max norm `clip`, offload
// `variant` ("none", "cpu", "cpu-ratio"; `more` appended to its section).
Trained train(int world, const std::string &stage, const std::string &variant, double clip,
              const std::string &name, const std::string &more = "",
              const std::vector<std::string> &extra = {},
              const std::map<std::string, std::string> &env = {}) {
  const std::string zero = "\n[zero]\nplugin = \"" + stage + "\"\n[log]\nbreakdown = true\n";
  const bool none = variant == "none";
  Setup s = setup(
      zero + (none ? "" : offload_section("cpu", {}, variant == "cpu-ratio" ? "0.5" : "") + more),
      name);
  std::vector<std::string> a = {"run"};
  if (world > 1) a.insert(a.end(), {"-n", std::to_string(world)});
  char max_norm[64];
  std::snprintf(max_norm, sizeof max_norm, "run.gradient_clipping=%.17g", clip);
  a.insert(a.end(), {s.config.string(), "--set", "run.steps=" + std::to_string(kSteps), "--set",
                     "run.log_every=1", "--set", "model.hidden=[512]", "--set", max_norm});
  a.insert(a.end(), extra.begin(), extra.end());
  RunOptions o;
  o.timeout_s = 100;
  for (const auto &[k, v] : env) o.env[k] = v;
  RunResult r = run_cli(a, o);
  INFO(name << ": " << describe(r));
  REQUIRE(r.status == 0);
  Trained t;
  t.log = r.all();
  if (!none && clip > 0)
    CHECK_THAT(r.all(), Catch::Contains("speculation (clipping, fp16): an undo space of"));
  // The start-up report places every byte rank 0 allocated.
  CHECK_THAT(r.all(), Catch::Contains("where rank 0's bytes live: pageable host memory"));
  for (const auto &m : read_jsonl(s.run_dir / "metrics.jsonl")) {
    if (m.value("type", "") != "train") continue;
    if (clip > 0) {  // without clipping no norm is taken
      REQUIRE(m.contains("grad_norm"));
      t.norms.push_back(m["grad_norm"].get<double>());
    }
    if (none) continue;
    const auto &o = m.at("breakdown").at("offload");
    t.speculated += o.at("speculated_steps").get<int64_t>();
    t.redone += o.at("redone_steps").get<int64_t>();
    t.in_backward += o.at("ranges_in_backward").get<int64_t>();
  }
  REQUIRE(t.norms.size() == static_cast<size_t>(clip > 0 ? kSteps : 0));
  if (!none) {
    const auto summary = read_json(s.run_dir / "summary.json");
    REQUIRE(summary.contains("offload_speculation"));
    CHECK(summary["offload_speculation"]["redone_steps"].get<int64_t>() == t.redone);
    t.redo_s = summary["offload_speculation"]["redo_s"].get<double>();
    t.held_s = summary["offload_speculation"]["held_for_norm_s"].get<double>();
  }
  t.params = exported(s.run_dir, name);
  return t;
}

int64_t clipped_steps(const Trained &t, double clip) {
  return std::count_if(t.norms.begin(), t.norms.end(), [&](double n) { return n > clip; });
}

// speculation = "adaptive" (the default) in the worst case: a clipped step
// is redone only where the step before it did not clip (the first one
// included); after a clipped step the next waits for its norm.
int64_t adaptive_redone(const Trained &t, double clip) {
  int64_t n = 0;
  for (size_t i = 0; i < t.norms.size(); ++i)
    n += t.norms[i] > clip && (i == 0 || t.norms[i - 1] <= clip);
  return n;
}

// Every regime at one stage: offload none is the reference, offload cpu
// (and with ratio 0.5) must match it bit for bit and redo the clipped steps.
void clip_exact(int world, const std::string &stage) {
  const std::string tag = stage + "x" + std::to_string(world);
  // So high that no step clips: also shows the norms the runs see.
  const double high = 1e6;
  const Trained free_run = train(world, stage, "none", high, tag + "-none-high");
  std::vector<double> sorted = free_run.norms;
  std::sort(sorted.begin(), sorted.end());
  REQUIRE(sorted.back() < high);
  // So low that every step clips (below the smallest norm any run sees),
  // and the median, where some steps clip and some do not.
  const double low = sorted.front() * 1e-3, mixed = sorted[sorted.size() / 2];
  struct Regime {
    std::string name;
    double clip;
  };
  for (const Regime &g : {Regime{"high", high}, Regime{"low", low}, Regime{"mixed", mixed}}) {
    const Trained ref =
        g.name == "high" ? free_run : train(world, stage, "none", g.clip, tag + "-none-" + g.name);
    const int64_t clipped = clipped_steps(ref, g.clip);
    INFO(tag << ", regime " << g.name << " (max norm " << g.clip << "): " << clipped << " of "
             << kSteps << " steps clip");
    if (g.name == "high") CHECK(clipped == 0);
    if (g.name == "low") CHECK(clipped == kSteps);
    if (g.name == "mixed") CHECK((clipped > 0 && clipped < kSteps));
    // cpu-worst speculates every step ("always"); cpu-ratio-worst is
    // adaptive, as plain cpu is.
    const std::string worst = "speculation_worst_case = true\n";
    for (const std::string variant : {"cpu", "cpu-worst", "cpu-ratio-worst"}) {
      const bool exact = variant != "cpu", always = variant == "cpu-worst";
      const Trained t =
          train(world, stage, variant == "cpu" ? "cpu" : variant.substr(0, variant.size() - 6),
                g.clip, tag + "-" + variant + "-" + g.name,
                exact ? worst + (always ? "speculation = \"always\"\n" : "") : "");
      INFO(variant);
      const Diff d = compare(t.params, ref.params);
      INFO("max rel diff against offload none " << d.rel);
      CHECK(d.bitwise);
      CHECK(t.norms == ref.norms);  // the same trajectory, step by step
      // The speculative path ran every step and redid the clipped ones.
      CHECK(t.speculated == kSteps);
      // One rank: every group's update starts as backward declares it.
      if (world == 1) CHECK(t.in_backward > 0);
      if (exact) {
        CHECK(t.redone == (always ? clipped : adaptive_redone(ref, g.clip)));
        if (clipped > 0) CHECK(t.redo_s > 0);
        // Every step clips: adaptive redoes the first and holds the rest.
        if (g.name == "low" && !always) CHECK(t.redone == 1);
      } else {
        CHECK(t.redone <= clipped);
      }
    }
  }
}

}  // namespace

TEST_CASE("offload cpu with clipping equals offload none bit for bit at stage 0 on one rank",
          "[offload][clip]") {
  clip_exact(1, "stage0");
}

TEST_CASE("offload cpu with clipping equals offload none bit for bit at stage 1 on two ranks",
          "[offload][clip]") {
  clip_exact(2, "stage1");
}

// Buckets of one group each (and four layers), so reductions complete
// while backward runs: the zero plugin reports those groups final
// (final-groups, ABI 1.10) and their updates start before backward ends.
// No clipping (no speculation: the update itself starts early), and
// clipping that never and always changes the update.
static const std::vector<std::string> kOneGroupBuckets = {"--set", "zero.bucket_mb=0.001", "--set",
                                                          "model.hidden=[256, 256, 256]"};

static void early_start_exact(int world, const std::string &stage,
                              const std::vector<std::string> &more = {}) {
  std::vector<std::string> small = kOneGroupBuckets;
  small.insert(small.end(), more.begin(), more.end());
  for (const double clip : {0.0, 1e6, 1e-6}) {
    INFO(stage << " at " << world << " rank(s), max norm " << clip);
    const std::string tag = stage + "x" + std::to_string(world) + (more.empty() ? "" : "-acc") +
                            "-" +
                            (clip == 0  ? "off"
                             : clip > 1 ? "high"
                                        : "low");
    const Trained ref = train(world, stage, "none", clip, "early-none-" + tag, "", small);
    const Trained t = train(world, stage, "cpu", clip, "early-cpu-" + tag, "", small);
    CHECK(compare(t.params, ref.params).bitwise);
    CHECK(t.norms == ref.norms);
    CHECK(t.speculated == (clip == 0 ? 0 : kSteps));
    CHECK(t.in_backward > 0);
  }
}

// The same with half of the state updated on the device (ratio 0.5): the
// ranges started early are the CPU's share; every step clips.
static void early_start_ratio_exact(int world, const std::string &stage) {
  const std::string tag = stage + "x" + std::to_string(world);
  const Trained ref =
      train(world, stage, "none", 1e-6, "early-ratio-none-" + tag, "", kOneGroupBuckets);
  const Trained t =
      train(world, stage, "cpu-ratio", 1e-6, "early-ratio-" + tag, "", kOneGroupBuckets);
  CHECK(compare(t.params, ref.params).bitwise);
  CHECK(t.norms == ref.norms);
  CHECK(t.in_backward > 0);
}

TEST_CASE("at two ranks, stage 1 starts a group's update as its reduction is final, same bits",
          "[offload][clip]") {
  early_start_exact(2, "stage1");
}

// Stages 2-3: a group's owned slices are final once the last micro-batch's
// reduce-scatter of its bucket completes, at any number of ranks.
TEST_CASE("stages 2-3 start a group's update as its reduce-scatter is final, same bits",
          "[offload][clip]") {
  early_start_exact(2, "stage2");
  early_start_exact(2, "stage3");
  early_start_exact(1, "stage2");
  early_start_ratio_exact(2, "stage3");
  // Two micro-batches a step, and buckets of ~0.1 MB over layers of 4.6 KB
  // (784 -> 8 -> 128) then 66 KB (128 -> 128): the first micro-batch's two
  // small layers wait in a bucket that the second's first layers fill, and
  // that bucket completes while backward still runs. Only the second's
  // entries are final: the first's must wait for their second reduction.
  early_start_exact(2, "stage2",
                    {"--set", "batch.global=128", "--set", "zero.bucket_mb=0.1", "--set",
                     "model.hidden=[8, 128, 128, 128, 128, 128, 128, 128]"});
}

TEST_CASE("offload cpu with clipping equals offload none bit for bit at stage 2 on two ranks",
          "[offload][clip]") {
  clip_exact(2, "stage2");
}

TEST_CASE("offload cpu with clipping equals offload none bit for bit at stage 3 on two ranks",
          "[offload][clip]") {
  clip_exact(2, "stage3");
}

TEST_CASE("offload cpu speculation: a small undo space holds ranges for the norm, same bits",
          "[offload][clip]") {
  // 64 KiB keeps the last layer's pre-step values but not the first's: the
  // dispatcher steps what fits ahead and holds the rest until the verdict.
  // Two micro-batches a step: the update starts during the last backward.
  const double clip = 1e-6;  // clips until the norm falls below it
  const std::vector<std::string> accum = {"--set", "batch.global=128"};
  const Trained ref = train(1, "stage0", "none", clip, "undo-ref", "", accum);
  const Trained t = train(1, "stage0", "cpu", clip, "undo-small",
                          "speculation_memory = \"64KiB\"\nspeculation_worst_case = true\n"
                          "speculation = \"always\"\n",
                          accum);
  CHECK(compare(t.params, ref.params).bitwise);
  CHECK(t.speculated == kSteps);
  // The last layer's range was stepped ahead every step: each clipped step
  // is redone; the first layer's waited for the norm.
  const int64_t clipped = clipped_steps(ref, clip);
  CHECK(clipped > 0);
  CHECK(t.redone == clipped);
  CHECK(t.held_s > 0);
}

// speculation_memory = "auto" on a host whose half left cannot hold every
// element's undo at start-up waits for the first speculative step to size
// it (the engine's initial values are gone by then). The host's figure is
// the environment's: 20 bytes an element of the model's (as the reference
// run reports them), room for the state (12) but not for the whole undo
// (16) in half of it.
TEST_CASE("offload cpu speculation: the auto undo space sized at the first speculative step",
          "[offload][clip]") {
  const double clip = 1e-6;
  const Trained ref = train(1, "stage0", "none", clip, "undo-late-ref");
  const size_t at = ref.log.find(" parameters, ");
  REQUIRE(at != std::string::npos);
  const size_t from = ref.log.rfind('(', at);
  const size_t n = std::stoull(ref.log.substr(from + 1, at - from - 1));
  const Trained t = train(1, "stage0", "cpu", clip, "undo-late", "", {},
                          {{"TESSERA_HOST_MEMORY_AVAILABLE", std::to_string(20 * n)}});
  INFO(t.log);
  CHECK(compare(t.params, ref.params).bitwise);
  CHECK(t.speculated == kSteps);
  CHECK(t.log.find("is sized at the first speculative step") != std::string::npos);
  CHECK(t.log.find("ranges stepped before the gradient norm is known") != std::string::npos);
}

}  // namespace itest_test_offload_clip
