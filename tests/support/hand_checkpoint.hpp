// A checkpoint written by hand, for the readers' tests: one rank, one
// parameter 'w' of the given values (slot "master"), a 64-byte header in
// front of the data, and every checksum right (the blocks, the file, the
// manifest's own). Tests then edit it the way an attacker or an accident
// would.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/manifest.hpp"

namespace tessera::test {

inline constexpr size_t kHandHeader = 64;

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

inline nlohmann::json write_hand_checkpoint(const std::filesystem::path &dir,
                                            const std::vector<float> &values) {
  std::filesystem::create_directories(dir);
  std::string header = "{\"__metadata__\":{\"format\":\"tessera-shard\"}}";
  header.resize(kHandHeader, ' ');
  const std::string data(reinterpret_cast<const char *>(values.data()), values.size() * 4);
  std::ofstream(dir / "rank_00000.safetensors", std::ios::binary) << header << data;
  std::vector<uint32_t> blocks;
  for (size_t at = 0; at < data.size(); at += kCheckpointBlock)
    blocks.push_back(hand_crc(data.substr(at, kCheckpointBlock)));
  nlohmann::json m = {
      {"format", "tessera-checkpoint"},
      {"version", 3},
      {"step", 1},
      {"epoch", 0},
      {"batch_in_epoch", 1},
      {"samples", 4},
      {"global_batch", 4},
      {"seed", 1},
      {"world_size", 1},
      {"slots", {"master"}},
      {"params",
       {{{"name", "w"}, {"shape", {values.size()}}, {"group", 0}, {"canonical_offset", 0}}}},
      {"files",
       {{{"name", "rank_00000.safetensors"},
         {"rank", 0},
         {"bytes", header.size() + data.size()},
         {"crc32", hand_crc(header + data)},
         {"tensors",
          {{{"name", "master@0"},
            {"slot", "master"},
            {"start", 0},
            {"count", values.size()},
            {"offset", header.size()},
            {"block_crc32", blocks}}}}}}},
  };
  write_hand_manifest(dir, m);
  return m;
}

}  // namespace tessera::test
