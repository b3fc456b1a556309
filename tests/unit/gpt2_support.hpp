// Support for the gpt2 model plugin's tests (test_gpt2.cpp,
// test_gpt2_config.cpp): the golden model's dimensions and tensors
// (tests/data/gpt2_L2_C64/, see test_gpt2.cpp), an instance of the plugin
// loaded from the build tree, test-owned parameters and gradients behind the
// step hooks (State: Hugging Face weights loaded by name, wte's padding rows
// given garbage; records the order of params_done and grads_done), batches
// of token ids, and one training step.
#pragma once

#include <tessera/tessera.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "host/host.hpp"
#include "support/fixture.hpp"
#include "support/safetensors_read.hpp"

namespace tessera::test::gpt2_support {

using tessera::test::Fixture;
using tessera::test::RefTensor;

inline constexpr int64_t kLayers = 2, kHeads = 4, kWidth = 64, kContext = 32, kVocab = 96;
inline constexpr int64_t kPadded = 128, kBatch = 3, kT = 32;

inline const std::map<std::string, RefTensor> &golden(const std::string &file) {
  static std::map<std::string, std::map<std::string, RefTensor>> cache;
  auto it = cache.find(file);
  if (it == cache.end())
    it = cache
             .emplace(file, tessera::test::read_safetensors(
                                tessera::test::data_path("gpt2_L2_C64/" + file)))
             .first;
  return it->second;
}

inline const RefTensor &ref(const std::string &file, const std::string &name) {
  const auto &m = golden(file);
  auto it = m.find(name);
  if (it == m.end()) {
    FAIL(file << " has no tensor '" << name << "'");
    static const RefTensor none;
    return none;
  }
  return it->second;
}

inline tsr_data_info token_data(int64_t T, int64_t vocab = kVocab) {
  tsr_data_info d;
  std::memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  d.length = 100;
  d.input_dtype = DLDataType{kDLInt, 32, 1};
  d.input_ndim = 1;
  d.input_shape[0] = T;
  d.target_dtype = DLDataType{kDLInt, 32, 1};
  d.target_ndim = 1;
  d.target_shape[0] = T;
  d.num_classes = vocab;
  return d;
}

// The golden model's dimensions as config keys.
inline std::string golden_config(const std::string &extra = "") {
  return "layers = 2\nheads = 4\nwidth = 64\ncontext = 32\nvocab = 96\n" + extra;
}

struct Model {
  Fixture &f;
  const tsr_model_vtable *vt;
  void *self = nullptr;
  // `plugin`: another model plugin with the same conventions (llama's tests).
  explicit Model(Fixture &fx, const char *plugin = "gpt2")
      : f(fx), vt(fx.vtable<tsr_model_vtable>("model", plugin)) {}
  ~Model() {
    if (self) vt->destroy(self);
  }
  Model(const Model &) = delete;
  Model &operator=(const Model &) = delete;

  // `host`: another host table than the fixture's (one with a smaller ops
  // table, say); the fixture's by default.
  tsr_status create(tsr_config *cfg, const tsr_data_info &data, int64_t max_batch,
                    const tsr_host *host = nullptr) {
    tsr_model_init init;
    std::memset(&init, 0, sizeof init);
    init.struct_size = sizeof init;
    init.data = &data;
    init.max_micro_batch = max_batch;
    return vt->create(host ? host : f.host.table(), cfg, &init, &self);
  }
  std::vector<tsr_param_info> infos() const {
    std::vector<tsr_param_info> out(vt->num_params(self));
    for (size_t i = 0; i < out.size(); ++i) {
      std::memset(&out[i], 0, sizeof out[i]);
      out[i].struct_size = sizeof out[i];
      REQUIRE(vt->param_info(self, i, &out[i]) == TSR_OK);
    }
    return out;
  }
};

// Test-owned parameters and gradients behind the step hooks; records the
// order of params_done and grads_done, which gradients were asked for, and
// each group's gradients at grads_done.
struct State {
  std::vector<tsr_param_info> info;
  std::vector<std::vector<int64_t>> shape;
  std::vector<std::vector<float>> value, grad;
  std::vector<uint32_t> done, params_released;
  std::set<uint32_t> grads_asked;
  std::map<uint32_t, std::vector<std::vector<float>>> grads_at_done;
  tessera::StepHooks hooks;

