// sdk::check_token_batch (tessera/cpp/tensor.hpp), the batch check the gpt2
// and llama plugins share: each refusal names the model, the tensor and
// what was expected; a good batch gives its sequence length.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <tessera/cpp/tensor.hpp>
#include <vector>

namespace {

using tessera::sdk::check_token_batch;

struct TokenBatch {
  std::vector<int32_t> ids = std::vector<int32_t>(2 * 8, 1);
  int64_t shape[2] = {2, 8};
  tsr_batch b{};
  TokenBatch() {
    b.size = 2;
    for (DLTensor *t : {&b.inputs, &b.targets}) {
      t->data = ids.data();
      t->device = DLDevice{kDLCPU, 0};
      t->ndim = 2;
      t->dtype = DLDataType{kDLInt, 32, 1};
      t->shape = shape;
    }
  }
};

const DLDevice kCpu{kDLCPU, 0};

std::string refusal(const tsr_batch *b, bool with_targets = true) {
  try {
    check_token_batch("llama", b, with_targets, 4, kCpu, 16, "max_seq");
  } catch (const tessera::sdk::Error &e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("check_token_batch gives T of a good batch, 0 of an empty one", "[sdk][batch]") {
  TokenBatch t;
  CHECK(check_token_batch("llama", &t.b, true, 4, kCpu, 16, "max_seq") == 8);
  t.b.size = 0;
  CHECK(check_token_batch("llama", &t.b, true, 4, kCpu, 16, "max_seq") == 0);
}

TEST_CASE("check_token_batch names what is wrong", "[sdk][batch]") {
  CHECK(refusal(nullptr) == "llama: batch is NULL");
  TokenBatch big;
  big.b.size = 5;
  CHECK_THAT(refusal(&big.b), Catch::Contains("batch of 5 sequences; the model was built for at "
                                              "most 4"));
  TokenBatch f32;
  f32.b.targets.dtype = DLDataType{kDLFloat, 32, 1};
  CHECK_THAT(refusal(&f32.b), Catch::Contains("llama: batch targets must be int32 token ids"));
  CHECK(refusal(&f32.b, false).empty());  // predict: targets are not read
  TokenBatch shape;
  int64_t other[2] = {3, 8};
  shape.b.inputs.shape = other;
  CHECK_THAT(refusal(&shape.b), Catch::Contains("llama: batch inputs are [3, 8], expected [2, T]"));
  TokenBatch where;
  where.b.inputs.device = DLDevice{kDLCUDA, 0};
  CHECK_THAT(refusal(&where.b), Catch::Contains("inputs are not on the model's device"));
  TokenBatch strided;
  int64_t strides[2] = {16, 1};
  strided.b.inputs.strides = strides;
  CHECK_THAT(refusal(&strided.b), Catch::Contains("inputs must be contiguous row-major"));
  TokenBatch ragged;
  int64_t seven[2] = {2, 7};
  ragged.b.targets.shape = seven;
  CHECK_THAT(refusal(&ragged.b), Catch::Contains("targets have 7 tokens per sequence, inputs 8"));
  TokenBatch longer;
  std::vector<int32_t> ids(2 * 17, 1);
  int64_t seventeen[2] = {2, 17};
  for (DLTensor *x : {&longer.b.inputs, &longer.b.targets}) {
    x->data = ids.data();
    x->shape = seventeen;
  }
  CHECK_THAT(refusal(&longer.b),
             Catch::Contains("sequences of 17 tokens; the model's max_seq is 16"));
}
