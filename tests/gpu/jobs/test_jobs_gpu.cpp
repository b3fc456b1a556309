// Multi-process jobs on two GPUs through the real launcher (`tessera run
// -n 2`, one GPU per rank by LOCAL_RANK, NCCL between them): what the CUDA
// issue must show "on two GPUs".
//
//   equivalence  every ZeRO stage on two GPUs trains the MLP on Fashion-MNIST
//                as one GPU does (loss at every step, final parameters) in
//                bf16, with Adam and with SGD + momentum (which, unlike Adam,
//                would show a wrongly scaled gradient average)
//   restart      a worker killed mid-run and brought back by --max-restarts
//                from the last checkpoint ends bitwise equal to the
//                uninterrupted run (the checkpoint issue, on GPUs)
//   faults       the data-parallel issue's fault tests on GPUs: a SIGKILLed
//                worker, a rank that fails inside the job and a rank that
//                crashes inside a collective all stop the job promptly,
//                naming the rank, with no worker left running
//
// The bf16 tolerances. A bf16 gradient reduction rounds at 2^-9 relative,
// and one GPU's matmuls over 128 rows may accumulate in another order than
// two GPUs' over 64, so the runs part by rounding steps that the optimizer
// carries along. Loss at every step: within 3% (measured on two H200s,
// 2026-11-30: 0.65% with Adam, 0.83% with SGD). Parameters, tensor by
// tensor, |x - ref| / |ref|: within 3% with SGD (measured 1.8%), which would
// show a wrongly scaled average; within 10% with Adam (measured 5.4%, on the
// first layer's bias: Adam turns the rounding noise of gradients near zero
// into whole steps of +-lr, and that bias is all such steps). A lost or stale
// slice, or a skipped update, leaves a tensor tens of percent away.
//
// (On two H200s the four stages showed the same differences, to the digits
// printed: with two ranks every stage sums the same two halves.)
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "equivalence.hpp"
#include "faults.hpp"
#include "harness.hpp"

using namespace tessera::itest;

namespace {

constexpr Tolerance kAdamBf16{3e-2, 0, 0, 1e-1}, kSgdBf16{3e-2, 0, 0, 3e-2};

std::vector<Job> bf16_jobs(bool sgd) {
  std::vector<Job> jobs = every_stage(2, 128, {64});
  for (Job &j : jobs) {
    j.sgd = sgd;
    j.device = "cuda";
    j.precision = "bf16";
  }
  return jobs;
}

// `tessera run -n 2` on the harness's synthetic task, on the GPUs.
std::vector<std::string> gpu_run(const Setup &s, const std::string &precision, int64_t steps) {
  return {"run",   "-n",
          "2",     s.config.string(),
          "--set", "run.steps=" + std::to_string(steps),
          "--set", "run.log_every=10",
          "--set", "run.device=\"cuda\"",
          "--set", "run.precision=\"" + precision + "\""};
}

}  // namespace

TEST_CASE("two GPUs, bf16, Adam: every ZeRO stage matches the one-GPU run",
          "[gpu][jobs][equivalence]") {
  equivalence(128, bf16_jobs(false), kAdamBf16);
}

TEST_CASE("two GPUs, bf16, SGD with momentum: every ZeRO stage matches the one-GPU run",
          "[gpu][jobs][equivalence]") {
  equivalence(128, bf16_jobs(true), kSgdBf16);
}

TEST_CASE("two GPUs: a worker killed with SIGKILL stops the job within 10 s, naming its rank",
          "[gpu][jobs][faults]") {
  Setup s = setup();
  const double took = check_killed_worker(gpu_run(s, "bf16", 1000000), 2);
  std::printf("  SIGKILL to rank 1: the job ended %.2f s later\n", took);
}

