// Host memory checks before parameter offload allocates (issue 21, Deliver
// item 3), end to end: a stage 3 job with offload.params = "cpu" on two
// ranks, its host memory figure set by TESSERA_HOST_MEMORY_AVAILABLE.
// Below what the backend needs it is refused at start-up, naming the bytes
// needed and available and where the figure came from, before anything is
// allocated (no start-up line of the backend, no step); below the fp32
// parameters themselves the engine refuses first; an ample figure trains;
// a malformed value is an error naming the variable.
//
// The model is the harness's MLP widened to 2048 hidden units (141K
// parameters): 0.54 MiB as fp32, while each rank's offloaded share (fp32
// master, Adam's two moments and the compute parameters: 20 bytes for each
// of its ~70.7K owned elements) is 1.35 MiB, against the half of 1 MiB
// each of the two ranks on this machine is given.
#include <catch2/catch.hpp>
#include <regex>

#include "harness.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace itest_test_offload_memory {

using namespace tessera::itest;

namespace {

// Two ranks, stage 3, the parameters and optimizer with offload cpu.
RunResult run_with(const std::string &name, const std::string &available) {
  Setup s = setup(
      "\n[zero]\nplugin = \"stage3\"\n\n[offload]\nplugin = \"cpu\"\nthreads = 1\nparams = "
      "\"cpu\"\n",
      name);
  RunOptions o;
  o.timeout_s = 100;
  o.env["TESSERA_HOST_MEMORY_AVAILABLE"] = available;
  return run_cli({"run", "-n", "2", s.config.string(), "--set", "run.steps=4", "--set",
                  "run.log_every=1", "--set", "model.hidden=[2048]"},
                 o);
}

// Nothing was allocated for training: the backend's start-up lines (logged
// once its state is made) and any step are absent.
void nothing_started(const RunResult &r) {
  CHECK_THAT(r.all(), !Catch::Contains("fp32 master weights") &&
                          !Catch::Contains("compute parameters of the") &&
                          !Catch::Contains("parameters of rank 0 live in"));
  CHECK_FALSE(std::regex_search(r.all(), std::regex("step +[0-9]+/")));
}

}  // namespace

TEST_CASE("offload params: too little host memory is refused before allocating, naming the bytes",
          "[offload]") {
  // 2 MiB between 2 ranks: each rank's 1 MiB holds the engine's fp32 copy
  // (552 KiB) but not the backend's 1.35 MiB.
  RunResult r = run_with("small", "2MiB");
  INFO(describe(r));
  CHECK(r.status != 0);
  // The backend's check: what it needs, what each rank has, and whence.
  CHECK_THAT(r.all(), Catch::Contains("offload cpu (rank ") &&
                          Catch::Contains("the master weights and optimizer state, the offloaded "
                                          "parameters of ") &&
                          Catch::Contains(" bytes) of host memory, but 1.00 MiB (1048576 bytes) "
                                          "is available to this rank") &&
                          Catch::Contains("(TESSERA_HOST_MEMORY_AVAILABLE=2MiB, shared by the 2 "
                                          "ranks on this machine)") &&
                          Catch::Contains("offload to NVMe"));
  // The bytes needed, within a rank's share of 141,380 elements (padding
  // included) at 20 bytes each.
  std::smatch m;
  const std::string all = r.all();
  REQUIRE(std::regex_search(all, m, std::regex("need [0-9.]+ MiB \\(([0-9]+) bytes\\) of host")));
  const double needed = std::stod(m[1].str());
  CHECK(needed >= 20.0 * 141316 / 2);
  CHECK(needed <= 20.0 * (141316 + 64) / 2);
  nothing_started(r);
}

TEST_CASE("offload params: less host memory than the fp32 parameters is refused by the engine",
          "[offload]") {
  RunResult r = run_with("tiny", "64KiB");
  INFO(describe(r));
  CHECK(r.status != 0);
  CHECK_THAT(r.all(), Catch::Contains("model 'mlp': its 141316 parameters need ") &&
                          Catch::Contains("as fp32 at the least, more than the 32.00 KiB (32768 "
                                          "bytes) of memory this host has available "
                                          "(TESSERA_HOST_MEMORY_AVAILABLE=64KiB, shared by the 2 "
                                          "ranks on this host)"));
  nothing_started(r);
}

TEST_CASE("offload params: ample host memory trains", "[offload]") {
  RunResult r = run_with("ample", "64GiB");
  INFO(describe(r));
  REQUIRE(r.status == 0);
  CHECK_THAT(r.all(), Catch::Contains("offload cpu (rank 0): fp32 master weights") &&
                          Catch::Contains("parameters of rank 0 live in host memory"));
  CHECK(std::regex_search(r.all(), std::regex("step +4/4")));
}

TEST_CASE("offload params: a malformed TESSERA_HOST_MEMORY_AVAILABLE is an error naming it",
          "[offload]") {
  for (const std::string bad : {"lots", "12 potatoes", "0", "-5GiB"}) {
    RunResult r = run_with("malformed", bad);
    INFO(bad << ": " << describe(r));
    CHECK(r.status != 0);
    CHECK_THAT(r.all(), Catch::Contains("TESSERA_HOST_MEMORY_AVAILABLE=\"" + bad + "\"") &&
                            Catch::Contains("positive size such as \"64GiB\""));
    nothing_started(r);
  }
}

}  // namespace itest_test_offload_memory
