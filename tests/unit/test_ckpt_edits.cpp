// Edited and damaged checkpoints (issue 23, item 3): a manifest carries its
// own checksum; coverage is exact (one tensor's start shifted leaves half a
// parameter at its initial values: refused as an overlap or a gap); where
// training stands is range-checked; what `ckpt verify` refuses, resume
// refuses (a changed header byte, appended bytes: ShardReader is what
// resume reads with); a `.tmp` directory or a step directory linked out of
// the checkpoint root is never loaded; overlapping safetensors ranges and
// NaN or infinite weights are errors naming the tensor; init_from into
// another shape names both shapes.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/checkpoint.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/shard_reader.hpp"
#include "plugin/layout.hpp"
#include "support/hand_checkpoint.hpp"
#include "support/temp_dir.hpp"
#include "train/init_from.hpp"
#include "util/error.hpp"
#include "util/safetensors.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_ckpt_edits {

namespace {

namespace fs = std::filesystem;
using tessera::test::TempDir;
using tessera::test::write_hand_checkpoint;
using tessera::test::write_hand_manifest;

std::vector<float> ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * 0.25f - 3.0f;
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

// The hand checkpoint's one tensor split in two at element `at` (bytes
// still end to end), the second piece's start then moved by `shift`.
nlohmann::json split(nlohmann::json m, uint64_t at, int64_t shift) {
  auto &tensors = m["files"][0]["tensors"];
  nlohmann::json a = tensors[0], b = tensors[0];
  const uint64_t count = a["count"].get<uint64_t>();
  a["count"] = at;
  b["name"] = "master@" + std::to_string(at);
  b["start"] = static_cast<int64_t>(at) + shift;
  b["count"] = count - at;
  b["offset"] = a["offset"].get<uint64_t>() + at * 4;
  a["block_crc32"] = {0u};
  b["block_crc32"] = {0u};
  tensors = {a, b};
  return m;
}

}  // namespace

TEST_CASE("a manifest carries its own checksum", "[checkpoint][security]") {
  TempDir dir("tessera_ckpt");
  const fs::path step = dir.path() / "step_00000001";
  nlohmann::json m = write_hand_checkpoint(step, ramp(256));
  REQUIRE(tessera::verify_checkpoint(step.string()).empty());
  m = tessera::read_manifest(step.string());
  m["epoch"] = 0;
  m["step"] = 2;  // an edit that is in range and consistent
  write_hand_manifest(step, m, false);
  const std::string msg = error_of([&] { tessera::read_manifest(step.string()); });
  CHECK_THAT(msg, Catch::Contains("manifest.json") && Catch::Contains("fails its checksum"));
  const auto problems = tessera::verify_checkpoint(step.string());
  REQUIRE(problems.size() == 1);
  CHECK_THAT(problems[0], Catch::Contains("fails its checksum"));
  // Version 3 without one is an edit too.
  m.erase("checksum");
  write_hand_manifest(step, m, false);
  CHECK_THAT(error_of([&] { tessera::read_manifest(step.string()); }),
             Catch::Contains("has no 'checksum'"));
}

TEST_CASE("coverage is exact: an overlap or a gap is refused, naming the slot", "[checkpoint]") {
  TempDir dir("tessera_ckpt");
  const nlohmann::json m = write_hand_checkpoint(dir.path() / "s", ramp(1024));
  REQUIRE_NOTHROW(tessera::check_manifest(split(m, 512, 0), "m"));
  // Shifted back 4 elements: [508, 512) stored twice, [1020, 1024) never.
  CHECK_THAT(error_of([&] { tessera::check_manifest(split(m, 512, -4), "m"); }),
             Catch::Contains("slot 'master'") && Catch::Contains("overlaps the piece before it"));
  // Moved up 4 and cut to fit (a careful edit): [512, 516) in no tensor.
  nlohmann::json gap = split(m, 512, 4);
  gap["files"][0]["tensors"][1]["count"] = 508;
  gap["files"][0]["bytes"] = tessera::test::kHandHeader + 4 * (512 + 508);
  CHECK_THAT(
      error_of([&] { tessera::check_manifest(gap, "m"); }),
      Catch::Contains("slot 'master'") && Catch::Contains("elements [512, 516) are in no tensor"));
  // A piece's bytes must follow the one before: a byte read twice is an edit.
  nlohmann::json twice = split(m, 512, 0);
  twice["files"][0]["tensors"][1]["offset"] = tessera::test::kHandHeader + 2040;
  CHECK_THAT(error_of([&] { tessera::check_manifest(twice, "m"); }),
             Catch::Contains("not where") && Catch::Contains("end"));
}