  explicit State(const Model &m) : info(m.infos()) {
    for (const tsr_param_info &p : info) {
      shape.emplace_back(p.shape, p.shape + p.ndim);
      int64_t n = 1;
      for (int64_t e : shape.back()) n *= e;
      value.emplace_back(static_cast<size_t>(n), 0.0f);
      grad.emplace_back(static_cast<size_t>(n), 0.0f);
    }
    hooks.param = [this](uint32_t i, DLTensor *out) { return view(value, i, out); };
    hooks.grad = [this](uint32_t i, DLTensor *out) {
      grads_asked.insert(i);
      return view(grad, i, out);
    };
    hooks.grads_done = [this](uint32_t g) {
      done.push_back(g);
      auto &snap = grads_at_done[g];
      snap.clear();
      for (size_t i = 0; i < info.size(); ++i)
        if (info[i].group == g) snap.push_back(grad[i]);
      return TSR_OK;
    };
    hooks.params_done = [this](uint32_t g) {
      params_released.push_back(g);
      return TSR_OK;
    };
  }
  State(const State &) = delete;
  State &operator=(const State &) = delete;

  tsr_status view(std::vector<std::vector<float>> &store, uint32_t i, DLTensor *out) {
    if (i >= store.size()) return TSR_ERR_INVALID;
    std::memset(out, 0, sizeof *out);
    out->data = store[i].data();
    out->device = DLDevice{kDLCPU, 0};
    out->ndim = static_cast<int32_t>(shape[i].size());
    out->dtype = DLDataType{kDLFloat, 32, 1};
    out->shape = shape[i].data();
    return TSR_OK;
  }
  size_t index(const std::string &name) const {
    for (size_t i = 0; i < info.size(); ++i)
      if (name == info[i].name) return i;
    FAIL("no parameter '" << name << "'");
    return 0;
  }
  // The Hugging Face weights by name; wte's padding rows get garbage.
  void load_hf() {
    for (size_t i = 0; i < info.size(); ++i) {
      const RefTensor &r = ref("model.safetensors", info[i].name);
      std::vector<int64_t> want = shape[i];
      if (std::string(info[i].name) == "transformer.wte.weight") want[0] = kVocab;
      REQUIRE(r.shape == want);
      for (size_t j = 0; j < r.data.size(); ++j) value[i][j] = static_cast<float>(r.data[j]);
      for (size_t j = r.data.size(); j < value[i].size(); ++j)
        value[i][j] = 3.0f * std::sin(static_cast<float>(j));
    }
  }
  void zero_grads() {
    for (auto &g : grad) std::fill(g.begin(), g.end(), 0.0f);
    done.clear();
    params_released.clear();
    grads_asked.clear();
  }
};

struct Batch {
  std::vector<int32_t> x, y;
  int64_t shape[2] = {0, 0};
  tsr_batch b;

  Batch(std::vector<int32_t> xs, std::vector<int32_t> ys, int64_t n, int64_t T)
      : x(std::move(xs)), y(std::move(ys)) {
    shape[0] = n;
    shape[1] = T;
  }
  const tsr_batch *get() {
    std::memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.size = shape[0];
    for (DLTensor *t : {&b.inputs, &b.targets}) {
      t->data = t == &b.inputs ? x.data() : y.data();
      t->device = DLDevice{kDLCPU, 0};
      t->ndim = 2;
      t->dtype = DLDataType{kDLInt, 32, 1};
      t->shape = shape;
    }
    return &b;
  }
};

inline std::vector<int32_t> ids_of(const std::string &name) {
  const RefTensor &r = ref("reference.safetensors", name);
  REQUIRE(r.shape == std::vector<int64_t>{kBatch, kT});
  std::vector<int32_t> out;
  for (double v : r.data) out.push_back(static_cast<int32_t>(v));
  return out;
}

inline Batch reference_batch() {
  return Batch(ids_of("input_ids"), ids_of("targets"), kBatch, kT);
}

inline tsr_forward_result fresh_result() {
  tsr_forward_result r;
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  return r;
}

// forward(training = 1) + backward with loss_scale = 1/count: the gradient of
// the mean loss, as loss.backward() computes it.
inline tsr_forward_result train_step(Model &m, State &s, Batch &batch) {
  tsr_step *step = m.f.host.step_handle(&s.hooks);
  tsr_forward_result r = fresh_result();
  REQUIRE(m.vt->forward(m.self, step, batch.get(), 1, &r) == TSR_OK);
  REQUIRE(r.count > 0);
  REQUIRE(m.vt->backward(m.self, step, batch.get(), 1.0f / static_cast<float>(r.count)) == TSR_OK);
  return r;
}

}  // namespace tessera::test::gpt2_support
