// Samplers "distributed" and "sequential": torch's DistributedSampler
// indices (tests/data/distributed_sampler.json, shuffle=False), and the
// properties that must hold with shuffle on.
#include <tessera/sampler.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tessera/cpp/plugin.hpp>
#include <vector>

#include "support/fixture.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_samplers {

namespace {

using tessera::test::Fixture;
namespace sdk = tessera::sdk;

tsr_sampler_args make_args(int64_t n, uint32_t rank, uint32_t world, int64_t epoch = 0,
                           uint64_t seed = 42) {
  auto a = sdk::make<tsr_sampler_args>();
  a.dataset_size = n;
  a.rank = rank;
  a.world_size = world;
  a.epoch = epoch;
  a.seed = seed;
  return a;
}

// One sampler instance, destroyed at scope exit.
class Sampler {
 public:
  Sampler(Fixture &f, const std::string &name, const std::string &toml = "") : f_(f) {
    vt_ = f.vtable<tsr_sampler_vtable>("sampler", name);
    REQUIRE(vt_ != nullptr);
    REQUIRE(vt_->struct_size >= sizeof(tsr_sampler_vtable));
    tsr_config *cfg = f.config("sampler", name, toml);
    REQUIRE(vt_->create(f.host.table(), cfg, &self_) == TSR_OK);
    REQUIRE(self_ != nullptr);
  }
  ~Sampler() {
    if (self_) vt_->destroy(self_);
  }
  Sampler(const Sampler &) = delete;
  Sampler &operator=(const Sampler &) = delete;

  std::vector<int64_t> indices(const tsr_sampler_args &a) {
    int64_t n = -1;
    const tsr_status s = vt_->epoch_size(self_, &a, &n);
    INFO(f_.host.last_error());
    REQUIRE(s == TSR_OK);
    REQUIRE(n >= 0);
    std::vector<int64_t> out(static_cast<size_t>(n), -1);
    REQUIRE(vt_->indices(self_, &a, out.data()) == TSR_OK);
    return out;
  }
  tsr_status epoch_size(const tsr_sampler_args &a, int64_t *out) {
    return vt_->epoch_size(self_, &a, out);
  }
  tsr_status fill(const tsr_sampler_args &a, int64_t *out) { return vt_->indices(self_, &a, out); }

 private:
  Fixture &f_;
  const tsr_sampler_vtable *vt_ = nullptr;
  void *self_ = nullptr;
};

// All ranks' indices for one epoch, in rank order.
std::vector<std::vector<int64_t>> all_ranks(Sampler &s, int64_t n, uint32_t world, int64_t epoch,
                                            uint64_t seed) {
  std::vector<std::vector<int64_t>> out;
  for (uint32_t r = 0; r < world; ++r)
    out.push_back(s.indices(make_args(n, r, world, epoch, seed)));
  return out;
}

// The global order the ranks interleave: position k * W + r is rank r's k-th.
std::vector<int64_t> interleave(const std::vector<std::vector<int64_t>> &ranks) {
  std::vector<int64_t> out;
  const size_t per = ranks.empty() ? 0 : ranks[0].size();
  for (size_t k = 0; k < per; ++k)
    for (const auto &r : ranks) out.push_back(r[k]);
  return out;
}

}  // namespace

TEST_CASE("distributed sampler declares shuffle and drop_last", "[sampler]") {
  Fixture f;
  const tsr_plugin_descriptor &d = f.desc("sampler", "distributed");
  CHECK(std::string(d.kind) == TSR_KIND_SAMPLER);
  CHECK(std::string(d.version) == "1.0.0");
  REQUIRE(d.num_params == 2);
  CHECK(std::string(d.params[0].name) == "shuffle");
  CHECK(std::string(d.params[0].default_value) == "true");
  CHECK(std::string(d.params[1].name) == "drop_last");
  CHECK(std::string(d.params[1].default_value) == "false");
  CHECK((d.devices & TSR_DEVICE_CPU) != 0);
}

TEST_CASE("distributed sampler matches torch's DistributedSampler without shuffle", "[sampler]") {
  Fixture f;
  std::ifstream in(tessera::test::data_path("distributed_sampler.json"));
  REQUIRE(in.good());
  const nlohmann::json golden = nlohmann::json::parse(in);
  REQUIRE(golden.size() >= 20);

  Sampler keep(f, "distributed", "shuffle = false\ndrop_last = false");
  Sampler drop(f, "distributed", "shuffle = false\ndrop_last = true");
  size_t checked = 0;
  for (const auto &[key, value] : golden.items()) {
    int n = 0, w = 0, d = 0, r = 0;
    REQUIRE(std::sscanf(key.c_str(), "N%d_W%d_drop%d_r%d", &n, &w, &d, &r) == 4);
    const auto expected = value.get<std::vector<int64_t>>();
    for (uint64_t seed : {0ull, 42ull}) {
      for (int64_t epoch : {0, 3}) {
        INFO(key << " seed " << seed << " epoch " << epoch);
        Sampler &s = d ? drop : keep;
        CHECK(s.indices(make_args(n, static_cast<uint32_t>(r), static_cast<uint32_t>(w), epoch,
                                  seed)) == expected);
      }
    }
    ++checked;
  }
  CHECK(checked == golden.size());
}

