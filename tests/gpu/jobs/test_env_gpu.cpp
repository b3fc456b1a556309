// `tessera env` where a GPU is visible (the one-GPU runner skips without
// one): CUDA runs are usable, and GPU 0 comes with its name, memory and
// compute capability; the runtime, cuBLASLt and NCCL that a CUDA build
// uses load. tests/integration/test_env.cpp covers the machine without.
#include <catch2/catch.hpp>
#include <regex>

#include "harness.hpp"

namespace gpu_test_env {

using namespace tessera::itest;

namespace {

const nlohmann::json *find_item(const nlohmann::json &items, const std::string &name) {
  for (const auto &i : items)
    if (i.at("name") == name) return &i;
  return nullptr;
}

}  // namespace

TEST_CASE("env on a GPU machine: CUDA usable, GPU 0 described", "[env][gpu]") {
  RunResult r = run_cli({"env", "--json"});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json &items = j.at("items");
  const nlohmann::json *cuda = find_item(items, "CUDA runs");
  REQUIRE(cuda);
  CHECK(cuda->at("ok").get<bool>());
  CHECK(cuda->at("data").at("gpus").get<int>() >= 1);
  const nlohmann::json *gpu = find_item(items, "GPU 0");
  REQUIRE(gpu);
  CHECK(gpu->at("ok").get<bool>());
  CHECK_FALSE(gpu->at("data").at("name").get<std::string>().empty());
  CHECK(gpu->at("data").at("memory_bytes").get<uint64_t>() > (uint64_t{1} << 30));
  CHECK(std::regex_match(gpu->at("data").at("compute_capability").get<std::string>(),
                         std::regex(R"(\d+\.\d+)")));
  for (const char *lib : {"CUDA driver", "CUDA runtime", "cuBLASLt", "NCCL"}) {
    const nlohmann::json *i = find_item(items, lib);
    REQUIRE(i);
    INFO(i->dump());
    CHECK(i->at("ok").get<bool>());
    CHECK(std::regex_search(i->at("data").at("version").get<std::string>(),
                            std::regex(R"(^\d+\.\d+)")));
  }
  RunResult text = run_cli({"env"});
  CHECK(std::regex_search(text.out, std::regex(R"(OK +GPU 0 +.+, compute capability \d+\.\d+)")));
}

}  // namespace gpu_test_env
