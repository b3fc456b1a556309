// The data-parallel fault tests, shared by the CPU jobs (test_distributed.cpp)
// and the GPU jobs (tests/gpu/jobs): each starts `tessera run -n N` with the
// given arguments, makes rank 1 fail one way or another, and checks that the
// job ends promptly, that the launcher's verdict names rank 1 and why, and
// that no worker is left running. Each returns the seconds it measured.
#pragma once

#include <string>
#include <vector>

#include "harness.hpp"

namespace tessera::itest {

// SIGKILL to rank 1 once rank 0 has logged a step: the launcher exits
// non-zero within 10 s of the kill, naming rank 1 and SIGKILL. Returns the
// seconds from the kill to the launcher's exit.
double check_killed_worker(const std::vector<std::string> &run_args, int ranks);

// `--plugin-path` and `--set`s that make the optimizer faulty-sgd
// (tests/plugins/faulty_optimizer.c), failing on rank 1 at step 5 in `mode`
// ("error", "exit", "abort"), with comm.timeout_s at 60 so that only the
// abort path, not a collective's timeout, can end the others in time.
std::vector<std::string> faulty_sgd_args(const std::string &mode);

// faulty-sgd in mode "error" on rank 1 at step 5 (run_args should include
// faulty_sgd_args("error")): every other rank stops with "rank 1 failed" and
// the reason, rank 1 reports it, the verdict names rank 1 and the reason,
// all within `limit_s` of the start. Returns the job's seconds.
double check_failing_rank(const std::vector<std::string> &run_args, int ranks, double limit_s);

// faulty-sgd in mode "exit": rank 1 _exit(3)s at step 5 without a word, the
// others lose their peer inside a collective; the verdict says rank 1
// exited with status 3, within `limit_s` of the start. Returns the job's
// seconds.
double check_crashing_rank(const std::vector<std::string> &run_args, int ranks, double limit_s);

}  // namespace tessera::itest