TEST_CASE("distributed sampler sizes follow torch's formulas", "[sampler]") {
  Fixture f;
  Sampler keep(f, "distributed", "shuffle = true\ndrop_last = false");
  Sampler drop(f, "distributed", "shuffle = true\ndrop_last = true");
  for (int64_t n : {0, 1, 2, 5, 7, 8, 10, 12, 1000, 1001}) {
    for (uint32_t w : {1u, 2u, 3u, 4u, 8u}) {
      INFO("N=" << n << " W=" << w);
      // torch: ceil(N / W); with drop_last and N % W != 0: ceil((N - W) / W).
      const int64_t expect_keep = (n + w - 1) / w;
      const int64_t expect_drop =
          (n % w != 0) ? static_cast<int64_t>(std::ceil(static_cast<double>(n - w) / w))
                       : static_cast<int64_t>(std::ceil(static_cast<double>(n) / w));
      for (uint32_t r = 0; r < w; ++r) {
        int64_t got = -1;
        REQUIRE(keep.epoch_size(make_args(n, r, w), &got) == TSR_OK);
        CHECK(got == expect_keep);
        REQUIRE(drop.epoch_size(make_args(n, r, w), &got) == TSR_OK);
        CHECK(got == expect_drop);
      }
    }
  }
}

TEST_CASE("distributed sampler with shuffle partitions a permutation", "[sampler]") {
  Fixture f;
  Sampler s(f, "distributed", "shuffle = true\ndrop_last = false");
  Sampler again(f, "distributed", "");  // defaults: shuffle = true, drop_last = false
  Sampler drop(f, "distributed", "shuffle = true\ndrop_last = true");
  const uint64_t seed = 1234;
  for (int64_t n : {10, 7, 1000}) {
    for (uint32_t w : {1u, 2u, 3u, 4u}) {
      std::vector<std::vector<int64_t>> previous;
      for (int64_t epoch = 0; epoch < 3; ++epoch) {
        INFO("N=" << n << " W=" << w << " epoch " << epoch);
        const auto ranks = all_ranks(s, n, w, epoch, seed);
        const int64_t per = (n + w - 1) / w;
        const int64_t padding = per * w - n;
        std::vector<int> count(static_cast<size_t>(n), 0);
        for (const auto &r : ranks) {
          CHECK(static_cast<int64_t>(r.size()) == per);
          for (int64_t i : r) {
            REQUIRE(i >= 0);
            REQUIRE(i < n);
            ++count[static_cast<size_t>(i)];
          }
        }
        // Every index at least once; the only repeats are the padding.
        int64_t repeats = 0;
        for (int c : count) {
          CHECK(c >= 1);
          repeats += c - 1;
        }
        CHECK(repeats == padding);
        // The first N positions of the interleaved order are a permutation
        // and the padding repeats its start, as in torch.
        const auto order = interleave(ranks);
        std::vector<int64_t> head(order.begin(), order.begin() + n), sorted = head;
        std::sort(sorted.begin(), sorted.end());
        for (int64_t i = 0; i < n; ++i) CHECK(sorted[static_cast<size_t>(i)] == i);
        for (int64_t k = 0; k < padding; ++k)
          CHECK(order[static_cast<size_t>(n + k)] == order[static_cast<size_t>(k % n)]);
        // Shuffled, not the identity.
        std::vector<int64_t> identity(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) identity[static_cast<size_t>(i)] = i;
        if (epoch == 0) CHECK(head != identity);
        // A new order every epoch.
        if (!previous.empty()) CHECK(interleave(previous) != order);
        previous = ranks;
        // The same seed and epoch give the same order, in any instance.
        CHECK(all_ranks(again, n, w, epoch, seed) == ranks);
        CHECK(all_ranks(s, n, w, epoch, seed) == ranks);
        // Another seed gives another order.
        CHECK(interleave(all_ranks(s, n, w, epoch, seed + 1000)) != order);

        // drop_last: floor(N / W) distinct indices per rank, the same prefix
        // of the same permutation.
        const auto dropped = all_ranks(drop, n, w, epoch, seed);
        std::vector<int64_t> seen;
        for (const auto &r : dropped) {
          CHECK(static_cast<int64_t>(r.size()) == n / w);
          seen.insert(seen.end(), r.begin(), r.end());
        }
        std::sort(seen.begin(), seen.end());
        CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
        const auto dropped_order = interleave(dropped);
        CHECK(std::equal(dropped_order.begin(), dropped_order.end(), order.begin()));
      }
    }
  }
}

