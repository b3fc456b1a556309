// Writes one checkpoint shard (a safetensors file) at the speed of the disk.
//
// The file is a stream of bytes: the safetensors prefix, padded so that the
// data starts on a 4 KiB boundary, then each tensor's bytes in order. It is
// cut into chunks of a few tens of MiB held in a small ring of aligned
// buffers (pinned host memory on a GPU run, so the device copies run at
// full speed). The caller's thread fills chunk k + 1 (the `fill` callback:
// a device-to-host copy or a memcpy of optimizer state) while a writer
// thread writes chunk k with O_DIRECT, past the page cache, and a checksum
// thread computes its 1 MiB block CRCs on the ops' thread pool. Each byte is
// touched once in memory; nothing is read back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "util/safetensors.hpp"

namespace tessera {

// zlib's CRC-32 of `n` bytes, any length: the checksum the manifest records
// per file and per block, computed here on writing and by the checkpoint
// reader on loading.
uint32_t crc32_of(const void *data, size_t n);

// Copies `bytes` bytes of tensor `tensor`, starting at byte `offset` of it,
// to `dst`. Offsets and sizes are multiples of the tensor's element size.
// May throw: the write is then abandoned and the error passed on.
using ShardFill = std::function<void(size_t tensor, size_t offset, size_t bytes, void *dst)>;

// Where the ring's buffers come from (page-aligned memory of `bytes`);
// default: posix_memalign and free.
struct ShardBuffers {
  std::function<void *(size_t bytes)> alloc;
  std::function<void(void *)> release;
};

struct ShardWriteOptions {
  size_t block = 1u << 20;   // checksum block of each tensor, in bytes
  size_t chunk = 32u << 20;  // bytes per buffer (a multiple of 4 KiB)
  int buffers = 4;           // buffers in the ring
  bool direct = true;        // O_DIRECT where the filesystem supports it
  ShardBuffers memory;       // empty functions: posix_memalign
};

struct ShardWritten {
  size_t data_start = 0;                      // offset of tensor 0's first byte
  size_t bytes = 0;                           // the file's size
  uint32_t crc = 0;                           // CRC-32 of the whole file
  std::vector<std::vector<uint32_t>> blocks;  // per tensor: CRC-32 of each block
  bool direct = false;                        // written with O_DIRECT
};

// Writes `tensors` (name, dtype, shape and bytes; `data` unused: `fill`
// provides the bytes) and `metadata` to `path`, created or truncated, and
// syncs it. Errors name the path and the failing call.
ShardWritten write_shard(const std::string &path, const std::vector<StTensor> &tensors,
                         const std::map<std::string, std::string> &metadata, const ShardFill &fill,
                         const ShardWriteOptions &opts = {});

}  // namespace tessera
