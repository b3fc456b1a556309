// The mlp model plugin, loaded from the build tree the way a run loads it.
//
// References, none of them computed by the code under test:
//  - tests/data/mlp_relu.safetensors: PyTorch (float64) nn.Sequential
//    20 -> 16 -> 12 -> 5 with ReLU: input, labels, parameters, the mean
//    cross-entropy and every gradient;
//  - for gelu (tanh approximation) and tanh, which PyTorch data does not
//    cover: a double-precision forward written out here and central finite
//    differences of its loss, plus a few finite differences of the plugin's
//    own float32 forward.
// The test owns parameters and gradients (plain float vectors) and hands the
// model views of them through the step hooks, as the engine's zero plugins do.
#include <tessera/tessera.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "host/host.hpp"
#include "support/fixture.hpp"
#include "support/safetensors_read.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_mlp {

namespace {

using tessera::test::Fixture;
using tessera::test::RefTensor;

const std::map<std::string, RefTensor> &reference() {
  static const std::map<std::string, RefTensor> ref =
      tessera::test::read_safetensors(tessera::test::data_path("mlp_relu.safetensors"));
  return ref;
}

const RefTensor &ref_tensor(const std::string &name) {
  const auto &ref = reference();
  auto it = ref.find(name);
  if (it == ref.end()) {
    FAIL("mlp_relu.safetensors has no tensor '" << name << "'");
    static const RefTensor none;
    return none;
  }
  return it->second;
}

// The reference network: 20 inputs, hidden [16, 12], 5 classes, batch 8.
constexpr int64_t kIn = 20, kClasses = 5, kBatch = 8;
const std::vector<int64_t> kDims = {20, 16, 12, 5};

tsr_data_info data_info(int64_t inputs, int64_t classes) {
  tsr_data_info d;
  std::memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  d.length = 100;
  d.input_dtype = DLDataType{kDLFloat, 32, 1};
  d.input_ndim = 1;
  d.input_shape[0] = inputs;
  d.target_dtype = DLDataType{kDLInt, 32, 1};
  d.target_ndim = 0;
  d.num_classes = classes;
  return d;
}

// A model instance, destroyed with the test.
struct Model {
  Fixture &f;
  const tsr_model_vtable *vt;
  void *self = nullptr;
  explicit Model(Fixture &fx) : f(fx), vt(fx.vtable<tsr_model_vtable>("model", "mlp")) {}
  ~Model() {
    if (self) vt->destroy(self);
  }
  Model(const Model &) = delete;
  Model &operator=(const Model &) = delete;

