// Support for the optimizer plugins' tests (test_optimizers.cpp,
// test_optimizers_low_precision.cpp): one optimizer instance with its own
// state arrays, stepped over whole vectors, and the torch.optim cases of
// tests/data/optimizers.json as [optimizer] TOML.
#pragma once

#include <tessera/optimizer.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tessera/cpp/plugin.hpp>
#include <vector>

#include "support/fixture.hpp"

namespace tessera::test::optimizers_support {

using tessera::test::Fixture;
namespace sdk = tessera::sdk;

// One optimizer instance, destroyed at scope exit, with its own zeroed state
// arrays of n elements.
class Optimizer {
 public:
  Optimizer(Fixture &f, const std::string &name, const std::string &toml, size_t n) : f_(f) {
    vt_ = f.vtable<tsr_optimizer_vtable>("optimizer", name);
    REQUIRE(vt_ != nullptr);
    REQUIRE(vt_->struct_size >= sizeof(tsr_optimizer_vtable));
    tsr_config *cfg = f.config("optimizer", name, toml);
    tsr_status s = vt_->create(f.host.table(), cfg, &self_);
    INFO(f.host.last_error());
    REQUIRE(s == TSR_OK);
    REQUIRE(self_ != nullptr);
    state_.assign(vt_->state_count(self_), std::vector<float>(n, 0.0f));
    for (auto &s : state_) state_ptrs_.push_back(s.data());
  }
  ~Optimizer() {
    if (self_) vt_->destroy(self_);
  }
  Optimizer(const Optimizer &) = delete;
  Optimizer &operator=(const Optimizer &) = delete;

  uint32_t state_count() const { return vt_->state_count(self_); }
  const std::vector<float> &state(size_t i) const { return state_.at(i); }
  const char *state_name(uint32_t i) const { return vt_->state_name(self_, i); }

  // One update of params with grads; the compute copy is written when
  // `compute` is non-null.
  tsr_status step(std::vector<float> &params, const std::vector<float> &grads,
                  const std::vector<tsr_segment> &segments, double lr, int64_t t,
                  double grad_scale = 1.0, void *compute = nullptr,
                  DLDataType compute_dtype = sdk::dtype_f32(),
                  DLDevice device = DLDevice{kDLCPU, 0}) {
    return step_raw(params, grads.data(), DLDataType{0, 0, 0}, segments, lr, t, grad_scale, compute,
                    compute_dtype, device);
  }

  // The same with gradients of any dtype (grads_dtype {0, 0, 0}: left unset,
  // as a caller that zero-fills the struct and ignores the field).
  tsr_status step_raw(std::vector<float> &params, const void *grads, DLDataType grads_dtype,
                      const std::vector<tsr_segment> &segments, double lr, int64_t t,
                      double grad_scale = 1.0, void *compute = nullptr,
                      DLDataType compute_dtype = sdk::dtype_f32(),
                      DLDevice device = DLDevice{kDLCPU, 0}, size_t struct_size = 0) {
    auto a = sdk::make<tsr_optimizer_step_args>();
    if (struct_size) a.struct_size = struct_size;
    a.device = device;
    a.params = params.data();
    a.grads = static_cast<const float *>(grads);
    a.grads_dtype = grads_dtype;
    a.state = state_ptrs_.empty() ? nullptr : state_ptrs_.data();
    a.n = params.size();
    a.segments = segments.data();
    a.num_segments = segments.size();
    a.lr = lr;
    a.grad_scale = grad_scale;
    a.step = t;
    a.compute_params = compute;
    a.compute_dtype = compute_dtype;
    return vt_->step(self_, &a);
  }

 private:
  Fixture &f_;
  const tsr_optimizer_vtable *vt_ = nullptr;
  void *self_ = nullptr;
  std::vector<std::vector<float>> state_;
  std::vector<float *> state_ptrs_;
};

inline nlohmann::json load_cases() {
  std::ifstream in(tessera::test::data_path("optimizers.json"));
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

// The TOML body of an [optimizer] section from one JSON case: every key but
// "optimizer" (the plugin name), values written as JSON, which is valid TOML
// for numbers, booleans and arrays of numbers.
inline std::string toml_from_case(const nlohmann::json &c) {
  std::string body;
  for (const auto &[k, v] : c.items())
    if (k != "optimizer") body += k + " = " + v.dump() + "\n";
  return body;
}

inline std::vector<float> to_float(const std::vector<double> &v, size_t begin, size_t n) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(v[begin + i]);
  return out;
}

inline std::string plugin_of(const nlohmann::json &c) {
  return c.at("optimizer").get<std::string>();
}

}  // namespace tessera::test::optimizers_support