TEST_CASE("freeze: optimizer state leaves out exactly the parameters saved frozen",
          "[checkpoint][freeze]") {
  TempDir dir("tessera_ckpt");
  // Weights for both halves, state for the first: w1 was saved frozen.
  auto frozen_second = [&](const std::string &name, size_t state) {
    nlohmann::json m = tessera::test::write_hand_shards(
        dir.path() / name, 1024, {"master", "exp_avg"},
        {{{"master", 0, ramp(1024)}, {"exp_avg", 0, ramp(state)}}});
    m["params"] = {{{"name", "w0"}, {"shape", {512}}, {"group", 0}, {"canonical_offset", 0}},
                   {{"name", "w1"},
                    {"shape", {512}},
                    {"group", 0},
                    {"canonical_offset", 512},
                    {"trainable", false}}};
    return m;
  };
  const nlohmann::json m = frozen_second("ok", 512);
  REQUIRE_NOTHROW(tessera::check_manifest(m, "m"));
  // Not marked frozen: its state is missing.
  nlohmann::json unmarked = m;
  unmarked["params"][1].erase("trainable");
  CHECK_THAT(error_of([&] { tessera::check_manifest(unmarked, "m"); }),
             Catch::Contains("slot 'exp_avg'") &&
                 Catch::Contains("elements [512, 1024) are in no tensor"));
  // State for a parameter saved frozen is an edit.
  CHECK_THAT(error_of([&] { tessera::check_manifest(frozen_second("over", 1024), "m"); }),
             Catch::Contains("slot 'exp_avg'") && Catch::Contains("which was saved frozen"));
}

TEST_CASE("where training stands is range-checked", "[checkpoint]") {
  TempDir dir("tessera_ckpt");
  const nlohmann::json m = write_hand_checkpoint(dir.path() / "s", ramp(16));
  struct Case {
    const char *key;
    nlohmann::json value;
    const char *says;
  };
  const std::vector<Case> cases = {
      {"epoch", 1000000000000000000ull, "'epoch'"},
      {"global_batch", 0, "'global_batch' is 0"},
      {"batch_in_epoch", 1000000000000000ull, "'batch_in_epoch'"},
      {"step", -1, "'step' is not a non-negative integer"},
      {"samples", 0, "'samples' = 0"},
  };
  for (const auto &c : cases) {
    INFO(c.key);
    nlohmann::json e = m;
    e[c.key] = c.value;
    CHECK_THAT(error_of([&] { tessera::check_manifest(e, "m"); }), Catch::Contains(c.says));
  }
}

