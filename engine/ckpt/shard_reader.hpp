// Reading a checkpoint's tensors back (checkpoint_read.cpp): each rank
// reads only the byte ranges it owns now, checking every 1 MiB block it
// reads against the manifest. Before the first read from a file, the file
// as a whole is checked without reading its data: its size is the one
// written (nothing appended, nothing cut), and the CRC-32 of its header
// combined with the manifest's block checksums is the file's recorded
// checksum, so a changed header byte or an edited block checksum is
// refused on resume as `ckpt verify` refuses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera {

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
  // One stored tensor: a run of canonical elements of one slot.
  struct Piece {
    std::string file, name, slot;
    size_t start, count, offset;  // canonical start, elements, byte offset in file
    std::vector<uint32_t> blocks;
  };
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
