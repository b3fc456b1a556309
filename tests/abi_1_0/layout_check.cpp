// The frozen ABI 1.0 headers (tests/abi_1_0/include, and nothing of sdk/ on
// this file's include path) against the pinned x86-64 layout of
// layout_1_0.inc, at compile time; and the layout they give on this
// platform as a table, which tests/unit/test_abi_layout.cpp compares with
// the current headers'.
//
// The frozen headers are included inside a namespace, so their types
// (abi_1_0::tsr_host, ...) never meet the current headers' types of the
// same names elsewhere in the test binary. Their own #includes of system
// headers are already satisfied (include guards) before the namespace opens.
#include <dlpack/dlpack.h>
#include <stddef.h>
#include <stdint.h>

#include <cstddef>
#include <cstring>
#include <span>
#include <string_view>

#include "abi_1_0/layout_row.hpp"

#if defined(TESSERA_ABI_H)
#error "the current SDK headers are on this file's include path; it must see only the frozen copy"
#endif

namespace abi_1_0 {
#include <tessera/tessera.h>
}  // namespace abi_1_0

namespace {

#define TSR_ABI_FIELD_SIZE(type, field) sizeof(static_cast<const abi_1_0::type *>(nullptr)->field)

#if defined(__x86_64__) && defined(__LP64__)
// The frozen copy is still the layout pinned for 1.0.
#define TSR_ABI_STRUCT(type, size, align)                                \
  static_assert(sizeof(abi_1_0::type) == size, "1.0 sizeof(" #type ")"); \
  static_assert(alignof(abi_1_0::type) == align, "1.0 alignof(" #type ")");
#define TSR_ABI_FIELD(type, field, offset, size)                                    \
  static_assert(offsetof(abi_1_0::type, field) == offset, "1.0 " #type "." #field); \
  static_assert(TSR_ABI_FIELD_SIZE(type, field) == size, "1.0 sizeof " #type "." #field);
#define TSR_ABI_CONST(name, value) static_assert((name) == (value), "1.0 " #name);
#define TSR_ABI_STRING(name, value) \
  static_assert(std::string_view(name) == std::string_view(value), "1.0 " #name);
#include "abi_1_0/layout_1_0.inc"
#undef TSR_ABI_STRUCT
#undef TSR_ABI_FIELD
#undef TSR_ABI_CONST
#undef TSR_ABI_STRING
#endif

#define TSR_ABI_STRUCT(type, size, align) \
  {#type, "", alignof(abi_1_0::type), sizeof(abi_1_0::type)},
#define TSR_ABI_FIELD(type, field, offset, size) \
  {#type, #field, offsetof(abi_1_0::type, field), TSR_ABI_FIELD_SIZE(type, field)},
#define TSR_ABI_CONST(name, value)
#define TSR_ABI_STRING(name, value)
const tessera::test::AbiLayoutRow kRows[] = {
#include "abi_1_0/layout_1_0.inc"
};

}  // namespace

namespace tessera::test {

std::span<const AbiLayoutRow> abi_1_0_layout() {
  return kRows;
}

}  // namespace tessera::test
