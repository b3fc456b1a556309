// Packing (docs/data.md, "Packing"): masked shards that record where each
// example starts (versions 2001/2007, written by data/token_shard's
// examples mode, as `tessera data tokenize --format` writes them), and the
// "tokens" dataset's pack = true: windows that hold whole examples (one
// longer than the context split into pieces), positions restarting at 0
// in each, tails of padding whose targets are -100; best fit decreasing,
// as packing.hpp documents, so the windows are written out here by hand.
#include <tessera/dataset.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <tessera/cpp/plugin.hpp>
#include <vector>

#include "data/token_shard.hpp"
#include "support/fixture.hpp"
#include "support/temp_dir.hpp"
#include "util/error.hpp"

namespace unit_test_packing {

namespace {

namespace fs = std::filesystem;
namespace sdk = tessera::sdk;
namespace data = tessera::data;
using tessera::test::Fixture;
using tessera::test::TempDir;

constexpr int32_t kIgnored = -100;

std::vector<unsigned char> read_bytes(const fs::path &p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

int32_t int_at(const std::vector<unsigned char> &b, size_t byte) {
  int32_t v;
  std::memcpy(&v, b.data() + byte, 4);
  return v;
}

struct Dataset {
  Dataset(Fixture &f, const std::string &toml) {
    vt = f.vtable<tsr_dataset_vtable>("dataset", "tokens");
    status = vt->create(f.host.table(), f.config("dataset", "tokens", toml), "train", &self);
  }
  ~Dataset() {
    if (self) vt->destroy(self);
  }
  Dataset(const Dataset &) = delete;
  Dataset &operator=(const Dataset &) = delete;
  const tsr_dataset_vtable *vt = nullptr;
  void *self = nullptr;
  tsr_status status = TSR_OK;
};

// One window's inputs, targets and positions.
struct Window {
  std::vector<int32_t> x, y, pos;
};

tsr_status read_window(Dataset &d, int64_t index, int64_t T, Window &w, bool positions = true) {
  w.x.assign(static_cast<size_t>(T), -99);
  w.y.assign(static_cast<size_t>(T), -99);
  w.pos.assign(static_cast<size_t>(T), -99);
  int64_t shape[2] = {1, T};
  auto b = sdk::make<tsr_batch>();
  b.size = 1;
  b.inputs = sdk::view(w.x.data(), DLDevice{kDLCPU, 0}, sdk::dtype_i32(), 2, shape);
  b.targets = sdk::view(w.y.data(), DLDevice{kDLCPU, 0}, sdk::dtype_i32(), 2, shape);
  if (positions)
    b.positions = sdk::view(w.pos.data(), DLDevice{kDLCPU, 0}, sdk::dtype_i32(), 2, shape);
  return d.vt->read(d.self, &index, &b);
}

// Example e, token i is 50 e + i + 1; every token trained but each
// example's first (and example 1's second: its first target is masked).
struct Example {
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
};

Example example(int e, int len) {
  Example x;
  for (int i = 0; i < len; ++i) {
    x.ids.push_back(static_cast<uint32_t>(50 * e + i + 1));
    x.mask.push_back(i == 0 || (e == 1 && i == 1) ? 0 : 1);
  }
  return x;
}

// The window's expected contents from pieces (example, first token, pairs)
// laid end to end, then padding.
Window expect(const std::vector<Example> &ex, const std::vector<std::array<int, 3>> &pieces,
              int64_t T) {
  Window w;
  for (const auto &[e, from, n] : pieces) {
    const Example &x = ex[static_cast<size_t>(e)];
    for (int j = 0; j < n; ++j) {
      w.x.push_back(static_cast<int32_t>(x.ids[static_cast<size_t>(from + j)]));
      const size_t next = static_cast<size_t>(from + j + 1);
      w.y.push_back(x.mask[next] ? static_cast<int32_t>(x.ids[next]) : kIgnored);
      w.pos.push_back(j);
    }
  }
  w.x.resize(static_cast<size_t>(T), 0);
  w.y.resize(static_cast<size_t>(T), kIgnored);
  w.pos.resize(static_cast<size_t>(T), 0);
  return w;
}

}  // namespace

TEST_CASE("shards with example starts: versions 2001/2007, examples never split across shards",
          "[packing]") {
  TempDir dir;
  for (int width : {2, 4}) {
    INFO("width " << width);
    data::ShardWriter w(dir.path(), "e" + std::to_string(width), width, 10, true, true);
    w.add_example({1, 2, 3, 4}, {0, 1, 1, 1});
    w.add_example({5, 6, 7, 8, 9}, {0, 0, 1, 1, 1});
    w.add_example({10, 11, 12}, {0, 1, 1});  // 4 + 5 + 3 > 10: a shard of its own
    w.finish();
    REQUIRE(w.files().size() == 2);
    const auto b = read_bytes(w.files()[0]);
    const size_t n = 9, wb = static_cast<size_t>(width);
    REQUIRE(b.size() == 1024 + n * (wb + 1) + 2 * 4);
    CHECK(int_at(b, 4) == (width == 2 ? 2001 : 2007));
    CHECK(int_at(b, 8) == 9);
    CHECK(int_at(b, 12) == 2);         // examples
    CHECK(b[1024 + n * wb + 4] == 0);  // the mask: example 2's first token
    CHECK(int_at(b, 1024 + n * (wb + 1)) == 0);
    CHECK(int_at(b, 1024 + n * (wb + 1) + 4) == 4);
    const auto tail = read_bytes(w.files()[1]);
    REQUIRE(tail.size() == 1024 + 3 * (wb + 1) + 4);
    CHECK(int_at(tail, 12) == 1);
    CHECK(int_at(tail, 1024 + 3 * (wb + 1)) == 0);
  }
  data::ShardWriter small(dir.path(), "small", 2, 3, true, true);
  CHECK_THROWS_WITH(
      small.add_example({1, 2, 3, 4}, {1, 1, 1, 1}),
      Catch::Contains("example of 4 tokens does not fit") && Catch::Contains("--shard-tokens 3"));
}

TEST_CASE("pack = true: whole examples per window, positions restart, tails are padding",
          "[packing]") {
  TempDir dir;
  // Pairs (tokens - 1): 4, 8, 2, 19 (over T = 8: pieces of 8, 8, 3), and a
  // single token (no pair: left out).
  const std::vector<Example> ex = {example(0, 5), example(1, 9), example(2, 3), example(3, 20),
                                   example(4, 1)};
  data::ShardWriter w(dir.path(), "p_train", 2, 1000, true, true);
  for (const Example &e : ex) w.add_example(e.ids, e.mask);
  w.finish();
  Fixture f;
  Dataset d(f,
            "files = '" + dir.file("p_train_*.bin") + "'\ncontext = 8\nvocab = 300\npack = true");
  INFO(f.host.last_error());
  REQUIRE(d.status == TSR_OK);
  auto info = sdk::make<tsr_data_info>();
  REQUIRE(d.vt->info(d.self, &info) == TSR_OK);
  CHECK(info.positions == 1);
  REQUIRE(info.length == 5);
  // Best fit decreasing: the three full pieces of 8 in shard order, then 4
  // (example 0) into a new window, 3 (the rest of example 3) beside it
  // where it fits best, and 2 (example 2) into a window of its own; within
  // a window the pieces in shard order.
  const std::vector<Window> want = {
      expect(ex, {{1, 0, 8}}, 8), expect(ex, {{3, 0, 8}}, 8),
      expect(ex, {{3, 8, 8}}, 8), expect(ex, {{0, 0, 4}, {3, 16, 3}}, 8),
      expect(ex, {{2, 0, 2}}, 8),
  };
  for (int64_t i = 0; i < 5; ++i) {
    INFO("window " << i);
    Window got;
    REQUIRE(read_window(d, i, 8, got) == TSR_OK);
    CHECK(got.x == want[static_cast<size_t>(i)].x);
    CHECK(got.y == want[static_cast<size_t>(i)].y);
    CHECK(got.pos == want[static_cast<size_t>(i)].pos);
  }
  // Spelled out for window 3: example 0 whole, then the tail of example 3
  // from position 0, then one token of padding.
  Window w3;
  REQUIRE(read_window(d, 3, 8, w3) == TSR_OK);
  CHECK(w3.pos == std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 0});
  CHECK(w3.x == std::vector<int32_t>{1, 2, 3, 4, 167, 168, 169, 0});
  CHECK(w3.y == std::vector<int32_t>{2, 3, 4, 5, 168, 169, 170, kIgnored});

