// The checkpoint shard writer (engine/ckpt/shard_writer.cpp): the file it
// writes is the safetensors file of its tensors, byte for byte, whatever
// the chunk and block sizes, with O_DIRECT or without; its checksums are
// zlib's CRC-32 of each block and of the whole file, recomputed here from
// the file read back; a failing fill is passed on unchanged.
#include <zlib.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_pool.hpp"
#include "ckpt/shard_writer.hpp"
#include "support/temp_dir.hpp"
#include "util/error.hpp"
#include "util/safetensors.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_shard_writer {

namespace fs = std::filesystem;
using namespace tessera;

namespace {

std::vector<char> read_all(const fs::path &p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

uint32_t zcrc(const char *p, size_t n) {
  return static_cast<uint32_t>(
      crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef *>(p), static_cast<uInt>(n)));
}

// Tensors of awkward sizes: empty, smaller than a block, straddling chunks.
struct Source {
  std::vector<std::vector<float>> data;
  std::vector<StTensor> tensors;
};

Source make_source(const std::vector<size_t> &counts) {
  Source s;
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (size_t i = 0; i < counts.size(); ++i) {
    std::vector<float> v(counts[i]);
    for (float &x : v) x = u(gen);
    s.data.push_back(std::move(v));
    char name[48];  // (snprintf: GCC 12's -Wrestrict misfires on a chain of string +)
    std::snprintf(name, sizeof name, "t%zu@%zu", i, i * 100);
    s.tensors.push_back(
        StTensor{name, "F32", {static_cast<int64_t>(counts[i])}, nullptr, counts[i] * 4});
  }
  return s;
}

ShardWritten write(const fs::path &path, const Source &s, const ShardWriteOptions &o) {
  return write_shard(
      path.string(), s.tensors, {{"format", "tessera-shard"}},
      [&](size_t t, size_t offset, size_t bytes, void *dst) {
        REQUIRE(offset % 4 == 0);
        REQUIRE(offset + bytes <= s.tensors[t].bytes);
        std::memcpy(dst, reinterpret_cast<const char *>(s.data[t].data()) + offset, bytes);
      },
      o);
}

void check_file(const fs::path &path, const Source &s, const ShardWritten &w, size_t block) {
  const std::vector<char> bytes = read_all(path);
  REQUIRE(bytes.size() == w.bytes);
  CHECK(w.data_start % 4096 == 0);
  CHECK(zcrc(bytes.data(), bytes.size()) == w.crc);
  // A safetensors file any reader takes: the header names every tensor at
  // the offsets the writer reported.
  SafetensorsFile f(path.string());
  REQUIRE(f.tensors().size() == s.tensors.size());
  size_t offset = w.data_start;
  REQUIRE(w.blocks.size() == s.tensors.size());
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    INFO("tensor " << s.tensors[i].name);
    const StTensor &t = f.get(s.tensors[i].name);
    REQUIRE(t.bytes == s.tensors[i].bytes);
    // (memcmp only with bytes: an empty vector's data() may be NULL.)
    if (t.bytes > 0) CHECK(std::memcmp(t.data, s.data[i].data(), t.bytes) == 0);
    // One checksum per block of the tensor, each zlib's CRC of its bytes.
    REQUIRE(w.blocks[i].size() == (t.bytes + block - 1) / block);
    for (size_t b = 0; b < w.blocks[i].size(); ++b) {
      const size_t len = std::min(block, t.bytes - b * block);
      CHECK(w.blocks[i][b] == zcrc(bytes.data() + offset + b * block, len));
    }
    offset += t.bytes;
  }
}

}  // namespace

TEST_CASE("shard writer: the file and its checksums, for many chunk and block sizes",
          "[ckpt][shard_writer]") {
  const tessera::test::TempDir tmp;
  const fs::path dir = tmp.path();
  const Source s = make_source({0, 1, 255, 1024, 3000, 70001, 4096, 12345});
  struct Case {
    size_t chunk, block;
    int buffers;
    bool direct;
  };
  for (const Case c :
       {Case{4096, 1024, 1, true}, Case{8192, 1000, 2, true}, Case{12288, 4096, 3, false},
        Case{1u << 20, 1u << 20, 4, true}, Case{4096, 64, 4, false}}) {
    INFO("chunk " << c.chunk << ", block " << c.block << ", buffers " << c.buffers
                  << (c.direct ? ", O_DIRECT" : ""));
    ShardWriteOptions o;
    o.chunk = c.chunk;
    o.block = c.block;
    o.buffers = c.buffers;
    o.direct = c.direct;
    const fs::path path = dir / "shard.safetensors";
    const ShardWritten w = write(path, s, o);
    if (!c.direct) CHECK_FALSE(w.direct);
    check_file(path, s, w, c.block);
  }
}

TEST_CASE("shard writer: the checksums do not depend on the pool's threads",
          "[ckpt][shard_writer]") {
  const tessera::test::TempDir tmp;
  const fs::path dir = tmp.path();
  const Source s = make_source({500000, 123457});
  ShardWriteOptions o;
  o.chunk = 64u << 10;
  o.block = 16u << 10;
  const int before = cpu::pool_threads();
  cpu::pool_set_threads(1);
  const ShardWritten one = write(dir / "a.safetensors", s, o);
  cpu::pool_set_threads(3);
  const ShardWritten three = write(dir / "b.safetensors", s, o);
  cpu::pool_set_threads(before);
  CHECK(one.crc == three.crc);
  CHECK(one.blocks == three.blocks);
  check_file(dir / "b.safetensors", s, three, o.block);
}

TEST_CASE("shard writer: a failing fill is passed on with its status and message",
          "[ckpt][shard_writer]") {
  const tessera::test::TempDir tmp;
  const fs::path dir = tmp.path();
  const Source s = make_source({100000, 100000});
  ShardWriteOptions o;
  o.chunk = 16u << 10;
  int calls = 0;
  try {
    write_shard((dir / "bad.safetensors").string(), s.tensors, {},
                [&](size_t t, size_t, size_t, void *) {
                  if (++calls == 5 || t == 1)
                    throw Error(TSR_ERR_UNSUPPORTED, "offload x: state slot 1 is gone");
                },
                o);
    FAIL("write_shard returned");
  } catch (const Error &e) {
    CHECK(e.code() == TSR_ERR_UNSUPPORTED);
    CHECK(std::string(e.what()) == "offload x: state slot 1 is gone");
  }
  CHECK(calls == 5);
}

TEST_CASE("shard writer: an unwritable path is named", "[ckpt][shard_writer]") {
  const Source s = make_source({10});
  try {
    write_shard("/nonexistent-dir/x/shard.safetensors", s.tensors, {},
                [](size_t, size_t, size_t, void *) {});
    FAIL("write_shard returned");
  } catch (const Error &e) {
    CHECK(std::string(e.what()).find("/nonexistent-dir/x/shard.safetensors: open failed") !=
          std::string::npos);
  }
}

}  // namespace unit_test_shard_writer
