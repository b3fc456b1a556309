// A checkpoint binds every tensor's bytes to its name (issue 53, item 1):
// the manifest's start, slot and offset of each tensor are checked against
// the shard's own safetensors header, so a manifest edited to move weights
// is refused even with every checksum recomputed; a manifest of another
// version is refused (no skipping the checksum by calling it version 2);
// NaN or infinity in the weights or the optimizer state is refused by
// verify and on load naming the slot and the parameter, unless allowed;
// and no refusal prints the checksum that would make an edit pass.
#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/checkpoint.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/shard_reader.hpp"
#include "support/hand_checkpoint.hpp"
#include "support/temp_dir.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers stay out of the other files' way.
namespace unit_test_ckpt_binding {

namespace {

namespace fs = std::filesystem;
using tessera::test::HandTensor;
using tessera::test::TempDir;
using tessera::test::write_hand_manifest;

std::vector<float> filled(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i) * 0.5f;
  return v;
}

std::string error_of(const std::function<void()> &fn) {
  try {
    fn();
  } catch (const std::exception &e) {
    return e.what();
  }
  return "(no error)";
}

// Two ranks, each half of 'w' (64 elements) in slots master and exp_avg,
// every value distinct: a tensor loaded in another's place shows.
nlohmann::json two_ranks(const fs::path &step) {
  return tessera::test::write_hand_shards(
      step, 64, {"master", "exp_avg"},
      {{HandTensor{"master", 0, filled(32, 1)}, HandTensor{"exp_avg", 0, filled(32, 100)}},
       {HandTensor{"master", 32, filled(32, 17)}, HandTensor{"exp_avg", 32, filled(32, 116)}}});
}

// Every slot's values, read as resume reads them.
std::string load_error(const fs::path &step) {
  return error_of([&] {
    const nlohmann::json m = tessera::read_manifest(step.string());
    tessera::ShardReader r(step.string(), m);
    std::vector<float> out(64);
    for (const char *slot : {"master", "exp_avg"}) r.read(slot, 0, out.size(), out.data());
  });
}

std::string all(const std::vector<std::string> &problems) {
  std::string out;
  for (const auto &p : problems) out += p + "\n";
  return out;
}

nlohmann::json &tensor(nlohmann::json &m, size_t file, size_t k) {
  return m["files"][file]["tensors"][k];
}

}  // namespace

TEST_CASE("a manifest edited to move tensors is refused with its checksum recomputed",
          "[checkpoint][security]") {
  TempDir dir("tessera_bind");
  const fs::path step = dir.path() / "step_00000001";
  const nlohmann::json m = two_ranks(step);
  REQUIRE(tessera::verify_checkpoint(step.string()).empty());
  REQUIRE(load_error(step) == "(no error)");
  struct Edit {
    const char *what;
    std::function<void(nlohmann::json &)> apply;
    const char *says;
  };
  const std::vector<Edit> edits = {
      // The issue's first reproduction: files[0] and files[1] swap where
      // their first tensors start (eval 0.45 -> 0.10, verify said fine).
      {"start swapped between files",
       [](nlohmann::json &e) { std::swap(tensor(e, 0, 0)["start"], tensor(e, 1, 0)["start"]); },
       "which would be named 'master@"},
      // The same with the names swapped too: the header holds master@0 in
      // rank 0's file, not master@32.
      {"start and name swapped between files",
       [](nlohmann::json &e) {
         std::swap(tensor(e, 0, 0)["start"], tensor(e, 1, 0)["start"]);
         std::swap(tensor(e, 0, 0)["name"], tensor(e, 1, 0)["name"]);
       },
       "its header has no tensor 'master@"},
      {"slot swapped master <-> exp_avg",
       [](nlohmann::json &e) {
         std::swap(tensor(e, 0, 0)["slot"], tensor(e, 0, 1)["slot"]);
         std::swap(tensor(e, 0, 0)["name"], tensor(e, 0, 1)["name"]);
       },
       "tensor 'exp_avg@0' lies at data bytes [128,256] there, the manifest says [0,128]"},
      {"offset and block_crc32 swapped",
       [](nlohmann::json &e) {
         std::swap(tensor(e, 0, 0)["offset"], tensor(e, 0, 1)["offset"]);
         std::swap(tensor(e, 0, 0)["block_crc32"], tensor(e, 0, 1)["block_crc32"]);
       },
       "' lies at data bytes ["},
  };
  for (const Edit &e : edits) {
    INFO(e.what);
    nlohmann::json edited = m;
    e.apply(edited);
    write_hand_manifest(step, edited);  // checksum recomputed, as an editor would
    CHECK_THAT(
        all(tessera::verify_checkpoint(step.string())),
        Catch::Contains("the manifest does not describe this shard") && Catch::Contains(e.says));
    const std::string err = load_error(step);
    CHECK_THAT(err, Catch::Contains("the manifest does not describe this shard") &&
                        Catch::Contains(e.says));
    std::vector<float> canonical;
    CHECK_THAT(error_of([&] {
                 tessera::read_canonical_params(step.string(), &canonical, nullptr);
               }),  // eval and export read with this
               Catch::Contains("the manifest does not describe this shard"));
  }
}