  // A batch without a positions tensor is refused.
  Window none;
  CHECK(read_window(d, 0, 8, none, false) == TSR_ERR_UNSUPPORTED);
  CHECK_THAT(f.host.last_error(), Catch::Contains("pack = true needs a batch with positions"));
}

TEST_CASE("pack = true refuses shards that record no example starts", "[packing]") {
  TempDir dir;
  data::ShardWriter old(dir.path(), "old_train", 2, 1000, /*masked=*/true);
  old.add({1, 2, 3, 4, 5}, {0, 1, 1, 1, 1});
  old.finish();
  Fixture f;
  // Without pack the masked shard of version 1001 reads as before.
  Dataset plain(f, "files = '" + dir.file("old_train_*.bin") + "'\ncontext = 4");
  CHECK(plain.status == TSR_OK);
  Dataset d(f, "files = '" + dir.file("old_train_*.bin") + "'\ncontext = 4\npack = true");
  CHECK(d.status == TSR_ERR_INVALID);
  CHECK_THAT(f.host.last_error(), Catch::Contains(dir.file("old_train_000000.bin")) &&
                                      Catch::Contains("records no example starts") &&
                                      Catch::Contains("tokenize"));
}

TEST_CASE("a shard whose example starts are damaged is refused naming it", "[packing]") {
  TempDir dir;
  data::ShardWriter w(dir.path(), "bad_train", 2, 1000, true, true);
  w.add_example({1, 2, 3}, {0, 1, 1});
  w.add_example({4, 5, 6}, {0, 1, 1});
  w.finish();
  const fs::path file = w.files()[0];
  {  // The second start (3) becomes 7, past the 6 tokens.
    std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(1024 + 6 * 3 + 4);
    const int32_t seven = 7;
    io.write(reinterpret_cast<const char *>(&seven), 4);
  }
  Fixture f;
  Dataset d(f, "files = '" + file.string() + "'\ncontext = 4\npack = true");
  CHECK(d.status == TSR_ERR_INVALID);
  CHECK_THAT(f.host.last_error(),
             Catch::Contains(file.string()) && Catch::Contains("example start 1 is 7"));
}

}  // namespace unit_test_packing
