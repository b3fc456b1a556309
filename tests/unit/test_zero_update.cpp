// The walk over a zero plugin's owned ranges (host/zero_update.hpp), which
// both the optimizer step and a checkpoint load take: the engine walks the
// ranges of a zero plugin of ABI 1.2 (reshare, clear_grads) and asks it to
// re-share. An older zero plugin, which walked itself through
// tsr_zero_step's callbacks, is refused (plugin/caps.hpp; the refusal at
// load is tested in test_abi_errors.cpp).
#include <tessera/zero.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <string>
#include <vector>

#include "host/host.hpp"
#include "host/zero_update.hpp"
#include "plugin/caps.hpp"
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

tsr_zero_vtable table(bool abi_1_2) {
  tsr_zero_vtable vt{};
  vt.struct_size = abi_1_2 ? tsr_zero_vtable_STRUCT_SIZE : offsetof(tsr_zero_vtable, reshare);
  vt.ranges = fake_ranges;
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

TEST_CASE("a 1.2 zero plugin is walked by the engine, then re-shares", "[zero_update]") {
  Host host{Host::RunFacts{}};
  const std::string name = "fake";
  FakeZero z;
  const tsr_zero_vtable vt = table(true);
  const ZeroCalls calls{host, &vt, &z, name};
  const std::vector<tsr_owned_range> ranges = zero_owned_ranges(calls);
  REQUIRE(ranges.size() == 2);
  walk_owned_ranges(calls, ranges, logging_walk(z, true));
  // The gradients are the caller's to clear.
  CHECK(z.log ==
        std::vector<std::string>{"each 0 @100", "each 1 @108", "handed_over", "settle", "reshare"});
}

TEST_CASE("only a zero plugin with reshare and clear_grads is served", "[zero_update]") {
  auto descriptor = [](const tsr_zero_vtable *vt) {
    tsr_plugin_descriptor d{};
    d.struct_size = tsr_plugin_descriptor_STRUCT_SIZE;
    d.kind = TSR_KIND_ZERO;
    d.name = "fake";
    d.vtable = vt;
    return d;
  };
  const tsr_zero_vtable now = table(true), old = table(false);
  tsr_zero_vtable unset = table(true);
  unset.clear_grads = nullptr;  // long enough, but the entry is not set
  const tsr_plugin_descriptor d_now = descriptor(&now), d_old = descriptor(&old),
                              d_unset = descriptor(&unset);
  CHECK(caps_zero_refusal(&d_now).empty());
  CHECK(caps_resolve("zero", &d_now).zero.split_step);
  for (const tsr_plugin_descriptor *d : {&d_old, &d_unset}) {
    const std::string why = caps_zero_refusal(d);
    INFO(why);
    CHECK(why.find("before ABI 1.2") != std::string::npos);
    CHECK(why.find(std::to_string(*static_cast<const size_t *>(d->vtable)) + " bytes") !=
          std::string::npos);
    CHECK_FALSE(caps_resolve("zero", d).zero.split_step);
  }
}

TEST_CASE("a walk the stage needs no re-share for ends once every range is handed over",
          "[zero_update]") {
  Host host{Host::RunFacts{}};
  const std::string name = "fake";
  FakeZero z;
  const tsr_zero_vtable vt = table(true);
  const ZeroCalls calls{host, &vt, &z, name};
  walk_owned_ranges(calls, zero_owned_ranges(calls), logging_walk(z, false));
  CHECK(z.log == std::vector<std::string>{"each 0 @100", "each 1 @108", "handed_over"});
}

TEST_CASE("a range that fails stops the walk and names the call", "[zero_update]") {
  Host host{Host::RunFacts{}};
  const std::string name = "fake";
  FakeZero z;
  const tsr_zero_vtable vt = table(true);
  const ZeroCalls calls{host, &vt, &z, name};
  RangeWalk w = logging_walk(z, true);
  w.each = [](size_t, const tsr_owned_range &) { return TSR_ERR_IO; };
  w.each_what = "[offload] plugin 'x' step";
  try {
    walk_owned_ranges(calls, zero_owned_ranges(calls), w);
    FAIL("the walk went on past a failed range");
  } catch (const Error &e) {
    CHECK(e.code() == TSR_ERR_IO);
    CHECK(std::string(e.what()).rfind("[offload] plugin 'x' step", 0) == 0);
  }
  CHECK(z.log.empty());  // no flush, no re-share after the failure
}

}  // namespace unit_test_zero_update