TEST_CASE("a manifest of another version is refused, no refusal prints the checksum",
          "[checkpoint][security]") {
  TempDir dir("tessera_bind");
  const fs::path step = dir.path() / "step_00000001";
  const nlohmann::json written = two_ranks(step);
  nlohmann::json m = written;
  m["epoch"] = 1;  // an edit in range
  // Version 2 with the checksum dropped: no longer a way round it.
  nlohmann::json v2 = m;
  v2["version"] = 2;
  write_hand_manifest(step, v2, false);
  CHECK_THAT(all(tessera::verify_checkpoint(step.string())),
             Catch::Contains("manifest format version 2 is not one this tessera reads"));
  for (const nlohmann::json &v : {nlohmann::json(4), nlohmann::json("3")}) {
    nlohmann::json e = m;
    e["version"] = v;
    write_hand_manifest(step, e);
    CHECK_THAT(load_error(step), Catch::Contains("is not one this tessera reads"));
  }
  // The edit left with the old checksum: refused, and the message gives
  // neither the content's checksum nor any other.
  m["checksum"] = tessera::manifest_checksum(written);
  write_hand_manifest(step, m, false);
  const std::string want = tessera::manifest_checksum(m);
  for (const std::string &msg :
       {load_error(step), all(tessera::verify_checkpoint(step.string()))}) {
    CHECK_THAT(msg, Catch::Contains("fails its checksum"));
    CHECK_THAT(msg, !Catch::Contains(want.substr(7)) && !Catch::Contains("sha256:"));
  }
}

TEST_CASE("NaN or infinity in the weights or the optimizer state is refused unless allowed",
          "[checkpoint][security]") {
  TempDir dir("tessera_bind");
  for (const char *slot : {"master", "exp_avg"}) {
    INFO(slot);
    const fs::path step = dir.path() / slot;
    auto master = filled(32, 1), avg = filled(32, 100);
    (std::string(slot) == "master" ? master : avg)[5] = std::numeric_limits<float>::infinity();
    tessera::test::write_hand_shards(
        step, 64, {"master", "exp_avg"},
        {{HandTensor{"master", 0, filled(32, 1)}, HandTensor{"exp_avg", 0, filled(32, 100)}},
         {HandTensor{"master", 32, master}, HandTensor{"exp_avg", 32, avg}}});
    const std::string problems = all(tessera::verify_checkpoint(step.string()));
    CHECK_THAT(problems,
               Catch::Contains("rank_00001.safetensors: tensor '" + std::string(slot) +
                               "@32' (slot '" + slot + "', parameter 'w' element 37) is infinite"));
    CHECK(tessera::verify_checkpoint(step.string(), true).empty());
    // What resume checks each slot's values with, after reading them.
    const nlohmann::json m = tessera::read_manifest(step.string());
    tessera::ShardReader r(step.string(), m);
    std::vector<float> out(64);
    r.read(slot, 0, 64, out.data());
    CHECK_THAT(error_of([&] {
                 tessera::require_finite_params(m, step.string(), slot, 0, out.data(), 64);
               }),
               Catch::Contains("parameter 'w' element 37 is infinite") &&
                   Catch::Contains("checkpoint.allow_nonfinite = true"));
  }
}

}  // namespace unit_test_ckpt_binding
