// Support for the llama plugin's tests (test_llama.cpp, test_llama_lora.cpp,
// test_llama_roundtrip.cpp), beside gpt2_support.hpp's plugin instance and
// step hooks: a golden model of tests/data (llama3_L2_C64, qwen2_L2_C64:
// Hugging Face weights and float64 references), the norm-relative error the
// tests hold results to, and predict's last-position logits of prefixes.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "gpt2_support.hpp"
#include "support/fixture.hpp"
#include "support/safetensors_read.hpp"

namespace tessera::test::llama_support {

using gpt2_support::Batch;
using gpt2_support::Model;
using gpt2_support::State;

// A golden directory: model.safetensors (the weights by Hugging Face name)
// and reference.safetensors (input_ids, targets, logits, loss, grad.*).
struct Golden {
  std::string dir;
  std::map<std::string, RefTensor> weights, ref;
  int64_t B = 0, T = 0, V = 0;
  explicit Golden(const std::string &name) : dir(data_path(name)) {
    weights = read_safetensors(dir + "/model.safetensors");
    ref = read_safetensors(dir + "/reference.safetensors");
    B = ref.at("input_ids").shape.at(0);
    T = ref.at("input_ids").shape.at(1);
    V = ref.at("logits").shape.at(2);
  }
  std::vector<int32_t> ids(const std::string &name) const {
    std::vector<int32_t> out;
    for (double v : ref.at(name).data) out.push_back(static_cast<int32_t>(v));
    return out;
  }
  Batch batch() const { return Batch(ids("input_ids"), ids("targets"), B, T); }
  double loss() const { return ref.at("loss").data.at(0); }
  // Every parameter of `s` from the weights, by name and shape.
  void load(State &s) const {
    for (size_t i = 0; i < s.info.size(); ++i) {
      INFO(s.info[i].name);
      const RefTensor &r = weights.at(s.info[i].name);
      REQUIRE(r.shape == s.shape[i]);
      for (size_t j = 0; j < r.data.size(); ++j) s.value[i][j] = static_cast<float>(r.data[j]);
    }
  }
};

// |a - b| / |b| over whole vectors (norms), b the reference.
inline double rel_err(const std::vector<float> &a, const std::vector<double> &b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// predict's float32 logits [B, V] of the last position of each sequence's
// first t + 1 tokens (ids: B sequences of T).
inline std::vector<float> prefix_logits(Model &m, State &s, const std::vector<int32_t> &ids,
                                        int64_t B, int64_t T, int64_t V, int64_t t) {
  tsr_step *step = m.f.host.step_handle(&s.hooks);
  std::vector<int32_t> x;
  for (int64_t b = 0; b < B; ++b)
    x.insert(x.end(), ids.begin() + b * T, ids.begin() + b * T + t + 1);
  Batch batch(x, {}, B, t + 1);
  tsr_batch *bp = const_cast<tsr_batch *>(batch.get());
  bp->targets = DLTensor{};
  std::vector<float> out(static_cast<size_t>(B * V));
  int64_t shape[2] = {B, V};
  DLTensor logits{out.data(), DLDevice{kDLCPU, 0}, 2, DLDataType{kDLFloat, 32, 1}, shape, nullptr,
                  0};
  INFO(m.f.host.last_error());
  REQUIRE(m.vt->predict(m.self, step, bp, &logits) == TSR_OK);
  return out;
}

// The same for the golden batch's sequences.
inline std::vector<float> prefix_logits(Model &m, State &s, const Golden &g, int64_t t) {
  return prefix_logits(m, s, g.ids("input_ids"), g.B, g.T, g.V, t);
}

}  // namespace tessera::test::llama_support