TEST_CASE("two GPUs: a rank that fails inside the job stops the other with its reason",
          "[gpu][jobs][faults]") {
  // faulty-sgd (updating through the host's ops on the GPU) fails on rank 1
  // at step 5; rank 0 is then on its way into step 6's NCCL collectives,
  // which rank 1 never joins. The abort key and ncclCommAbort, not the
  // 60 s timeout, must end it. The limit allows for CUDA and NCCL start-up.
  Setup s = setup();
  for (int stage : {0, 2}) {
    INFO("zero stage " << stage);
    std::vector<std::string> args = gpu_run(s, "fp32", 1000);
    for (const auto &a : faulty_sgd_args("error")) args.push_back(a);
    args.insert(args.end(),
                {"--set", "zero.plugin=\"stage" + std::to_string(stage) + "\"", "--set",
                 "run.dir=\"" + (scratch() / ("fail" + std::to_string(stage))).string() + "\""});
    const double took = check_failing_rank(args, 2, 30.0);
    std::printf("  stage %d, rank 1 fails at step 5: the job ended after %.2f s\n", stage, took);
  }
}

TEST_CASE("two GPUs: a rank that crashes inside a collective stops the job, naming it",
          "[gpu][jobs][faults]") {
  // faulty-sgd with mode "exit": rank 1 _exit(3)s at step 5 without a word
  // to the others; rank 0 loses its peer inside an NCCL collective.
  Setup s = setup();
  std::vector<std::string> args = gpu_run(s, "fp32", 1000);
  for (const auto &a : faulty_sgd_args("exit")) args.push_back(a);
  const double took = check_crashing_rank(args, 2, 30.0);
  std::printf("  rank 1 exits at step 5: the job ended after %.2f s\n", took);
}

TEST_CASE(
    "two GPUs, bf16: a worker killed at step 25 and restarted from the checkpoint ends "
    "bitwise equal to the uninterrupted run",
    "[gpu][jobs][checkpoint]") {
  // Checkpoints every 10 steps from GPU memory through pinned buffers;
  // --max-restarts brings both workers back from step 20, which must
  // restore the fp32 master, Adam's state, the bf16 compute copy, the
  // sampler's position and the RNGs exactly.
  const std::string ckpt = "\n[checkpoint]\nevery = 10\nkeep = 3\n";
  Setup ref = setup(ckpt, "elastic_ref");
  RunOptions o;
  o.timeout_s = 180;
  // Bitwise across processes needs the same matmul algorithms in both: the
  // heuristic's pick, not the timed one (engine/backend/cuda/gemm_tune.hpp).
  o.env = {{"TESSERA_GEMM_TUNING", "heuristic"}};
  RunResult r0 = run_cli(gpu_run(ref, "bf16", 60), o);
  INFO(describe(r0));
  REQUIRE(r0.status == 0);

  Setup s = setup(ckpt, "elastic");
  std::vector<std::string> args = gpu_run(s, "bf16", 60);
  args.insert(args.end(), {"--max-restarts", "2", "--set", "checkpoint.resume=\"auto\""});
  o.env = {{"TESSERA_GEMM_TUNING", "heuristic"}, {"TESSERA_TEST_CRASH", "rank=1,step=25"}};
  RunResult r = run_cli(args, o);
  INFO(describe(r));
  REQUIRE(r.status == 0);
  CHECK(contains(r.err, "restarting every worker from the latest checkpoint (restart 1 of 2)"));

  const auto a = final_params(ref.run_dir, 60), b = final_params(s.run_dir, 60);
  REQUIRE(!a.empty());
  REQUIRE(a.size() == b.size());
  size_t differing = 0, total = 0;
  for (const auto &[name, t] : a) {
    auto it = b.find(name);
    REQUIRE(it != b.end());
    REQUIRE(it->second.data.size() == t.data.size());
    for (size_t i = 0; i < t.data.size(); ++i, ++total)
      differing += std::memcmp(&t.data[i], &it->second.data[i], sizeof(float)) != 0;
  }
  std::printf("  restarted at step 20: %zu of %zu parameters differ from the uninterrupted run\n",
              differing, total);
  CHECK(differing == 0);
}
