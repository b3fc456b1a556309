// ABI stability: the current SDK headers keep every struct, field and
// constant of ABI 1.0 where 1.0 put it.
//
//  - tests/abi_1_0/layout_1_0.inc pins, for x86-64, the size of every public
//    struct and the offset and size of every field, every integer constant
//    and every string of 1.0. Both the frozen copy of the 1.0 headers
//    (tests/abi_1_0/layout_check.cpp) and the current headers (this file)
//    are held to it with static_assert, so a change that moves a 1.0 field
//    does not compile.
//  - At run time the two are compared row by row as the compiler laid them
//    out, on any platform: same offsets and sizes for every 1.0 field, and
//    structs only ever grown.
//  - The current size of every struct is pinned here too: appending a field
//    (a new minor version) must be a conscious change of this table.
//  - Every struct the current headers declare is in the 1.0 table or in the
//    list of structs added since.
#include <tessera/tessera.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "abi_1_0/layout_row.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_abi_layout {

namespace {

using tessera::test::AbiLayoutRow;

#define TSR_ABI_FIELD_SIZE(type, field) sizeof(static_cast<const type *>(nullptr)->field)

// --- compile time: the current headers against the pinned 1.0 layout --------
#if defined(__x86_64__) && defined(__LP64__)
// A struct may grow (new fields at its end), never shrink; alignment stays.
#define TSR_ABI_STRUCT(type, size, align)                                        \
  static_assert(sizeof(type) >= size, "sizeof(" #type ") shrank below ABI 1.0"); \
  static_assert(alignof(type) == align, "alignof(" #type ") changed since ABI 1.0");
#define TSR_ABI_FIELD(type, field, offset, size)                                           \
  static_assert(offsetof(type, field) == offset, #type "." #field " moved since ABI 1.0"); \
  static_assert(TSR_ABI_FIELD_SIZE(type, field) == size,                                   \
                #type "." #field " changed size since ABI 1.0");
// TSR_ABI_MINOR counts up with every minor version; everything else is fixed.
#define TSR_ABI_CONST(name, value)                                                        \
  static_assert(                                                                          \
      std::string_view(#name) == "TSR_ABI_MINOR" ? (name) >= (value) : (name) == (value), \
      #name " changed since ABI 1.0");
#define TSR_ABI_STRING(name, value) \
  static_assert(std::string_view(name) == (value), #name " changed since ABI 1.0");
#include "abi_1_0/layout_1_0.inc"
#undef TSR_ABI_STRUCT
#undef TSR_ABI_FIELD
#undef TSR_ABI_CONST
#undef TSR_ABI_STRING
#endif

// --- run time: the same rows, laid out by the current headers ---------------
#define TSR_ABI_STRUCT(type, size, align) {#type, "", alignof(type), sizeof(type)},
#define TSR_ABI_FIELD(type, field, offset, size) \
  {#type, #field, offsetof(type, field), TSR_ABI_FIELD_SIZE(type, field)},
#define TSR_ABI_CONST(name, value)
#define TSR_ABI_STRING(name, value)
const AbiLayoutRow kCurrent[] = {
#include "abi_1_0/layout_1_0.inc"
};
#undef TSR_ABI_STRUCT
#undef TSR_ABI_FIELD
#undef TSR_ABI_CONST
#undef TSR_ABI_STRING

// The size of every public struct in the current headers, on x86-64, as of
// ABI 1.12 (1.1: tsr_host and tsr_ops grew; tsr_optimizer_step_args grew by a
// reserved word over 1.0's tail padding and grads_dtype; 1.2: tsr_host,
// the zero and offload tables grew, tsr_device_memory and tsr_offload_stats
// are new; 1.3: tsr_ops grew by the three fused ops; 1.4: tsr_ops grew by
// layernorm_backward_sum; 1.5: tsr_host grew by grads_zeroed; 1.6: tsr_ops
// grew by the nine decoder-block ops, tsr_rope_params is new; 1.8: tsr_ops
// grew by attention_packed_*, tsr_data_info by positions, tsr_batch by its
// positions tensor; 1.9: tsr_ops grew by dropout, tsr_host by
// step_position; 1.10: tsr_ops grew by lowrank_dropout; 1.11: none; 1.12: tsr_ops grew by
// swiglu_backward_out). A new minor
// version that appends fields updates the struct's line here (and
// docs/abi.md), and lists new structs in kAdded.
struct CurrentSize {
  const char *type;
  size_t size;
  size_t actual;
};
#define TSR_CURRENT(type, size) \
  { #type, size, sizeof(type) }
const CurrentSize kCurrentSizes[] = {
    TSR_CURRENT(tsr_param_decl, 80),
    TSR_CURRENT(tsr_plugin_descriptor, 80),
    TSR_CURRENT(tsr_plugin_library, 32),
    TSR_CURRENT(tsr_run_info, 56),
    TSR_CURRENT(tsr_comm, 56),
    TSR_CURRENT(tsr_host, 224),
    TSR_CURRENT(tsr_device_memory, 32),
    TSR_CURRENT(tsr_ops, 304),
    TSR_CURRENT(tsr_rope_params, 56),
    TSR_CURRENT(tsr_data_info, 176),
    TSR_CURRENT(tsr_batch, 160),
    TSR_CURRENT(tsr_dataset_vtable, 40),
    TSR_CURRENT(tsr_param_info, 112),
    TSR_CURRENT(tsr_model_init, 24),
    TSR_CURRENT(tsr_forward_result, 32),
    TSR_CURRENT(tsr_model_vtable, 72),
    TSR_CURRENT(tsr_sampler_args, 40),
    TSR_CURRENT(tsr_sampler_vtable, 40),
    TSR_CURRENT(tsr_segment, 24),
    // 1.1's grads_dtype (4 bytes, at 108) fills what was 1.0's tail padding:
    // the size did not change.
    TSR_CURRENT(tsr_optimizer_step_args, 120),
    TSR_CURRENT(tsr_optimizer_vtable, 48),
    TSR_CURRENT(tsr_zero_plan, 24),
    TSR_CURRENT(tsr_zero_setup, 72),
    TSR_CURRENT(tsr_owned_range, 48),
    TSR_CURRENT(tsr_zero_step, 32),
    TSR_CURRENT(tsr_zero_vtable, 136),
    TSR_CURRENT(tsr_offload_setup, 56),
    TSR_CURRENT(tsr_offload_step, 80),
    TSR_CURRENT(tsr_offload_stats, 48),
    TSR_CURRENT(tsr_offload_vtable, 88),
};
#undef TSR_CURRENT

// Structs added after 1.0: listed here, with their size above.
const std::set<std::string> kAdded = {"tsr_device_memory", "tsr_offload_stats", "tsr_rope_params"};

std::string key(const AbiLayoutRow &r) {
  return std::string(r.type) + (r.field[0] ? std::string(".") + r.field : std::string());
}

std::string read_file(const std::string &path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("every ABI 1.0 field sits where the frozen 1.0 headers put it", "[abi][layout]") {
  const auto frozen = tessera::test::abi_1_0_layout();
  REQUIRE(frozen.size() == std::size(kCurrent));
  size_t fields = 0, structs = 0;
  for (size_t i = 0; i < frozen.size(); ++i) {
    const AbiLayoutRow &old_row = frozen[i], &now = kCurrent[i];
    INFO(key(old_row));
    REQUIRE(key(old_row) == key(now));
    if (old_row.field[0]) {
      CHECK(now.offset == old_row.offset);
      CHECK(now.size == old_row.size);
      ++fields;
    } else {
      CHECK(now.offset == old_row.offset);  // alignment
      CHECK(now.size >= old_row.size);      // grown at the end, never shrunk
      ++structs;
    }
  }
  CHECK(structs == 27);
  CHECK(fields == 216);
}

TEST_CASE("the 1.0 layout table covers every field of every 1.0 struct", "[abi][layout]") {
  // A struct's fields, in order, tile it: each starts at or after the end of
  // the one before, and the gaps are no larger than alignment padding.
  const auto frozen = tessera::test::abi_1_0_layout();
  std::map<std::string, std::vector<AbiLayoutRow>> by_type;
  std::map<std::string, AbiLayoutRow> self;
  for (const AbiLayoutRow &r : frozen) {
    if (r.field[0])
      by_type[r.type].push_back(r);
    else
      self[r.type] = r;
  }
  for (const auto &[type, rows] : by_type) {
    INFO(type);
    size_t end = 0;
    for (const AbiLayoutRow &r : rows) {
      INFO(r.field);
      CHECK(r.offset >= end);
      CHECK(r.offset - end < 8);  // no field missing from the table
      end = r.offset + r.size;
    }
    const AbiLayoutRow &s = self.at(type);
    CHECK(end <= s.size);
    CHECK(s.size - end < s.offset);  // only tail padding after the last field
  }
}

TEST_CASE("the current size of every public struct is pinned", "[abi][layout]") {
#if defined(__x86_64__) && defined(__LP64__)
  for (const CurrentSize &c : kCurrentSizes) {
    INFO(c.type << ": a field was appended or removed; update kCurrentSizes and docs/abi.md");
    CHECK(c.actual == c.size);
  }
#else
  WARN("struct sizes are pinned for x86-64 only; nothing to check here");
#endif
}

TEST_CASE("every struct in the current SDK headers is in the ABI tables", "[abi][layout]") {
  std::set<std::string> known;
  for (const AbiLayoutRow &r : kCurrent) known.insert(r.type);
  for (const std::string &t : kAdded) known.insert(t);
  std::set<std::string> pinned;
  for (const CurrentSize &c : kCurrentSizes) pinned.insert(c.type);
  const std::regex decl(R"(typedef\s+struct\s+(\w+)\s*\{)");
  size_t seen = 0;
  for (const char *h : {"abi.h", "host.h", "ops.h", "dataset.h", "model.h", "sampler.h",
                        "optimizer.h", "zero.h", "offload.h", "tessera.h"}) {
    const std::string path = std::string(TESSERA_SOURCE_DIR) + "/sdk/include/tessera/" + h;
    const std::string text = read_file(path);
    REQUIRE(!text.empty());
    for (std::sregex_iterator it(text.begin(), text.end(), decl), end; it != end; ++it) {
      const std::string name = (*it)[1];
      INFO(path << " declares struct " << name);
      CHECK(known.count(name) == 1);
      CHECK(pinned.count(name) == 1);
      ++seen;
    }
  }
  CHECK(seen == std::size(kCurrentSizes));
}

}  // namespace unit_test_abi_layout
