// Reading a checkpoint's tensors back (checkpoint_read.cpp): each rank
// reads only the byte ranges it owns now, checking every 1 MiB block it
// reads against the manifest. Before the first read from a file, the file
// as a whole is checked without reading its data: its size is the one
// written (nothing appended, nothing cut), and the CRC-32 of its header
// combined with the manifest's block checksums is the file's recorded
// checksum, so a changed header byte or an edited block checksum is
// refused on resume as `ckpt verify` refuses it; and the file's own
// safetensors header must name each of the manifest's tensors at the
// manifest's place (shard_header.cpp), so a manifest edited to move a
// tensor (its start, slot or offset) is refused even with every checksum
// recomputed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera {

// One stored tensor, as the manifest lists it: a run of canonical elements
// of one slot, at a byte offset of one file, with its block checksums.
struct StoredTensor {
  std::string file, name, slot;
  size_t start = 0, count = 0, offset = 0;  // canonical start, elements, byte offset in file
  std::vector<uint32_t> blocks;
};

// Every tensor of a checked manifest, in the manifest's order.
std::vector<StoredTensor> stored_tensors(const nlohmann::json &manifest);

// Why the shard's own header does not hold `tensors` (all of one file, in
// any order) where the manifest puts them, or "" when it does. `prefix` is
// the file's first bytes up to its data (the 8-byte length and the JSON),
// `file_bytes` its size. The writer names each tensor "SLOT@START" (its
// slot and first canonical element) with shape [count], dtype F32 and the
// byte range the manifest gives; the header holds nothing else. Messages
// name the tensor and never a checksum.
std::string shard_header_mismatch(const std::string &prefix, uint64_t file_bytes,
                                  const std::vector<const StoredTensor *> &tensors);

class ShardReader {
 public:
  // `manifest` as read_manifest returns it (checked).
  ShardReader(std::string dir, const nlohmann::json &manifest);
  ~ShardReader();
  ShardReader(const ShardReader &) = delete;
  ShardReader &operator=(const ShardReader &) = delete;

  // Reads canonical elements [c0, c0 + n) of `slot` into dst.
  void read(const std::string &slot, size_t c0, size_t n, float *dst);

 private:
  using Piece = StoredTensor;
  struct File {
    uint64_t bytes = 0;
    uint32_t crc = 0;
    int fd = -1;
  };
  int open(const std::string &name);

  std::string dir_;
  std::vector<Piece> pieces_;  // by slot, then start
  std::map<std::string, File> files_;
};

}  // namespace tessera