  tsr_status create(tsr_config *cfg, const tsr_data_info &data, int64_t max_batch) {
    tsr_model_init init;
    std::memset(&init, 0, sizeof init);
    init.struct_size = sizeof init;
    init.data = &data;
    init.max_micro_batch = max_batch;
    return vt->create(f.host.table(), cfg, &init, &self);
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

// Test-owned parameters and gradients behind the step hooks. Records the
// order of grads_done and a copy of each group's gradients at that moment,
// to check they were final.
struct State {
  std::vector<tsr_param_info> info;
  std::vector<std::vector<int64_t>> shape;
  std::vector<std::vector<float>> value, grad;
  std::vector<uint32_t> done;
  std::map<uint32_t, std::vector<std::vector<float>>> grads_at_done;
  tessera::StepHooks hooks;

  explicit State(const Model &m) : info(m.infos()) {
    for (const tsr_param_info &p : info) {
      shape.emplace_back(p.shape, p.shape + p.ndim);
      int64_t n = 1;
      for (int64_t d : shape.back()) n *= d;
      value.emplace_back(static_cast<size_t>(n), 0.0f);
      grad.emplace_back(static_cast<size_t>(n), 0.0f);
    }
    hooks.param = [this](uint32_t i, DLTensor *out) { return view(value, i, out); };
    hooks.grad = [this](uint32_t i, DLTensor *out) { return view(grad, i, out); };
    hooks.grads_done = [this](uint32_t g) {
      done.push_back(g);
      auto &snap = grads_at_done[g];
      snap.clear();
      for (size_t i = 0; i < info.size(); ++i)
        if (info[i].group == g) snap.push_back(grad[i]);
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
  void load_reference_params() {
    for (size_t i = 0; i < info.size(); ++i) {
      const RefTensor &r = ref_tensor(std::string("param.") + info[i].name);
      REQUIRE(r.shape == shape[i]);
      for (size_t j = 0; j < r.data.size(); ++j) value[i][j] = static_cast<float>(r.data[j]);
    }
  }
  void zero_grads() {
    for (auto &g : grad) std::fill(g.begin(), g.end(), 0.0f);
  }
};

// A batch in host memory, as the engine's loader hands it over.
struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
  int64_t xshape[2] = {0, 0}, yshape[1] = {0};
  tsr_batch b;

  Batch(std::vector<float> xs, std::vector<int32_t> ys, int64_t inputs)
      : x(std::move(xs)), y(std::move(ys)) {
    xshape[0] = yshape[0] = static_cast<int64_t>(y.size());
    xshape[1] = inputs;
  }
  const tsr_batch *get() {
    std::memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.size = yshape[0];
    b.inputs.data = x.data();
    b.inputs.device = DLDevice{kDLCPU, 0};
    b.inputs.ndim = 2;
    b.inputs.dtype = DLDataType{kDLFloat, 32, 1};
    b.inputs.shape = xshape;
    b.targets.data = y.data();
    b.targets.device = DLDevice{kDLCPU, 0};
    b.targets.ndim = 1;
    b.targets.dtype = DLDataType{kDLInt, 32, 1};
    b.targets.shape = yshape;
    return &b;
  }
};

Batch reference_batch() {
  const RefTensor &x = ref_tensor("x"), &y = ref_tensor("y");
  REQUIRE(x.shape == std::vector<int64_t>{kBatch, kIn});
  REQUIRE(y.shape == std::vector<int64_t>{kBatch});
  std::vector<float> xs(x.data.begin(), x.data.end());
  std::vector<int32_t> ys;
  for (double v : y.data) ys.push_back(static_cast<int32_t>(v));
  return Batch(std::move(xs), std::move(ys), kIn);
}

tsr_forward_result fresh_result() {
  tsr_forward_result r;
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  return r;
}

// --- an independent forward in double ---------------------------------------

double act_ref(const std::string &act, double x) {
  if (act == "relu") return x > 0 ? x : 0;
  if (act == "tanh") return std::tanh(x);
  // gelu, tanh approximation (torch approximate="tanh", GPT-2)
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

// Mean cross-entropy of the MLP whose parameters are `p` (in declaration
// order: w0, b0, w1, b1, ...) over the batch; counts argmax hits.
double ref_loss(const std::vector<std::vector<double>> &p, const std::string &act,
                const Batch &batch, int64_t *correct = nullptr) {
  const int64_t n = static_cast<int64_t>(batch.y.size());
  const size_t L = kDims.size() - 1;
  double total = 0;
  int64_t hits = 0;
  for (int64_t r = 0; r < n; ++r) {
    std::vector<double> h(batch.x.begin() + r * kIn, batch.x.begin() + (r + 1) * kIn);
    for (size_t l = 0; l < L; ++l) {
      const int64_t in = kDims[l], out = kDims[l + 1];
      const std::vector<double> &w = p[2 * l], &b = p[2 * l + 1];
      std::vector<double> o(static_cast<size_t>(out));
      for (int64_t j = 0; j < out; ++j) {
        double s = b[j];
        for (int64_t k = 0; k < in; ++k) s += w[j * in + k] * h[k];
        o[j] = l + 1 < L ? act_ref(act, s) : s;
      }
      h = std::move(o);
    }
    const double mx = *std::max_element(h.begin(), h.end());
    double z = 0;
    for (double v : h) z += std::exp(v - mx);
    total += mx + std::log(z) - h[batch.y[r]];
    hits += std::max_element(h.begin(), h.end()) - h.begin() == batch.y[r];
  }
  if (correct) *correct = hits;
  return total / static_cast<double>(n);
}

std::vector<std::vector<double>> as_double(const std::vector<std::vector<float>> &v) {
  std::vector<std::vector<double>> out;
  for (const auto &t : v) out.emplace_back(t.begin(), t.end());
  return out;
}

double max_abs(const std::vector<double> &v) {
  double m = 0;
  for (double e : v) m = std::max(m, std::fabs(e));
  return m;
}

// forward(training = 1) + backward with loss_scale = 1/n: the gradients of
// the mean loss, as PyTorch's loss.backward() computes them.
tsr_forward_result train_step(Model &m, State &s, Batch &batch) {
  tsr_step *step = m.f.host.step_handle(&s.hooks);
  tsr_forward_result r = fresh_result();
  REQUIRE(m.vt->forward(m.self, step, batch.get(), 1, &r) == TSR_OK);
  const float scale = 1.0f / static_cast<float>(batch.y.size());
  REQUIRE(m.vt->backward(m.self, step, batch.get(), scale) == TSR_OK);
  return r;
}

double eval_loss(Model &m, State &s, Batch &batch) {
  tsr_forward_result r = fresh_result();
  REQUIRE(m.vt->forward(m.self, m.f.host.step_handle(&s.hooks), batch.get(), 0, &r) == TSR_OK);
  return r.loss_sum / static_cast<double>(r.count);
}

}  // namespace

TEST_CASE("mlp is a model plugin for CPU and CUDA", "[mlp]") {
  Fixture f;
  const tsr_plugin_descriptor &d = f.desc("model", "mlp");
  CHECK(std::string(d.kind) == TSR_KIND_MODEL);
  CHECK(std::string(d.name) == "mlp");
  CHECK(std::string(d.version) == "1.0.0");
  CHECK(d.devices == (TSR_DEVICE_CPU | TSR_DEVICE_CUDA));
  const auto *vt = static_cast<const tsr_model_vtable *>(d.vtable);
  CHECK(vt->struct_size == sizeof(tsr_model_vtable));
  std::vector<std::string> keys;
  for (size_t i = 0; i < d.num_params; ++i) keys.push_back(d.params[i].name);
  CHECK(keys == std::vector<std::string>{"hidden", "activation", "init", "init_std"});
}

TEST_CASE("mlp declares nn.Sequential parameters, one group per layer", "[mlp]") {
  Fixture f;
  const tsr_data_info data = data_info(kIn, kClasses);

  SECTION("torch init: nn.Linear's default uniform(+-1/sqrt(fan_in))") {
    Model m(f);
    REQUIRE(m.create(f.config("model", "mlp", "hidden = [16, 12]"), data, 4) == TSR_OK);
    const std::vector<tsr_param_info> p = m.infos();
    REQUIRE(p.size() == 6);
    const char *names[] = {"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"};
    for (size_t i = 0; i < 6; ++i) {
      INFO("parameter " << i);
      const int64_t in = kDims[i / 2], out = kDims[i / 2 + 1];
      const bool weight = i % 2 == 0;
      CHECK(std::string(p[i].name) == names[i]);
      CHECK(p[i].group == i / 2);
      CHECK(p[i].trainable == 1);
      CHECK(p[i].decay == (weight ? 1 : 0));
      REQUIRE(p[i].ndim == (weight ? 2 : 1));
      CHECK(p[i].shape[0] == out);
      if (weight) CHECK(p[i].shape[1] == in);
      CHECK(p[i].init == TSR_INIT_UNIFORM);
      CHECK(p[i].init_a == Approx(-1.0 / std::sqrt(static_cast<double>(in))));
      CHECK(p[i].init_b == Approx(1.0 / std::sqrt(static_cast<double>(in))));
    }
    // 6 FLOPs per weight multiply-add: 2 forward, 4 backward.
    CHECK(m.vt->flops_per_sample(m.self) == 6.0 * (20 * 16 + 16 * 12 + 12 * 5));
    // Out of range is an error with a message, not a crash.
    tsr_param_info out;
    std::memset(&out, 0, sizeof out);
    out.struct_size = sizeof out;
    CHECK(m.vt->param_info(m.self, 6, &out) == TSR_ERR_INVALID);
    CHECK_THAT(f.host.last_error(), Catch::Contains("out of range"));
  }

  SECTION("normal init: weights N(0, init_std), biases zero") {
    Model m(f);
    REQUIRE(m.create(f.config("model", "mlp", "hidden = [7]\ninit = \"normal\"\ninit_std = 0.05"),
                     data, 4) == TSR_OK);
    const std::vector<tsr_param_info> p = m.infos();
    REQUIRE(p.size() == 4);
    CHECK(std::string(p[2].name) == "2.weight");
    CHECK(p[2].shape[0] == kClasses);
    CHECK(p[2].shape[1] == 7);
    for (size_t i = 0; i < 4; i += 2) {
      CHECK(p[i].init == TSR_INIT_NORMAL);
      CHECK(p[i].init_a == 0.0f);
      CHECK(p[i].init_b == Approx(0.05));
      CHECK(p[i + 1].init == TSR_INIT_ZEROS);
    }
  }

  SECTION("defaults: hidden [256, 128] over a flattened multi-dim input") {
    tsr_data_info img = data_info(1, 10);
    img.input_ndim = 3;
    img.input_shape[0] = 1;
    img.input_shape[1] = 28;
    img.input_shape[2] = 28;
    Model m(f);
    REQUIRE(m.create(f.config("model", "mlp"), img, 4) == TSR_OK);
    const std::vector<tsr_param_info> p = m.infos();
    REQUIRE(p.size() == 6);
    CHECK(p[0].shape[0] == 256);
    CHECK(p[0].shape[1] == 784);
    CHECK(p[2].shape[1] == 256);
    CHECK(p[4].shape[0] == 10);
    CHECK(p[4].shape[1] == 128);
  }

  SECTION("hidden = [] is a linear softmax classifier") {
    Model m(f);
    REQUIRE(m.create(f.config("model", "mlp", "hidden = []"), data, 4) == TSR_OK);
    const std::vector<tsr_param_info> p = m.infos();
    REQUIRE(p.size() == 2);
    CHECK(std::string(p[0].name) == "0.weight");
    CHECK(p[0].shape[0] == kClasses);
    CHECK(p[0].shape[1] == kIn);
  }
}

TEST_CASE("mlp forward and backward match PyTorch", "[mlp]") {
  Fixture f;
  const tsr_data_info data = data_info(kIn, kClasses);
  Model m(f);
  // max_micro_batch 12 > 8: the batch fills only part of the activation buffers.
  REQUIRE(m.create(f.config("model", "mlp", "hidden = [16, 12]\nactivation = \"relu\""), data,
                   12) == TSR_OK);
  State s(m);
  s.load_reference_params();
  Batch batch = reference_batch();

  const tsr_forward_result r = train_step(m, s, batch);
  const double want_loss = ref_tensor("loss").data.at(0);
  CHECK(r.count == kBatch);
  CHECK(r.loss_sum / static_cast<double>(r.count) == Approx(want_loss).epsilon(1e-5));
  int64_t want_correct = 0;
  ref_loss(as_double(s.value), "relu", batch, &want_correct);
  CHECK(r.correct == want_correct);

  // Tolerance: the model runs in float32 on float32 copies of the float64
  // reference, so each entry may be off by a few float32 roundings relative
  // to the sums that produced it: 1e-5 relative. Entries that are small
  // because terms cancel (or exactly zero behind a dead ReLU unit) carry the
  // rounding error of the large terms, not of their small result, so each
  // entry also gets an absolute floor of 1e-6 * the tensor's largest |ref|.
  for (size_t i = 0; i < s.info.size(); ++i) {
    const RefTensor &g = ref_tensor(std::string("grad.") + s.info[i].name);
    REQUIRE(g.shape == s.shape[i]);
    const double floor = 1e-6 * max_abs(g.data);
    for (size_t j = 0; j < g.data.size(); ++j) {
      INFO(s.info[i].name << "[" << j << "]: got " << s.grad[i][j] << ", PyTorch " << g.data[j]);
      CHECK(std::fabs(s.grad[i][j] - g.data[j]) <= 1e-5 * std::fabs(g.data[j]) + floor);
    }
  }

  SECTION("grads_done: each layer once, last layer first, its gradients final") {
    CHECK(s.done == std::vector<uint32_t>{2, 1, 0});
    for (uint32_t g = 0; g < 3; ++g) {
      const auto &snap = s.grads_at_done.at(g);
      REQUIRE(snap.size() == 2);
      CHECK(snap[0] == s.grad[2 * g]);
      CHECK(snap[1] == s.grad[2 * g + 1]);
    }
  }

  SECTION("gradients accumulate over micro-batches") {
    const std::vector<std::vector<float>> once = s.grad;
    train_step(m, s, batch);
    for (size_t i = 0; i < s.grad.size(); ++i)
      for (size_t j = 0; j < s.grad[i].size(); ++j)
        CHECK(s.grad[i][j] == Approx(2.0 * once[i][j]).epsilon(1e-6).margin(1e-9));
  }

  SECTION("loss_scale scales the gradients") {
    const std::vector<std::vector<float>> mean = s.grad;
    s.zero_grads();
    tsr_step *step = f.host.step_handle(&s.hooks);
    tsr_forward_result r2 = fresh_result();
    REQUIRE(m.vt->forward(m.self, step, batch.get(), 1, &r2) == TSR_OK);
    REQUIRE(m.vt->backward(m.self, step, batch.get(), 1.0f) == TSR_OK);  // d loss_sum
    for (size_t i = 0; i < s.grad.size(); ++i)
      for (size_t j = 0; j < s.grad[i].size(); ++j)
        CHECK(s.grad[i][j] == Approx(kBatch * mean[i][j]).epsilon(1e-5).margin(1e-7));
  }

  SECTION("a smaller batch uses the first rows only") {
    Batch half(std::vector<float>(batch.x.begin(), batch.x.begin() + 3 * kIn),
               std::vector<int32_t>(batch.y.begin(), batch.y.begin() + 3), kIn);
    const double want = ref_loss(as_double(s.value), "relu", half);
    tsr_forward_result r3 = fresh_result();
    REQUIRE(m.vt->forward(m.self, f.host.step_handle(&s.hooks), half.get(), 0, &r3) == TSR_OK);
    CHECK(r3.count == 3);
    CHECK(r3.loss_sum / 3 == Approx(want).epsilon(1e-5));
  }
}

TEST_CASE("mlp predict returns the logits forward's loss is made of", "[mlp]") {
  Fixture f;
  Model m(f);
  REQUIRE(m.create(f.config("model", "mlp", "hidden = [16, 12]\nactivation = \"relu\""),
                   data_info(kIn, kClasses), 12) == TSR_OK);
  REQUIRE(TSR_HAS_FIELD(m.vt, tsr_model_vtable, predict));
  State s(m);
  s.load_reference_params();
  Batch batch = reference_batch();
  tsr_step *step = f.host.step_handle(&s.hooks);
  tsr_forward_result r = fresh_result();
  REQUIRE(m.vt->forward(m.self, step, batch.get(), 0, &r) == TSR_OK);

  int64_t qshape[2] = {1, 0};
  DLTensor q{nullptr, DLDevice{kDLCPU, 0}, 2, DLDataType{kDLFloat, 32, 1}, qshape, nullptr, 0};
  REQUIRE(m.vt->predict(m.self, step, nullptr, &q) == TSR_OK);
  CHECK(qshape[1] == kClasses);

  tsr_batch no_targets = *batch.get();
  no_targets.targets = DLTensor{};
  std::vector<float> z(static_cast<size_t>(kBatch * kClasses), 0.0f);
  int64_t zshape[2] = {kBatch, kClasses};
  DLTensor logits{z.data(), DLDevice{kDLCPU, 0}, 2, DLDataType{kDLFloat, 32, 1}, zshape, nullptr,
                  0};
  INFO(f.host.last_error());
  REQUIRE(m.vt->predict(m.self, step, &no_targets, &logits) == TSR_OK);
  double loss = 0;
  for (int64_t i = 0; i < kBatch; ++i) {
    const float *row = z.data() + i * kClasses;
    const double mx = *std::max_element(row, row + kClasses);
    double sum = 0;
    for (int64_t c = 0; c < kClasses; ++c) sum += std::exp(row[c] - mx);
    loss -= row[batch.y[static_cast<size_t>(i)]] - mx - std::log(sum);
  }
  CHECK(loss == Approx(r.loss_sum).epsilon(1e-5));
  // Nothing kept for backward.
  CHECK(m.vt->backward(m.self, step, batch.get(), 1.0f) == TSR_ERR_INVALID);
}

TEST_CASE("mlp gelu and tanh gradients match finite differences", "[mlp]") {
  for (const std::string act : {"gelu", "tanh"}) {
    DYNAMIC_SECTION("activation " << act) {
      Fixture f;
      const tsr_data_info data = data_info(kIn, kClasses);
      Model m(f);
      REQUIRE(m.create(f.config("model", "mlp", "hidden = [16, 12]\nactivation = \"" + act + "\""),
                       data, kBatch) == TSR_OK);
      State s(m);
      s.load_reference_params();
      Batch batch = reference_batch();
      const tsr_forward_result r = train_step(m, s, batch);

      // The loss against the double-precision forward written here.
      std::vector<std::vector<double>> p = as_double(s.value);
      int64_t want_correct = 0;
      const double want_loss = ref_loss(p, act, batch, &want_correct);
      CHECK(r.count == kBatch);
      CHECK(r.loss_sum / kBatch == Approx(want_loss).epsilon(1e-5));
      CHECK(r.correct == want_correct);

      // Every gradient entry against central differences of that double
      // loss (h = 1e-6: truncation ~h^2 and rounding ~1e-16/h, both far
      // below the float32 error of the model). Same tolerance, and the same
      // reasoning, as against PyTorch: 1e-5 relative, floor 1e-6 * max|grad|.
      const double h = 1e-6;
      for (size_t i = 0; i < p.size(); ++i) {
        std::vector<double> fd(p[i].size());
        for (size_t j = 0; j < p[i].size(); ++j) {
          const double keep = p[i][j];
          p[i][j] = keep + h;
          const double up = ref_loss(p, act, batch);
          p[i][j] = keep - h;
          const double down = ref_loss(p, act, batch);
          p[i][j] = keep;
          fd[j] = (up - down) / (2 * h);
        }
        const double floor = 1e-6 * max_abs(fd);
        for (size_t j = 0; j < fd.size(); ++j) {
          INFO(act << " " << s.info[i].name << "[" << j << "]: got " << s.grad[i][j]
                   << ", finite difference " << fd[j]);
          CHECK(std::fabs(s.grad[i][j] - fd[j]) <= 1e-5 * std::fabs(fd[j]) + floor);
        }
      }

      // A few entries against finite differences of the plugin's own float32
      // forward: the two largest-|grad| entries of each tensor. h = 1e-2
      // balances float32 noise in the loss (~1e-7 / h) against truncation
      // (~h^2); 1e-2 relative leaves a wide margin for both.
      const std::vector<std::vector<float>> grads = s.grad;
      for (size_t i = 0; i < s.value.size(); ++i) {
        std::vector<size_t> order(grads[i].size());
        for (size_t j = 0; j < order.size(); ++j) order[j] = j;
        std::partial_sort(order.begin(), order.begin() + 2, order.end(), [&](size_t a, size_t b) {
          return std::fabs(grads[i][a]) > std::fabs(grads[i][b]);
        });
        for (size_t q = 0; q < 2; ++q) {
          const size_t j = order[q];
          const float keep = s.value[i][j];
          const float hf = 1e-2f;
          s.value[i][j] = keep + hf;
          const double up = eval_loss(m, s, batch);
          s.value[i][j] = keep - hf;
          const double down = eval_loss(m, s, batch);
          s.value[i][j] = keep;
          const double fd = (up - down) / (2.0 * hf);
          INFO(act << " float32 " << s.info[i].name << "[" << j << "]: got " << grads[i][j]
                   << ", finite difference " << fd);
          CHECK(std::fabs(grads[i][j] - fd) <= 1e-2 * std::fabs(fd) + 1e-5);
        }
      }
    }
  }
}

TEST_CASE("mlp refuses bad configs and datasets with clear messages", "[mlp]") {
  Fixture f;
  const tsr_data_info data = data_info(kIn, kClasses);

  SECTION("hidden = [0] is refused by the declared minimum") {
    CHECK_THROWS_WITH(f.config("model", "mlp", "hidden = [0]"),
                      Catch::Contains("hidden") && Catch::Contains(">= 1"));
  }
  SECTION("an unknown activation is refused with the choices") {
    CHECK_THROWS_WITH(f.config("model", "mlp", "activation = \"sigmoid\""),
                      Catch::Contains("relu|gelu|tanh"));
  }
  SECTION("the plugin checks hidden itself when handed an unvalidated config") {
    toml::table values;
    values.insert("hidden", toml::array{16, 0});
    values.insert("activation", "relu");
    values.insert("init", "torch");
    values.insert("init_std", 0.02);
    tsr_config *cfg = f.host.make_config("model", "mlp", std::move(values));
    Model m(f);
    CHECK(m.create(cfg, data, 4) == TSR_ERR_CONFIG);
    CHECK(m.self == nullptr);
    CHECK_THAT(f.host.last_error(), Catch::Contains("hidden[1] = 0"));
  }
  SECTION("a dataset with 1 class") {
    Model m(f);
    CHECK(m.create(f.config("model", "mlp"), data_info(kIn, 1), 4) == TSR_ERR_CONFIG);
    CHECK(m.self == nullptr);
    CHECK_THAT(f.host.last_error(), Catch::Contains("1 classes") && Catch::Contains("at least 2"));
  }
  SECTION("float64 inputs") {
    tsr_data_info d = data;
    d.input_dtype = DLDataType{kDLFloat, 64, 1};
    Model m(f);
    CHECK(m.create(f.config("model", "mlp"), d, 4) == TSR_ERR_UNSUPPORTED);
    CHECK_THAT(f.host.last_error(), Catch::Contains("float64") && Catch::Contains("float32"));
  }
  SECTION("targets that are not one int32 per sample") {
    tsr_data_info d = data;
    d.target_ndim = 1;
    d.target_shape[0] = 3;
    Model m(f);
    CHECK(m.create(f.config("model", "mlp"), d, 4) == TSR_ERR_UNSUPPORTED);
    CHECK_THAT(f.host.last_error(), Catch::Contains("int32 class label"));
    d.target_ndim = 0;
    d.target_dtype = DLDataType{kDLInt, 64, 1};
    CHECK(m.create(f.config("model", "mlp"), d, 4) == TSR_ERR_UNSUPPORTED);
    CHECK_THAT(f.host.last_error(), Catch::Contains("int64"));
  }
  SECTION("misuse at run time: backward without a training forward, oversized batch") {
    Model m(f);
    REQUIRE(m.create(f.config("model", "mlp", "hidden = [16, 12]"), data, 4) == TSR_OK);
    State s(m);
    s.load_reference_params();
    Batch batch = reference_batch();  // 8 samples > max_micro_batch 4
    tsr_step *step = f.host.step_handle(&s.hooks);
    tsr_forward_result r = fresh_result();
    CHECK(m.vt->forward(m.self, step, batch.get(), 1, &r) == TSR_ERR_INVALID);
    CHECK_THAT(f.host.last_error(), Catch::Contains("at most 4"));

    Batch small(std::vector<float>(batch.x.begin(), batch.x.begin() + 2 * kIn),
                std::vector<int32_t>(batch.y.begin(), batch.y.begin() + 2), kIn);
    REQUIRE(m.vt->forward(m.self, step, small.get(), 0, &r) == TSR_OK);
    CHECK(m.vt->backward(m.self, step, small.get(), 1.0f) == TSR_ERR_INVALID);
    CHECK_THAT(f.host.last_error(), Catch::Contains("training = 1"));
    for (const auto &g : s.grad)
      for (float e : g) CHECK(e == 0.0f);
  }
}

}  // namespace unit_test_mlp
