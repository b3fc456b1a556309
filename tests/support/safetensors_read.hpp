// A small safetensors reader for tests: loads every tensor as doubles.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace tessera::test {

struct RefTensor {
  std::vector<int64_t> shape;
  std::vector<double> data;
};

// Reads F64, F32, I64 and I32 tensors, converted to double.
std::map<std::string, RefTensor> read_safetensors(const std::string &path);

}  // namespace tessera::test
