// The harness's synthetic data files (harness.hpp): token shards of
// pseudo-random ids in llm.c's format.
#include <cstdint>
#include <fstream>
#include <tessera/cpp/formats/token_shard.hpp>
#include <vector>

#include "harness.hpp"

namespace tessera::itest {

void write_token_shard(const fs::path &p, size_t count, uint32_t vocab, uint32_t seed) {
  fs::create_directories(p.parent_path());
  const auto header = formats::token_shard::header(2, static_cast<int64_t>(count));
  std::vector<uint16_t> t(count);
  uint32_t x = seed;
  for (size_t i = 0; i < count; ++i) {
    x = x * 1664525u + 1013904223u;
    t[i] = static_cast<uint16_t>((seed == 0 ? i : x >> 16) % vocab);
  }
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char *>(header.data()), sizeof header);
  out.write(reinterpret_cast<const char *>(t.data()), static_cast<std::streamsize>(t.size() * 2));
}

}  // namespace tessera::itest
