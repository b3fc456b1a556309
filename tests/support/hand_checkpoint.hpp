// A checkpoint written by hand, for the readers' tests: one parameter 'w',
// each shard a real safetensors file (header padded to 256 bytes, tensors
// named SLOT@START as tessera's writer names them) and every checksum right
// (the blocks, the files, the manifest's own). Tests then edit it the way
// an attacker or an accident would.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/manifest.hpp"
#include "util/safetensors.hpp"

namespace tessera::test {

// The one-tensor checkpoint's header: its data starts here.
inline constexpr size_t kHandHeader = 256;

inline uint32_t hand_crc(const std::string &bytes) {
  return static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef *>(bytes.data()), static_cast<uInt>(bytes.size())));
}

// Writes manifest.json; with `checksum`, a right one (as tessera writes it),
// else whatever `m` holds.
inline void write_hand_manifest(const std::filesystem::path &dir, nlohmann::json m,
                                bool checksum = true) {
  if (checksum) m["checksum"] = manifest_checksum(m);
  std::ofstream(dir / "manifest.json") << m.dump(1);
}

// One tensor of a hand shard: elements [start, start + values.size()) of
// `slot`.
struct HandTensor {
  std::string slot;
  size_t start = 0;
  std::vector<float> values;
};

// Writes rank_0000R.safetensors for each entry of `files` and a manifest
// over them: parameter 'w' of `params` elements, the given slots (each
// slot's tensors must tile [0, params)). Returns the manifest.
inline nlohmann::json write_hand_shards(const std::filesystem::path &dir, size_t params,
                                        const std::vector<std::string> &slots,
                                        const std::vector<std::vector<HandTensor>> &files) {
  std::filesystem::create_directories(dir);
  nlohmann::json entries = nlohmann::json::array();
  for (size_t r = 0; r < files.size(); ++r) {
    std::vector<StTensor> tensors;
    std::string data;
    for (const HandTensor &t : files[r]) {
      const std::string name = t.slot + "@" + std::to_string(t.start);
      tensors.push_back(StTensor{
          name, "F32", {static_cast<int64_t>(t.values.size())}, nullptr, t.values.size() * 4});
      data.append(reinterpret_cast<const char *>(t.values.data()), t.values.size() * 4);
    }
    const std::string prefix = safetensors_prefix(tensors, {{"format", "tessera-shard"}}, 256);
    char file[40];
    std::snprintf(file, sizeof file, "rank_%05zu.safetensors", r);
    std::ofstream(dir / file, std::ios::binary) << prefix << data;
    nlohmann::json index = nlohmann::json::array();
    size_t at = 0;
    for (const HandTensor &t : files[r]) {
      const std::string bytes = data.substr(at, t.values.size() * 4);
      std::vector<uint32_t> blocks;
      for (size_t b = 0; b < bytes.size(); b += kCheckpointBlock)
        blocks.push_back(hand_crc(bytes.substr(b, kCheckpointBlock)));
      index.push_back({{"name", t.slot + "@" + std::to_string(t.start)},
                       {"slot", t.slot},
                       {"start", t.start},
                       {"count", t.values.size()},
                       {"offset", prefix.size() + at},
                       {"block_crc32", blocks}});
      at += bytes.size();
    }
    entries.push_back({{"name", file},
                       {"rank", r},
                       {"bytes", prefix.size() + data.size()},
                       {"crc32", hand_crc(prefix + data)},
                       {"tensors", index}});
  }
  nlohmann::json m = {
      {"format", "tessera-checkpoint"},
      {"version", 3},
      {"step", 1},
      {"epoch", 0},
      {"batch_in_epoch", 1},
      {"samples", 4},
      {"global_batch", 4},
      {"seed", 1},
      {"world_size", files.size()},
      {"slots", slots},
      {"params", {{{"name", "w"}, {"shape", {params}}, {"group", 0}, {"canonical_offset", 0}}}},
      {"files", entries},
  };
  write_hand_manifest(dir, m);
  return m;
}

// One rank, one tensor: slot "master" of `values`, its data at kHandHeader.
inline nlohmann::json write_hand_checkpoint(const std::filesystem::path &dir,
                                            const std::vector<float> &values) {
  return write_hand_shards(dir, values.size(), {"master"}, {{{"master", 0, values}}});
}

}  // namespace tessera::test
