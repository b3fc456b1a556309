// One libFuzzer binary per target: TESSERA_FUZZ_TARGET names its entry
// (tests/fuzz/entries.hpp).
#include <cstddef>
#include <cstdint>

#include "entries.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  return tessera::fuzz::TESSERA_FUZZ_TARGET(data, size);
}
