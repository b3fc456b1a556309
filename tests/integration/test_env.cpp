// `tessera env`: the environment report, as a user without a GPU meets it.
// With CUDA_VISIBLE_DEVICES empty no GPU is visible on any machine, so the
// report must say CUDA is absent, with what to install, and still exit 0;
// --json must parse and carry every section; plugins come with their ABI.
#include <catch2/catch.hpp>
#include <regex>
#include <string>

#include "harness.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace itest_test_env {

using namespace tessera::itest;

namespace {

RunOptions no_gpu() {
  RunOptions o;
  o.env["CUDA_VISIBLE_DEVICES"] = "";
  return o;
}

const nlohmann::json *find_item(const nlohmann::json &items, const std::string &name) {
  for (const auto &i : items)
    if (i.at("name") == name) return &i;
  return nullptr;
}

}  // namespace

TEST_CASE("env reports a machine without a usable GPU, with what to install", "[env][cli]") {
  RunResult r = run_cli({"env"}, no_gpu());
  INFO(describe(r));
  REQUIRE(r.status == 0);
  for (const char *section : {"build:", "cuda:", "cpu:", "host:", "plugins:"})
    CHECK((contains(r.out, std::string("\n") + section + "\n") || starts_with(r.out, section)));
  const std::vector<std::string> ls = lines(r.out);
  // The verdict on CUDA: missing, absent, and runs use the CPU.
  CHECK(any_line_has(ls, {"missing", "CUDA runs", "absent", "runs use the CPU"}));
  // Every missing line is followed by what to install.
  for (size_t i = 0; i + 1 < ls.size(); ++i)
    if (starts_with(ls[i], "  missing")) {
      INFO(ls[i]);
      CHECK(contains(ls[i + 1], "install: "));
    }
  for (const char *thing : {"CUDA driver", "CUDA runtime", "cuBLASLt", "NCCL", "cuDNN", "io_uring",
                            "AVX2 + FMA", "AVX-512", "OpenBLAS", "host memory", "plugin path"})
    CHECK(contains(r.out, thing));
  CHECK(std::regex_search(r.out, std::regex(R"(OK +OpenBLAS +core \w+)")));
  CHECK(std::regex_search(r.out, std::regex(R"(OK +model mlp +[0-9.]+, ABI 1\.\d+, /)")));
  CHECK(r.err.empty());
}

TEST_CASE("env --json is one parsable object for bug reports", "[env][cli]") {
  RunResult r = run_cli({"env", "--json"}, no_gpu());
  INFO(describe(r));
  REQUIRE(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j.at("tessera").is_string());
  CHECK(std::regex_match(j.at("abi").get<std::string>(), std::regex(R"(1\.\d+)")));
  const nlohmann::json &items = j.at("items");
  REQUIRE(items.is_array());
  for (const auto &i : items) {
    INFO(i.dump());
    CHECK(i.at("section").is_string());
    CHECK(i.at("ok").is_boolean());
    CHECK(i.at("value").is_string());
    if (!i.at("ok").get<bool>()) CHECK_FALSE(i.at("fix").get<std::string>().empty());
  }
  const nlohmann::json *cuda = find_item(items, "CUDA runs");
  REQUIRE(cuda);
  CHECK_FALSE(cuda->at("ok").get<bool>());
  CHECK(cuda->at("data").at("gpus") == 0);
  const nlohmann::json *mem = find_item(items, "host memory");
  REQUIRE(mem);
  CHECK(mem->at("data").at("total_bytes").get<uint64_t>() > 0);
  const nlohmann::json *blas = find_item(items, "OpenBLAS");
  REQUIRE(blas);
  CHECK_FALSE(blas->at("data").at("core").get<std::string>().empty());
  const nlohmann::json *mlp = find_item(items, "model mlp");
  REQUIRE(mlp);
  CHECK(mlp->at("data").at("abi").get<std::string>().rfind("1.", 0) == 0);
  for (const char *name : {"CUDA driver", "NCCL", "cuDNN", "cuBLASLt", "io_uring", "AVX2 + FMA"})
    CHECK(find_item(items, name));
}

TEST_CASE("env has help, refuses arguments, and version points to it", "[env][cli]") {
  RunResult h = run_cli({"env", "--help"});
  CHECK(h.status == 0);
  CHECK(contains(h.out, "usage: tessera env"));
  CHECK(contains(h.out, "--json"));
  RunResult bad = run_cli({"env", "gpu"});
  CHECK(bad.status == 2);
  CHECK(contains(bad.err, "usage: tessera env"));
  RunResult v = run_cli({"version"});
  CHECK(v.status == 0);
  CHECK(contains(v.out, "tessera env"));
  CHECK(contains(run_cli({"--help"}).out, "  env "));
}

}  // namespace itest_test_env
