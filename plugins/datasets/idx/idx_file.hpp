// Reading IDX files (the MNIST format), plain or gzip-compressed.
//
// An IDX file is a big-endian header, magic 0x00 0x00 TYPE NDIMS followed by
// NDIMS uint32 sizes, then the data in row-major order. Only TYPE 0x08
// (unsigned byte) is read here. Everything is checked against the file
// itself: the data must be exactly as long as the header says (read in
// chunks, so a lying header cannot make us allocate more than the file
// holds), and at most kMaxIdxBytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::idx {

inline constexpr uint64_t kMaxIdxBytes = uint64_t{4} << 30;  // 4 GiB

struct IdxArray {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;
};

// Reads an unsigned-byte IDX file with `ndim` dimensions. `role` names the
// file in messages ("images", "labels"). Throws tessera::sdk::Error naming
// the file: TSR_ERR_IO when it cannot be opened or read, TSR_ERR_INVALID when
// its contents are not such an IDX file.
IdxArray read_idx_u8(const std::string &path, const std::string &role, uint32_t ndim);

}  // namespace tessera::idx
