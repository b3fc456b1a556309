// The walk over a zero plugin's owned ranges (host/zero_update.hpp), which
// both the optimizer step and a checkpoint load take: a zero plugin of ABI
// 1.2 (reshare, clear_grads) is walked by the engine, an older one walks
// itself through tsr_zero_step's callbacks, and both make the same calls in
// the same order, so a resumed run's parameters do not depend on the ABI.
#include <tessera/zero.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <string>
#include <vector>

#include "host/host.hpp"
#include "host/zero_update.hpp"
#include "util/error.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers stay out of the other files' way.
namespace unit_test_zero_update {

using namespace tessera;

// A zero plugin of two owned ranges that logs what it is asked to do.
struct FakeZero {
  std::vector<std::string> log;
  std::vector<tsr_owned_range> ranges;
  FakeZero() {
    for (size_t i = 0; i < 2; ++i)
      ranges.push_back({tsr_owned_range_STRUCT_SIZE, i * 8, 100 + i * 8, 8, nullptr, nullptr});
  }
};

FakeZero *fake(void *self) {
  return static_cast<FakeZero *>(self);
}

tsr_status fake_ranges(void *self, tsr_range_fn fn, void *ctx) {
  for (const auto &r : fake(self)->ranges)
    if (tsr_status st = fn(ctx, &r); st != TSR_OK) return st;
  return TSR_OK;
}

tsr_status fake_reshare(void *self) {
  fake(self)->log.push_back("reshare");
  return TSR_OK;
}

tsr_status fake_clear_grads(void *self) {
  fake(self)->log.push_back("clear_grads");
  return TSR_OK;
}

// An ABI 1.0 zero plugin's step, as the tree's zero plugin still runs it:
// the ranges, the flush, the re-share (here every time) and the clearing.
tsr_status fake_step(void *self, const tsr_zero_step *st) {
  if (tsr_status s = fake_ranges(self, st->update, st->ctx); s != TSR_OK) return s;
  if (tsr_status s = st->flush(st->ctx); s != TSR_OK) return s;
  fake_reshare(self);
  return fake_clear_grads(self);
}

tsr_zero_vtable table(bool abi_1_2) {
  tsr_zero_vtable vt{};
  vt.struct_size = abi_1_2 ? tsr_zero_vtable_STRUCT_SIZE : offsetof(tsr_zero_vtable, reshare);
  vt.ranges = fake_ranges;
  vt.step = fake_step;
  if (abi_1_2) {
    vt.reshare = fake_reshare;
    vt.clear_grads = fake_clear_grads;
  }
  return vt;
}

// A walk that logs each call, its ranges by flat offset.
RangeWalk logging_walk(FakeZero &z, bool reshare) {
  RangeWalk w;
  w.each = [&z](size_t i, const tsr_owned_range &r) {
    z.log.push_back("each " + std::to_string(i) + " @" + std::to_string(r.flat_offset));
    return TSR_OK;
  };
  w.each_what = "each";
  w.handed_over = [&z] { z.log.push_back("handed_over"); };
  w.settle = [&z] { z.log.push_back("settle"); };
  w.reshare = reshare;
  return w;
}

TEST_CASE("a 1.2 zero plugin is walked by the engine, an older one calls back, the same calls",
          "[zero_update]") {
  Host host{Host::RunFacts{}};
  const std::string name = "fake";
  const std::vector<std::string> walked = {"each 0 @100", "each 1 @108", "handed_over", "settle",
                                           "reshare"};

  FakeZero now;
  const tsr_zero_vtable vt12 = table(true);
  const ZeroCalls z12{host, &vt12, &now, name};
  CHECK(engine_walks_ranges(&vt12));
  const std::vector<tsr_owned_range> ranges = zero_owned_ranges(z12);
  REQUIRE(ranges.size() == 2);
  walk_owned_ranges(z12, ranges, logging_walk(now, true), "step");
  CHECK(now.log == walked);  // the gradients are the caller's to clear

  FakeZero old;
  const tsr_zero_vtable vt10 = table(false);
  CHECK_FALSE(engine_walks_ranges(&vt10));
  walk_owned_ranges({host, &vt10, &old, name}, {}, logging_walk(old, true), "step");
  std::vector<std::string> stepped = walked;
  stepped.push_back("clear_grads");
  CHECK(old.log == stepped);
}

TEST_CASE("a walk the stage needs no re-share for ends once every range is handed over",
          "[zero_update]") {
  Host host{Host::RunFacts{}};
  const std::string name = "fake";
  FakeZero z;
  const tsr_zero_vtable vt = table(true);
  const ZeroCalls calls{host, &vt, &z, name};
  walk_owned_ranges(calls, zero_owned_ranges(calls), logging_walk(z, false), "step");
  CHECK(z.log == std::vector<std::string>{"each 0 @100", "each 1 @108", "handed_over"});
}

TEST_CASE("a range that fails stops the walk and names the call", "[zero_update]") {
  Host host{Host::RunFacts{}};
  const std::string name = "fake";
  for (bool abi_1_2 : {true, false}) {
    FakeZero z;
    const tsr_zero_vtable vt = table(abi_1_2);
    const ZeroCalls calls{host, &vt, &z, name};
    RangeWalk w = logging_walk(z, true);
    w.each = [](size_t, const tsr_owned_range &) { return TSR_ERR_IO; };
    w.each_what = "[offload] plugin 'x' step";
    const std::string expect = abi_1_2 ? "[offload] plugin 'x' step" : "[zero] step";
    try {
      walk_owned_ranges(calls, abi_1_2 ? zero_owned_ranges(calls) : std::vector<tsr_owned_range>{},
                        w, "[zero] step");
      FAIL("the walk went on past a failed range");
    } catch (const Error &e) {
      CHECK(e.code() == TSR_ERR_IO);
      CHECK(std::string(e.what()).rfind(expect, 0) == 0);
    }
    CHECK(z.log.empty());  // no flush, no re-share after the failure
  }
}

}  // namespace unit_test_zero_update
