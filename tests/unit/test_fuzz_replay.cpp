// Replays every input of tests/fuzz/corpus/<target>/ (the seeds) and
// tests/fuzz/regressions/<target>/ (what the fuzzers once crashed on)
// through the fuzz targets' entry functions, so that a build without clang
// still runs each one: none may crash (ASan/UBSan builds check more).
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "entries.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_fuzz_replay {

namespace fs = std::filesystem;

TEST_CASE("the fuzz corpus and regressions replay without a crash", "[security][fuzz]") {
  size_t inputs = 0;
  for (const auto &t : tessera::fuzz::targets()) {
    for (const char *kind : {"corpus", "regressions"}) {
      const fs::path dir = fs::path(TESSERA_FUZZ_DIR) / kind / t.name;
      if (!fs::is_directory(dir)) continue;
      std::vector<fs::path> files;
      for (const auto &e : fs::directory_iterator(dir))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());
      for (const auto &f : files) {
        INFO(t.name << ": " << f.string());
        std::ifstream in(f, std::ios::binary);
        const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                      std::istreambuf_iterator<char>());
        CHECK(t.entry(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size()) == 0);
        ++inputs;
      }
    }
    // Edge cases every reader must take: nothing at all, one byte.
    CHECK(t.entry(nullptr, 0) == 0);
    const uint8_t one = 0xff;
    CHECK(t.entry(&one, 1) == 0);
  }
  CHECK(inputs >= 9);  // at least one seed per target
}

TEST_CASE("fuzz targets are found by name", "[security][fuzz]") {
  CHECK(tessera::fuzz::targets().size() == 9);
  CHECK(tessera::fuzz::find("safetensors") != nullptr);
  CHECK(tessera::fuzz::find("no such target") == nullptr);
}

}  // namespace unit_test_fuzz_replay
