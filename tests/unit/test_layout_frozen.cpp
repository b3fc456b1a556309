// The flat layout of a partly frozen model (plugin/layout.hpp): a model
// group with trainable and frozen parameters becomes two layout groups, the
// trainable first, each padded to the world; the canonical space stays the
// declaration order whatever is frozen, so a checkpoint loads under another
// `freeze`.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "plugin/layout.hpp"

// Its own namespace: in a unity batch this file's helpers stay apart.
namespace test_layout_frozen {

namespace {

struct Declared {
  const char *name;
  int64_t numel;
  uint32_t group;
  bool trainable;
};

// A model that only declares parameters: all make_layout asks of it.
struct FakeModel {
  std::vector<Declared> params;
};

size_t fake_num_params(void *self) {
  return static_cast<FakeModel *>(self)->params.size();
}

tsr_status fake_param_info(void *self, size_t i, tsr_param_info *out) {
  const Declared &d = static_cast<FakeModel *>(self)->params[i];
  out->name = d.name;
  out->ndim = 1;
  out->shape[0] = d.numel;
  out->group = d.group;
  out->init = TSR_INIT_ZEROS;
  out->trainable = d.trainable ? 1 : 0;
  out->decay = 1;
  return TSR_OK;
}

tessera::Layout layout_of(FakeModel &m, uint32_t world) {
  tsr_model_vtable vt;
  std::memset(&vt, 0, sizeof vt);
  vt.struct_size = tsr_model_vtable_STRUCT_SIZE;
  vt.num_params = fake_num_params;
  vt.param_info = fake_param_info;
  return tessera::make_layout(&vt, &m, world, "fake");
}

}  // namespace

TEST_CASE("a partly frozen group splits into a trainable and a frozen layout group", "[freeze]") {
  // Group 0 all trainable; group 3 mixed (frozen, trainable, frozen,
  // trainable); group 5 all frozen.
  FakeModel m{{{"a", 5, 0, true},
               {"b", 3, 3, false},
               {"c", 2, 3, true},
               {"d", 4, 3, false},
               {"e", 1, 3, true},
               {"f", 6, 5, false}}};
  const tessera::Layout L = layout_of(m, 2);
  REQUIRE(L.group_offset.size() == 4);
  CHECK(L.model_group == std::vector<uint32_t>{0, 3, 3, 5});
  CHECK(L.group_frozen == std::vector<int32_t>{0, 0, 1, 1});
  // Sizes padded to the world of 2: 5 -> 6, c+e 3 -> 4, b+d 7 -> 8, f 6.
  CHECK(L.group_size == std::vector<size_t>{6, 4, 8, 6});
  CHECK(L.group_offset == std::vector<size_t>{0, 6, 10, 18});
  CHECK(L.total == 24);
  CHECK(L.frozen_total == 14);
  CHECK(L.numel == 21);
  CHECK(L.trainable_numel == 8);
  // Parameters keep their declared index; c and e lead group 3's trainable
  // part, b and d follow in the frozen one.
  CHECK(L.params[2].offset == 6);
  CHECK(L.params[4].offset == 8);
  CHECK(L.params[1].offset == 10);
  CHECK(L.params[3].offset == 13);
  CHECK(L.params[5].offset == 18);
  uint32_t first = 0, last = 0;
  REQUIRE(L.group_index(3, &first, &last));
  CHECK((first == 1 && last == 2));
  REQUIRE(L.group_index(5, &first, &last));
  CHECK((first == 3 && last == 3));
  CHECK_FALSE(L.group_index(4, &first, &last));

  // Canonical offsets are declaration order: a 0, b 5, c 8, d 10, e 14, f 15.
  const auto pieces = L.to_canonical(6, 4);  // c, e and a padding element
  REQUIRE(pieces.size() == 2);
  CHECK((pieces[0].flat == 6 && pieces[0].canonical == 8 && pieces[0].count == 2));
  CHECK((pieces[1].flat == 8 && pieces[1].canonical == 14 && pieces[1].count == 1));
  const auto frozen = L.to_canonical(12, 4);  // the last of b, then d's first three
  REQUIRE(frozen.size() == 2);
  CHECK((frozen[0].flat == 12 && frozen[0].canonical == 7 && frozen[0].count == 1));
  CHECK((frozen[1].flat == 13 && frozen[1].canonical == 10 && frozen[1].count == 3));
  const auto whole = L.to_canonical(0, 6);  // a, then padding
  REQUIRE(whole.size() == 1);
  CHECK((whole[0].canonical == 0 && whole[0].count == 5));

  // Segments give frozen parameters no decay.
  const auto seg = L.segments(10, 8);
  REQUIRE(seg.size() == 1);
  CHECK((seg[0].offset == 0 && seg[0].count == 8 && seg[0].decay == 0));
}

TEST_CASE("nothing frozen: the layout is one group per model group, as before", "[freeze]") {
  FakeModel m{{{"a", 5, 0, true}, {"b", 3, 1, true}, {"c", 2, 1, true}}};
  const tessera::Layout L = layout_of(m, 4);
  CHECK(L.group_size == std::vector<size_t>{8, 8});
  CHECK(L.group_frozen == std::vector<int32_t>{0, 0});
  CHECK(L.frozen_total == 0);
  CHECK(L.params[2].offset == 11);
  const auto p = L.to_canonical(8, 8);
  REQUIRE(p.size() == 1);
  CHECK((p[0].flat == 8 && p[0].canonical == 5 && p[0].count == 5));
}

}  // namespace test_layout_frozen