TEST_CASE("distributed sampler seeds from seed + epoch like torch", "[sampler]") {
  Fixture f;
  Sampler s(f, "distributed", "shuffle = true");
  CHECK(s.indices(make_args(100, 0, 1, 1, 10)) == s.indices(make_args(100, 0, 1, 0, 11)));
  CHECK(s.indices(make_args(100, 0, 1, 0, 10)) != s.indices(make_args(100, 0, 1, 0, 11)));
}

TEST_CASE("distributed sampler handles empty and tiny datasets", "[sampler]") {
  Fixture f;
  Sampler keep(f, "distributed", "shuffle = true");
  Sampler drop(f, "distributed", "shuffle = true\ndrop_last = true");
  int64_t n = -1;
  REQUIRE(keep.epoch_size(make_args(0, 1, 2), &n) == TSR_OK);
  CHECK(n == 0);
  CHECK(keep.fill(make_args(0, 1, 2), nullptr) == TSR_OK);
  REQUIRE(drop.epoch_size(make_args(3, 2, 4), &n) == TSR_OK);
  CHECK(n == 0);
  CHECK(drop.fill(make_args(3, 2, 4), nullptr) == TSR_OK);
  // One sample, four ranks: everyone gets it.
  for (uint32_t r = 0; r < 4; ++r)
    CHECK(keep.indices(make_args(1, r, 4)) == std::vector<int64_t>{0});
}

TEST_CASE("distributed sampler rejects bad arguments", "[sampler]") {
  Fixture f;
  Sampler s(f, "distributed", "");
  int64_t n = 0;
  CHECK(s.epoch_size(make_args(10, 0, 0), &n) == TSR_ERR_INVALID);
  CHECK_THAT(f.host.last_error(), Catch::Contains("world_size"));
  CHECK(s.epoch_size(make_args(10, 4, 4), &n) == TSR_ERR_INVALID);
  CHECK_THAT(f.host.last_error(), Catch::Contains("rank 4"));
  std::vector<int64_t> out(10);
  CHECK(s.fill(make_args(10, 5, 2), out.data()) == TSR_ERR_INVALID);
  CHECK(s.epoch_size(make_args(-1, 0, 1), &n) == TSR_ERR_INVALID);
  CHECK_THAT(f.host.last_error(), Catch::Contains("dataset_size"));
}

TEST_CASE("sequential sampler covers every sample once, in order", "[sampler]") {
  Fixture f;
  CHECK(f.desc("sampler", "sequential").num_params == 0);
  Sampler s(f, "sequential");
  for (int64_t n : {0, 1, 5, 7, 10, 12, 1000, 1001}) {
    for (uint32_t w : {1u, 2u, 3u, 4u, 8u}) {
      INFO("N=" << n << " W=" << w);
      std::vector<int64_t> all;
      size_t smallest = SIZE_MAX, largest = 0;
      for (uint32_t r = 0; r < w; ++r) {
        const auto mine = s.indices(make_args(n, r, w, r, 7 * r));  // epoch and seed are ignored
        CHECK(mine == s.indices(make_args(n, r, w)));
        smallest = std::min(smallest, mine.size());
        largest = std::max(largest, mine.size());
        all.insert(all.end(), mine.begin(), mine.end());
      }
      // Contiguous blocks in rank order: the concatenation is 0..N-1.
      REQUIRE(static_cast<int64_t>(all.size()) == n);
      for (int64_t i = 0; i < n; ++i) CHECK(all[static_cast<size_t>(i)] == i);
      CHECK(largest - smallest <= 1);
    }
  }
  // numpy.array_split: 10 over 4 is 3, 3, 2, 2.
  CHECK(s.indices(make_args(10, 0, 4)) == std::vector<int64_t>{0, 1, 2});
  CHECK(s.indices(make_args(10, 1, 4)) == std::vector<int64_t>{3, 4, 5});
  CHECK(s.indices(make_args(10, 2, 4)) == std::vector<int64_t>{6, 7});
  CHECK(s.indices(make_args(10, 3, 4)) == std::vector<int64_t>{8, 9});
}

TEST_CASE("sequential sampler rejects bad arguments", "[sampler]") {
  Fixture f;
  Sampler s(f, "sequential");
  int64_t n = 0;
  CHECK(s.epoch_size(make_args(10, 0, 0), &n) == TSR_ERR_INVALID);
  CHECK_THAT(f.host.last_error(), Catch::Contains("world_size"));
  CHECK(s.epoch_size(make_args(10, 2, 2), &n) == TSR_ERR_INVALID);
  CHECK_THAT(f.host.last_error(), Catch::Contains("rank 2"));
}

}  // namespace unit_test_samplers
