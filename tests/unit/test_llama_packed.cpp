// Packing changes nothing but speed: three examples packed into one window
// by the "tokens" dataset (pack = true: whole examples, positions
// restarting at 0, the tail padding) give, through the llama plugin, the
// loss and every parameter gradient of the same three examples each alone
// in its own row of an unpacked batch (plain causal attention, positions
// 0..T-1, the rows' tails padding with target -100), within 1e-6 in fp32
// on the CPU. Both losses are the mean over the same unmasked targets (the
// model's loss_sum over its count), so the comparison is exact maths.
//
// The model is the golden Llama of tests/data/llama3_L2_C64 (GQA 4/2,
// llama3 rope scaling) with its weights; the reference here is the model
// itself without packing, which test_llama.cpp holds to Hugging Face.
#include <tessera/tessera.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <tessera/cpp/plugin.hpp>
#include <vector>

#include "data/token_shard.hpp"
#include "gpt2_support.hpp"
#include "support/fixture.hpp"
#include "support/safetensors_read.hpp"
#include "support/temp_dir.hpp"

namespace unit_test_llama_packed {

namespace {

namespace sdk = tessera::sdk;
namespace data = tessera::data;
using tessera::test::Fixture;
using tessera::test::TempDir;
using tessera::test::gpt2_support::Model;
using tessera::test::gpt2_support::State;
using tessera::test::gpt2_support::token_data;

constexpr int64_t kT = 32;
constexpr int32_t kIgnored = -100;

// Three examples: token ids and their loss masks (a prompt head not
// trained), 9, 14 and 6 tokens: 8 + 13 + 5 = 26 targets, one window of 32.
struct Example {
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
};

std::vector<Example> examples() {
  std::vector<Example> out;
  const int64_t lens[3] = {9, 14, 6}, prompt[3] = {3, 5, 2};
  uint32_t seed = 7;
  for (int e = 0; e < 3; ++e) {
    Example x;
    for (int64_t i = 0; i < lens[e]; ++i) {
      seed = seed * 1103515245u + 12345u;
      x.ids.push_back((seed >> 8) % 256);
      x.mask.push_back(i >= prompt[e] ? 1 : 0);
    }
    out.push_back(x);
  }
  return out;
}

// An int32 [n, T] batch in host memory; positions only when given.
struct HostBatch {
  std::vector<int32_t> x, y, pos;
  int64_t shape[2];
  tsr_batch b;
  HostBatch(int64_t n, int64_t T)
      : x(static_cast<size_t>(n * T), 0), y(static_cast<size_t>(n * T), kIgnored), shape{n, T} {}
  const tsr_batch *get() {
    b = sdk::make<tsr_batch>();
    b.size = shape[0];
    b.inputs = sdk::view(x.data(), DLDevice{kDLCPU, 0}, sdk::dtype_i32(), 2, shape);
    b.targets = sdk::view(y.data(), DLDevice{kDLCPU, 0}, sdk::dtype_i32(), 2, shape);
    if (!pos.empty())
      b.positions = sdk::view(pos.data(), DLDevice{kDLCPU, 0}, sdk::dtype_i32(), 2, shape);
    return &b;
  }
};

// The packed window as the dataset reads it from a shard of the examples.
HostBatch packed_window(Fixture &f, const TempDir &dir, const std::vector<Example> &ex) {
  data::ShardWriter w(dir.path(), "sft_train", 2, 1000, true, true);
  for (const Example &e : ex) w.add_example(e.ids, e.mask);
  w.finish();
  const auto *vt = f.vtable<tsr_dataset_vtable>("dataset", "tokens");
  void *self = nullptr;
  const std::string toml = "files = '" + dir.file("sft_train_*.bin") +
                           "'\ncontext = " + std::to_string(kT) + "\nvocab = 256\npack = true\n";
  const tsr_status st =
      vt->create(f.host.table(), f.config("dataset", "tokens", toml), "train", &self);
  INFO(f.host.last_error());
  REQUIRE(st == TSR_OK);
  auto info = sdk::make<tsr_data_info>();
  REQUIRE(vt->info(self, &info) == TSR_OK);
  CHECK(info.length == 1);
  CHECK(info.positions == 1);
  HostBatch hb(1, kT);
  hb.pos.assign(static_cast<size_t>(kT), -1);
  const int64_t index = 0;
  REQUIRE(vt->read(self, &index, const_cast<tsr_batch *>(hb.get())) == TSR_OK);
  vt->destroy(self);
  return hb;
}

// Each example alone in its own row, from position 0, the tail padding.
HostBatch separate_rows(const std::vector<Example> &ex) {
  HostBatch hb(static_cast<int64_t>(ex.size()), kT);
  for (size_t r = 0; r < ex.size(); ++r)
    for (size_t j = 0; j + 1 < ex[r].ids.size(); ++j) {
      hb.x[r * kT + j] = static_cast<int32_t>(ex[r].ids[j]);
      hb.y[r * kT + j] = ex[r].mask[j + 1] ? static_cast<int32_t>(ex[r].ids[j + 1]) : kIgnored;
    }
  return hb;
}

void load_golden(State &s, const std::string &dir) {
  const auto w = tessera::test::read_safetensors(dir + "/model.safetensors");
  for (size_t i = 0; i < s.info.size(); ++i) {
    const auto &t = w.at(s.info[i].name);
    for (size_t j = 0; j < t.data.size(); ++j) s.value[i][j] = static_cast<float>(t.data[j]);
  }
}

// forward + backward with loss_scale 1 / count: the mean loss's gradients.
tsr_forward_result step(Model &m, State &s, HostBatch &hb) {
  tsr_step *st = m.f.host.step_handle(&s.hooks);
  auto r = sdk::make<tsr_forward_result>();
  INFO(m.f.host.last_error());
  REQUIRE(m.vt->forward(m.self, st, hb.get(), 1, &r) == TSR_OK);
  REQUIRE(r.count > 0);
  REQUIRE(m.vt->backward(m.self, st, hb.get(), 1.0f / static_cast<float>(r.count)) == TSR_OK);
  return r;
}

}  // namespace

TEST_CASE("a packed window of 3 examples gives the loss and gradients of the 3 run separately",
          "[llama][packing]") {
  const std::string dir = tessera::test::data_path("llama3_L2_C64");
  const std::vector<Example> ex = examples();
  TempDir tmp;
  Fixture f;
  HostBatch packed = packed_window(f, tmp, ex);
  // The window holds the three examples whole, in order, positions
  // restarting, then padding: checked here so the comparison below is of
  // what the dataset gives a model.
  std::vector<int32_t> want_pos(kT, 0);
  int64_t at = 0;
  for (const Example &e : ex)
    for (size_t j = 0; j + 1 < e.ids.size(); ++j) {
      CHECK(packed.x[static_cast<size_t>(at)] == static_cast<int32_t>(e.ids[j]));
      want_pos[static_cast<size_t>(at++)] = static_cast<int32_t>(j);
    }
  REQUIRE(at == 26);
  CHECK(packed.pos == want_pos);
  for (int64_t t = at; t < kT; ++t) CHECK(packed.y[static_cast<size_t>(t)] == kIgnored);
  HostBatch separate = separate_rows(ex);

  const std::string cfg = "hf_config = \"" + dir + "/config.json\"\n";
  Model mp(f, "llama"), ms(f, "llama");
  REQUIRE(mp.create(f.config("model", "llama", cfg), token_data(kT, 256), 3) == TSR_OK);
  REQUIRE(ms.create(f.config("model", "llama", cfg), token_data(kT, 256), 3) == TSR_OK);
  State sp(mp), ss(ms);
  load_golden(sp, dir);
  load_golden(ss, dir);
  const tsr_forward_result rp = step(mp, sp, packed);
  const tsr_forward_result rs = step(ms, ss, separate);
  REQUIRE(rp.count == rs.count);
  CHECK(rp.count == 6 + 9 + 4);  // the targets after each prompt
  const double lp = rp.loss_sum / static_cast<double>(rp.count);
  const double ls = rs.loss_sum / static_cast<double>(rs.count);
  INFO("mean loss packed " << lp << ", separate " << ls);
  CHECK(std::fabs(lp - ls) <= 1e-6 * std::fabs(ls));
  for (size_t i = 0; i < sp.info.size(); ++i) {
    double worst = 0, scale = 0;
    for (size_t j = 0; j < sp.grad[i].size(); ++j) {
      worst = std::max(worst, std::fabs(double(sp.grad[i][j]) - ss.grad[i][j]));
      scale = std::max(scale, std::fabs(double(ss.grad[i][j])));
    }
    INFO(sp.info[i].name << ": largest difference " << worst << ", largest gradient " << scale);
    CHECK(scale > 0);
    CHECK(worst <= 1e-6 * scale);
  }
}

TEST_CASE("llama refuses batch positions of the wrong shape", "[llama][packing]") {
  const std::string dir = tessera::test::data_path("llama3_L2_C64");
  Fixture f;
  Model m(f, "llama");
  REQUIRE(m.create(f.config("model", "llama", "hf_config = \"" + dir + "/config.json\"\n"),
                   token_data(kT, 256), 2) == TSR_OK);
  State s(m);
  HostBatch hb(2, kT);
  hb.pos.assign(static_cast<size_t>(kT), 0);  // [2, T] claimed, one row given
  tsr_batch *b = const_cast<tsr_batch *>(hb.get());
  int64_t wrong[2] = {1, kT};
  b->positions.shape = wrong;
  auto r = sdk::make<tsr_forward_result>();
  CHECK(m.vt->forward(m.self, f.host.step_handle(&s.hooks), b, 1, &r) == TSR_ERR_INVALID);
  CHECK_THAT(f.host.last_error(), Catch::Contains("positions must be int32 [2, 32]"));
}

}  // namespace unit_test_llama_packed
