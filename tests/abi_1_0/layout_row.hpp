// One row of an ABI layout table: a struct's size (field empty) or one of
// its fields' offset and size, as the compiler laid it out.
#pragma once

#include <cstddef>
#include <span>

namespace tessera::test {

struct AbiLayoutRow {
  const char *type;
  const char *field;  // "" for the struct itself
  size_t offset;      // the struct's alignment, for the struct itself
  size_t size;
};

// Every struct and field of tests/abi_1_0/layout_1_0.inc, measured with the
// frozen 1.0 headers (tests/abi_1_0/layout_check.cpp).
std::span<const AbiLayoutRow> abi_1_0_layout();

}  // namespace tessera::test