TEST_CASE("resume refuses what verify refuses: a header byte, appended bytes", "[checkpoint]") {
  TempDir dir("tessera_ckpt");
  const fs::path step = dir.path() / "step_00000001";
  const auto values = ramp(300);
  write_hand_checkpoint(step, values);
  const fs::path shard = step / "rank_00000.safetensors";
  std::vector<float> out(values.size());
  auto read_back = [&] {
    tessera::ShardReader r(step.string(), tessera::read_manifest(step.string()));
    r.read("master", 0, out.size(), out.data());
  };
  REQUIRE_NOTHROW(read_back());
  CHECK(out == values);
  std::string bytes;
  {
    std::ifstream in(shard, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  SECTION("a flipped header byte") {
    std::string edited = bytes;
    edited[10] = static_cast<char>(edited[10] ^ 0x20);
    std::ofstream(shard, std::ios::binary) << edited;
    CHECK_THAT(error_of(read_back),
               Catch::Contains(shard.string()) && Catch::Contains("fails its file checksum"));
    const auto problems = tessera::verify_checkpoint(step.string());
    REQUIRE(!problems.empty());
    CHECK_THAT(problems[0], Catch::Contains("file checksum mismatch"));
  }
  SECTION("appended bytes") {
    std::ofstream(shard, std::ios::binary | std::ios::app) << "tail";
    CHECK_THAT(error_of(read_back),
               Catch::Contains(std::to_string(bytes.size() + 4) + " bytes, the manifest says " +
                               std::to_string(bytes.size())));
    CHECK(!tessera::verify_checkpoint(step.string()).empty());
  }
}

TEST_CASE("a .tmp directory or a step linked out of the root is never loaded", "[checkpoint]") {
  TempDir dir("tessera_ckpt");
  const fs::path root = dir.path() / "ckpt", elsewhere = dir.path() / "other";
  write_hand_checkpoint(root / "step_00000001.tmp", ramp(8));
  write_hand_checkpoint(elsewhere / "step_00000002", ramp(8));
  std::ofstream(root / "latest") << "step_00000001.tmp\n";
  CHECK_THAT(error_of([&] { tessera::resolve_checkpoint("auto", root.string()); }),
             Catch::Contains("unfinished checkpoint"));
  CHECK_THAT(error_of([&] {
               tessera::resolve_checkpoint((root / "step_00000001.tmp").string(), root.string());
             }),
             Catch::Contains("unfinished checkpoint"));
  fs::create_directory_symlink(elsewhere / "step_00000002", root / "step_00000002");
  std::ofstream(root / "latest") << "step_00000002\n";
  CHECK_THAT(error_of([&] { tessera::resolve_checkpoint("auto", root.string()); }),
             Catch::Contains("symbolic link out of the checkpoint root"));
  // A link inside the root is the root's own.
  write_hand_checkpoint(root / "step_00000003", ramp(8));
  fs::create_directory_symlink(root / "step_00000003", root / "step_00000004");
  std::ofstream(root / "latest") << "step_00000004\n";
  CHECK(tessera::resolve_checkpoint("auto", root.string()) == (root / "step_00000004").string());
}

TEST_CASE("NaN or infinite weights are an error naming the tensor", "[checkpoint]") {
  TempDir dir("tessera_ckpt");
  auto values = ramp(64);
  values[7] = std::numeric_limits<float>::quiet_NaN();
  write_hand_checkpoint(dir.path() / "nan", values);
  std::vector<float> p;
  CHECK_THAT(
      error_of([&] { tessera::read_canonical_params((dir.path() / "nan").string(), &p, nullptr); }),
      Catch::Contains("parameter 'w'") && Catch::Contains("element 7 is NaN"));
  // init_from: a safetensors file with an infinity.
  values[7] = std::numeric_limits<float>::infinity();
  const std::string st = (dir.path() / "w.safetensors").string();
  tessera::safetensors_write(st, {tessera::StTensor{"w", "F32", {64}, values.data(), 256}});
  tessera::Layout layout;
  tessera::ParamSlot slot;
  slot.name = "w";
  slot.shape = {64};
  slot.numel = 64;
  layout.params.push_back(slot);
  std::vector<float> flat(64);
  CHECK_THAT(error_of([&] { tessera::init_from_safetensors(st, layout, flat.data()); }),
             Catch::Contains("tensor 'w'") && Catch::Contains("element 7 is infinite"));
}

TEST_CASE("init_from into another shape names both shapes", "[checkpoint][messages]") {
  // What a user sees (issue 22): the tensor, the file's shape, the model's.
  TempDir dir("tessera_ckpt");
  std::vector<float> values(256 * 4, 0.5f);
  const std::string st = (dir.path() / "w.safetensors").string();
  tessera::safetensors_write(
      st, {tessera::StTensor{"fc0.weight", "F32", {256, 4}, values.data(), values.size() * 4}});
  tessera::Layout layout;
  tessera::ParamSlot slot;
  slot.name = "fc0.weight";
  slot.shape = {128, 8};
  slot.numel = 128 * 8;
  layout.params.push_back(slot);
  std::vector<float> flat(slot.numel);
  CHECK(error_of([&] { tessera::init_from_safetensors(st, layout, flat.data()); }) ==
        "[model] init_from " + st +
            ": fc0.weight: file [256, 4], model [128, 8]; the file holds another model than "
            "[model] describes (only the first dimension may be smaller in the file, as a "
            "padded vocabulary's)");
  // Fewer rows in the file is a padded vocabulary: it loads.
  layout.params[0].shape = {512, 4};
  layout.params[0].numel = 512 * 4;
  flat.assign(512 * 4, 0.0f);
  CHECK_THAT(tessera::init_from_safetensors(st, layout, flat.data()),
             Catch::Contains("initialised 1 parameters"));
}

TEST_CASE("overlapping safetensors data_offsets are refused", "[security]") {
  TempDir dir("tessera_ckpt");
  // Two tensors over the same 16 bytes: loading one would load the other.
  const std::string header = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                             R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})";
  std::string file(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  file += header + std::string(24, '\0');
  const std::string p = dir.file("overlap.safetensors");
  std::ofstream(p, std::ios::binary) << file;
  CHECK_THAT(error_of([&] { tessera::SafetensorsFile f(p); }),
             Catch::Contains("'a' and 'b' overlap"));
}

}  // namespace unit_test_ckpt_edits
