// The gpt2 model plugin, loaded from the build tree the way a run loads it.
//
// Reference (not computed by the code under test): tests/data/gpt2_L2_C64/,
// a randomly initialised Hugging Face GPT2LMHeadModel (2 layers, 4 heads,
// width 64, context 32, vocab 96) saved by save_pretrained, and
// reference.safetensors with its float64 forward and backward on a batch of
// 3 x 32 tokens: logits, the mean cross-entropy of the logits against the
// targets (no shift) and the gradient of every parameter.
//
// The test owns parameters and gradients (float vectors) behind the step
// hooks, as the engine's zero plugins do, and loads the Hugging Face weights
// into them by name (what the engine's init_from does for a run). wte has
// 128 rows (96 rounded up to vocab_pad_to = 64): the padding rows get
// garbage, which must change nothing.
#include <tessera/tessera.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "host/host.hpp"
#include "support/fixture.hpp"
#include "support/safetensors_read.hpp"
#include "train/init_from.hpp"
#include "train/layout.hpp"

namespace {

using tessera::test::Fixture;
using tessera::test::RefTensor;

constexpr int64_t kLayers = 2, kHeads = 4, kWidth = 64, kContext = 32, kVocab = 96;
constexpr int64_t kPadded = 128, kBatch = 3, kT = 32;

const std::map<std::string, RefTensor> &golden(const std::string &file) {
  static std::map<std::string, std::map<std::string, RefTensor>> cache;
  auto it = cache.find(file);
  if (it == cache.end())
    it = cache
             .emplace(file, tessera::test::read_safetensors(
                                tessera::test::data_path("gpt2_L2_C64/" + file)))
             .first;
  return it->second;
}

const RefTensor &ref(const std::string &file, const std::string &name) {
  const auto &m = golden(file);
  auto it = m.find(name);
  if (it == m.end()) {
    FAIL(file << " has no tensor '" << name << "'");
    static const RefTensor none;
    return none;
  }
  return it->second;
}

tsr_data_info token_data(int64_t T, int64_t vocab = kVocab) {
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
std::string golden_config(const std::string &extra = "") {
  return "layers = 2\nheads = 4\nwidth = 64\ncontext = 32\nvocab = 96\n" + extra;
}

struct Model {
  Fixture &f;
  const tsr_model_vtable *vt;
  void *self = nullptr;
  explicit Model(Fixture &fx) : f(fx), vt(fx.vtable<tsr_model_vtable>("model", "gpt2")) {}
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

std::vector<int32_t> ids_of(const std::string &name) {
  const RefTensor &r = ref("reference.safetensors", name);
  REQUIRE(r.shape == std::vector<int64_t>{kBatch, kT});
  std::vector<int32_t> out;
  for (double v : r.data) out.push_back(static_cast<int32_t>(v));
  return out;
}

Batch reference_batch() {
  return Batch(ids_of("input_ids"), ids_of("targets"), kBatch, kT);
}

tsr_forward_result fresh_result() {
  tsr_forward_result r;
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  return r;
}

// forward(training = 1) + backward with loss_scale = 1/count: the gradient of
// the mean loss, as loss.backward() computes it.
tsr_forward_result train_step(Model &m, State &s, Batch &batch) {
  tsr_step *step = m.f.host.step_handle(&s.hooks);
  tsr_forward_result r = fresh_result();
  REQUIRE(m.vt->forward(m.self, step, batch.get(), 1, &r) == TSR_OK);
  REQUIRE(r.count > 0);
  REQUIRE(m.vt->backward(m.self, step, batch.get(), 1.0f / static_cast<float>(r.count)) == TSR_OK);
  return r;
}

// ||a - b|| / ||b||, over the first b.size() entries of a.
double rel_err(const std::vector<float> &a, const std::vector<double> &b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// log softmax of the reference logits of row (b, t), class c, in double.
double ref_log_prob(int64_t b, int64_t t, int64_t c) {
  const RefTensor &z = ref("reference.safetensors", "logits");
  const double *row = z.data.data() + (b * kT + t) * kVocab;
  const double mx = *std::max_element(row, row + kVocab);
  double sum = 0;
  for (int64_t k = 0; k < kVocab; ++k) sum += std::exp(row[k] - mx);
  return row[c] - mx - std::log(sum);
}

}  // namespace

TEST_CASE("gpt2 is a model plugin for CPU and CUDA", "[gpt2]") {
  Fixture f;
  const tsr_plugin_descriptor &d = f.desc("model", "gpt2");
  CHECK(std::string(d.kind) == TSR_KIND_MODEL);
  CHECK(d.devices == (TSR_DEVICE_CPU | TSR_DEVICE_CUDA));
  std::vector<std::string> keys;
  for (size_t i = 0; i < d.num_params; ++i) keys.push_back(d.params[i].name);
  CHECK(keys == std::vector<std::string>{"layers", "heads", "width", "context", "vocab",
                                         "vocab_pad_to", "init_from", "freeze", "recompute",
                                         "init_std"});
}

TEST_CASE("gpt2 declares Hugging Face's parameters, one group per block", "[gpt2]") {
  Fixture f;
  SECTION("the golden model's dimensions") {
    Model m(f);
    REQUIRE(m.create(f.config("model", "gpt2", golden_config()), token_data(kT), 2) == TSR_OK);
    const std::vector<tsr_param_info> p = m.infos();
    REQUIRE(p.size() == 2 + 12 * kLayers + 2);
    // Every parameter of the Hugging Face checkpoint, same shape (wte padded).
    const auto &hf = golden("model.safetensors");
    CHECK(hf.size() == p.size());
    int64_t total = 0;
    for (const tsr_param_info &q : p) {
      INFO(q.name);
      auto it = hf.find(q.name);
      REQUIRE(it != hf.end());
      std::vector<int64_t> shape(q.shape, q.shape + q.ndim);
      if (std::string(q.name) == "transformer.wte.weight") {
        CHECK(shape == std::vector<int64_t>{kPadded, kWidth});
      } else {
        CHECK(shape == it->second.shape);
      }
      CHECK(q.trainable == 1);
      CHECK(q.decay == (q.ndim >= 2 ? 1 : 0));
      int64_t n = 1;
      for (int64_t e : shape) n *= e;
      total += n;
    }
    CHECK(std::string(p[0].name) == "transformer.wte.weight");
    CHECK(std::string(p[1].name) == "transformer.wpe.weight");
    CHECK(std::string(p[2].name) == "transformer.h.0.ln_1.weight");
    CHECK(std::string(p.back().name) == "transformer.ln_f.bias");
    for (size_t i = 0; i < p.size(); ++i) {
      const uint32_t want = i < 2 ? 0 : i < 2 + 12 * kLayers ? 1 + (i - 2) / 12 : kLayers + 1;
      CHECK(p[i].group == want);
    }
    // Initialisers: N(0, 0.02), c_proj N(0, 0.02 / sqrt(2 L)), biases 0, LN weights 1.
    const double proj = 0.02 / std::sqrt(2.0 * kLayers);
    for (const tsr_param_info &q : p) {
      INFO(q.name);
      const std::string n = q.name;
      const bool bias = n.size() > 5 && n.substr(n.size() - 5) == ".bias";
      if (n.find("ln_") != std::string::npos && !bias) {
        CHECK(q.init == TSR_INIT_ONES);
      } else if (bias) {
        CHECK(q.init == TSR_INIT_ZEROS);
      } else {
        CHECK(q.init == TSR_INIT_NORMAL);
        CHECK(q.init_a == 0.0f);
        CHECK(q.init_b == Approx(n.find("c_proj") != std::string::npos ? proj : 0.02));
      }
    }
    // 6 N T + 6 L C T^2 per sample of T tokens, N = every declared parameter.
    CHECK(m.vt->flops_per_sample(m.self) ==
          Approx(6.0 * total * kT + 6.0 * kLayers * kWidth * kT * kT));
  }

  SECTION("defaults: GPT-2 small, 50257 tokens padded to 50304") {
    Model m(f);
    REQUIRE(m.create(f.config("model", "gpt2", "recompute = true"), token_data(64, 50257), 1) ==
            TSR_OK);
    const std::vector<tsr_param_info> p = m.infos();
    REQUIRE(p.size() == 2 + 12 * 12 + 2);
    CHECK(p[0].shape[0] == 50304);
    CHECK(p[0].shape[1] == 768);
    CHECK(p[1].shape[0] == 1024);
    int64_t total = 0;
    for (const tsr_param_info &q : p) {
      int64_t n = 1;
      for (int32_t k = 0; k < q.ndim; ++k) n *= q.shape[k];
      total += n;
    }
    // GPT-2 small: 124,439,808 with the 50257-row wte; 47 padding rows more.
    CHECK(total == 124439808 + 47 * 768);
  }

  SECTION("vocab_pad_to = 1 keeps the vocabulary as it is") {
    Model m(f);
    REQUIRE(m.create(f.config("model", "gpt2", golden_config("vocab_pad_to = 1")), token_data(kT),
                     2) == TSR_OK);
    CHECK(m.infos()[0].shape[0] == kVocab);
  }
}

TEST_CASE("gpt2 forward and backward match Hugging Face", "[gpt2]") {
  Fixture f;
  Model m(f);
  // max_micro_batch 4 > 3: the batch fills only part of the activations.
  REQUIRE(m.create(f.config("model", "gpt2", golden_config()), token_data(kT), 4) == TSR_OK);
  State s(m);
  s.load_hf();
  Batch batch = reference_batch();
  const tsr_forward_result r = train_step(m, s, batch);

  // The loss: within 1e-5 relative of float64 Hugging Face.
  const double want = ref("reference.safetensors", "loss").data.at(0);
  CHECK(r.count == kBatch * kT);
  const double got = r.loss_sum / static_cast<double>(r.count);
  CHECK(std::fabs(got - want) <= 1e-5 * std::fabs(want));

  // Every gradient within 1e-4 relative (norm-based); wte's padding rows get
  // none.
  for (size_t i = 0; i < s.info.size(); ++i) {
    const std::string name = s.info[i].name;
    const RefTensor &g = ref("reference.safetensors", "grad." + name);
    INFO(name << ": relative error " << rel_err(s.grad[i], g.data));
    CHECK(rel_err(s.grad[i], g.data) <= 1e-4);
    for (size_t j = g.data.size(); j < s.grad[i].size(); ++j) REQUIRE(s.grad[i][j] == 0.0f);
  }

  SECTION("groups: params_done after use (wte's group after the LM head), grads_done last first") {
    CHECK(s.params_released == std::vector<uint32_t>{1, 2, 3, 0});
    CHECK(s.done == std::vector<uint32_t>{3, 2, 1, 0});
    for (uint32_t g = 0; g < 4; ++g) {
      const auto &snap = s.grads_at_done.at(g);
      size_t k = 0;
      for (size_t i = 0; i < s.info.size(); ++i)
        if (s.info[i].group == g) CHECK(snap.at(k++) == s.grad[i]);
    }
  }

  SECTION("gradients accumulate over micro-batches") {
    const std::vector<std::vector<float>> once = s.grad;
    train_step(m, s, batch);
    for (size_t i = 0; i < s.grad.size(); ++i)
      for (size_t j = 0; j < s.grad[i].size(); ++j)
        REQUIRE(s.grad[i][j] == Approx(2.0 * once[i][j]).epsilon(1e-5).margin(1e-9));
  }

  SECTION("targets < 0 are ignored") {
    Batch masked = reference_batch();
    for (size_t j = 0; j < masked.y.size(); j += 2) masked.y[j] = -1;
    tsr_forward_result r2 = fresh_result();
    REQUIRE(m.vt->forward(m.self, f.host.step_handle(&s.hooks), masked.get(), 0, &r2) == TSR_OK);
    CHECK(r2.count == kBatch * kT / 2);
    double sum = 0;
    for (int64_t b = 0; b < kBatch; ++b)
      for (int64_t t = 1; t < kT; t += 2) sum -= ref_log_prob(b, t, masked.y[b * kT + t]);
    CHECK(std::fabs(r2.loss_sum - sum) <= 1e-5 * sum);
  }
}

TEST_CASE("gpt2 init_from through the engine's loader starts from Hugging Face's weights",
          "[gpt2]") {
  // What a run with [model] init_from does: the declared initialisers, then
  // the checkpoint's tensors by name over them (wte's padding rows keep
  // their initialiser's values).
  Fixture f;
  Model m(f);
  const std::string dir = tessera::test::data_path("gpt2_L2_C64");
  REQUIRE(m.create(f.config("model", "gpt2", "init_from = \"" + dir + "\""), token_data(kT),
                   kBatch) == TSR_OK);
  const tessera::Layout layout = tessera::make_layout(m.vt, m.self, 1, "gpt2");
  std::vector<float> init(layout.total), flat(layout.total);
  tessera::init_params(layout, init.data(), 1234);
  flat = init;
  tessera::init_from_safetensors(dir, layout, flat.data());

  State s(m);
  REQUIRE(layout.params.size() == s.info.size());
  for (size_t i = 0; i < s.info.size(); ++i) {
    const tessera::ParamSlot &p = layout.params[i];
    REQUIRE(p.name == s.info[i].name);
    std::copy(flat.begin() + static_cast<ptrdiff_t>(p.offset),
              flat.begin() + static_cast<ptrdiff_t>(p.offset + p.numel), s.value[i].begin());
    const RefTensor &hf = ref("model.safetensors", p.name);
    INFO(p.name);
    for (size_t j = 0; j < hf.data.size(); ++j)
      REQUIRE(s.value[i][j] == static_cast<float>(hf.data[j]));
    for (size_t j = hf.data.size(); j < p.numel; ++j)  // wte's padding rows
      REQUIRE(s.value[i][j] == init[p.offset + j]);
  }

  Batch batch = reference_batch();
  const tsr_forward_result r = train_step(m, s, batch);
  const double want = ref("reference.safetensors", "loss").data.at(0);
  CHECK(std::fabs(r.loss_sum / static_cast<double>(r.count) - want) <= 1e-5 * want);
  for (size_t i = 0; i < s.info.size(); ++i) {
    const RefTensor &g = ref("reference.safetensors", std::string("grad.") + s.info[i].name);
    INFO(s.info[i].name);
    CHECK(rel_err(s.grad[i], g.data) <= 1e-4);
  }
}

TEST_CASE("gpt2 log-probabilities match Hugging Face's logits, any T <= context", "[gpt2]") {
  // The model reports only the loss; a target at one position (the others
  // ignored) reads out that row's log-softmax entry: log p(c) = logit_c -
  // logsumexp(logits). A prefix of T = t + 1 tokens gives row t exactly, the
  // attention being causal, so this also checks every shorter T.
  Fixture f;
  Model m(f);
  REQUIRE(m.create(f.config("model", "gpt2", golden_config()), token_data(kT), 1) == TSR_OK);
  State s(m);
  s.load_hf();
  const std::vector<int32_t> ids = ids_of("input_ids"), tg = ids_of("targets");
  tsr_step *step = f.host.step_handle(&s.hooks);
  double worst = 0;
  auto probe = [&](int64_t b, int64_t t, int32_t c) {
    std::vector<int32_t> x(ids.begin() + b * kT, ids.begin() + b * kT + t + 1);
    std::vector<int32_t> y(static_cast<size_t>(t + 1), -1);
    y[static_cast<size_t>(t)] = c;
    Batch one(x, y, 1, t + 1);
    tsr_forward_result r = fresh_result();
    REQUIRE(m.vt->forward(m.self, step, one.get(), 0, &r) == TSR_OK);
    REQUIRE(r.count == 1);
    const double want = ref_log_prob(b, t, c);
    const double err = std::fabs(-r.loss_sum - want) / std::fabs(want);
    worst = std::max(worst, err);
    INFO("row (" << b << ", " << t << ") class " << c << ": got " << -r.loss_sum
                 << ", Hugging Face " << want);
    CHECK(err <= 1e-5);
  };
  // Every class of the first, second, a middle and the last position.
  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t t : {int64_t{0}, int64_t{1}, int64_t{17}, kT - 1})
      for (int32_t c = 0; c < kVocab; ++c) probe(b, t, c);
  // The target class of every row.
  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t t = 0; t < kT; ++t) probe(b, t, tg[static_cast<size_t>(b * kT + t)]);
  INFO("worst relative error " << worst);
  CHECK(worst <= 1e-5);
}

TEST_CASE("gpt2 predict gives Hugging Face's logits of the last position", "[gpt2]") {
  // Shorter prompts than the model was built for (T' < T), no targets: the
  // logits of position T' - 1 over the real vocabulary, as float32.
  Fixture f;
  Model m(f);
  REQUIRE(m.create(f.config("model", "gpt2", golden_config()), token_data(kT), kBatch) == TSR_OK);
  REQUIRE(TSR_HAS_FIELD(m.vt, tsr_model_vtable, predict));
  REQUIRE(m.vt->predict != nullptr);
  State s(m);
  s.load_hf();
  tsr_step *step = f.host.step_handle(&s.hooks);

  // The size query: classes without computing anything.
  int64_t qshape[2] = {1, 0};
  DLTensor q{nullptr, DLDevice{kDLCPU, 0}, 2, DLDataType{kDLFloat, 32, 1}, qshape, nullptr, 0};
  REQUIRE(m.vt->predict(m.self, step, nullptr, &q) == TSR_OK);
  CHECK(qshape[1] == kVocab);

  const std::vector<int32_t> ids = ids_of("input_ids");
  const RefTensor &z = ref("reference.safetensors", "logits");
  for (int64_t T : {int64_t{1}, int64_t{20}, kT}) {
    INFO("T' = " << T);
    std::vector<int32_t> x;
    for (int64_t b = 0; b < kBatch; ++b)
      x.insert(x.end(), ids.begin() + b * kT, ids.begin() + b * kT + T);
    Batch batch(x, {}, kBatch, T);
    tsr_batch *bp = const_cast<tsr_batch *>(batch.get());
    bp->targets = DLTensor{};  // absent
    std::vector<float> out(static_cast<size_t>(kBatch * kVocab), 0.0f);
    int64_t oshape[2] = {kBatch, kVocab};
    DLTensor logits{
        out.data(), DLDevice{kDLCPU, 0}, 2, DLDataType{kDLFloat, 32, 1}, oshape, nullptr, 0};
    s.params_released.clear();
    INFO(f.host.last_error());
    REQUIRE(m.vt->predict(m.self, step, bp, &logits) == TSR_OK);
    std::vector<double> want;
    for (int64_t b = 0; b < kBatch; ++b)
      want.insert(want.end(), z.data.begin() + (b * kT + T - 1) * kVocab,
                  z.data.begin() + (b * kT + T) * kVocab);
    CHECK(rel_err(out, want) <= 1e-5);
    // Every group released, wte's (0) after the head, last.
    REQUIRE(!s.params_released.empty());
    CHECK(s.params_released.back() == 0);
    CHECK(s.params_released.size() == static_cast<size_t>(kLayers + 2));
  }
  // Nothing kept for backward.
  Batch full = reference_batch();
  CHECK(m.vt->backward(m.self, step, full.get(), 1.0f) == TSR_ERR_INVALID);
  // Wrong logits: shape, dtype.
  std::vector<float> out(static_cast<size_t>(kBatch * kPadded), 0.0f);
  int64_t padded[2] = {kBatch, kPadded};
  DLTensor wide{out.data(), DLDevice{kDLCPU, 0}, 2, DLDataType{kDLFloat, 32, 1}, padded, nullptr,
                0};
  CHECK(m.vt->predict(m.self, step, full.get(), &wide) == TSR_ERR_INVALID);
  CHECK_THAT(f.host.last_error(), Catch::Contains("[3, 96]"));
  int64_t right[2] = {kBatch, kVocab};
  DLTensor f64{out.data(), DLDevice{kDLCPU, 0}, 2, DLDataType{kDLFloat, 64, 1}, right, nullptr, 0};
  CHECK(m.vt->predict(m.self, step, full.get(), &f64) == TSR_ERR_INVALID);
  CHECK_THAT(f.host.last_error(), Catch::Contains("float32"));
}

TEST_CASE("gpt2 recompute gives bitwise the same gradients", "[gpt2]") {
  Fixture f;
  std::vector<std::vector<float>> grads[2];
  double losses[2] = {0, 0};
  for (int rc = 0; rc < 2; ++rc) {
    Model m(f);
    REQUIRE(m.create(f.config("model", "gpt2",
                              golden_config(rc ? "recompute = true" : "recompute = false")),
                     token_data(kT), kBatch) == TSR_OK);
    State s(m);
    s.load_hf();
    Batch batch = reference_batch();
    losses[rc] = train_step(m, s, batch).loss_sum;
    CHECK(s.done == std::vector<uint32_t>{3, 2, 1, 0});
    grads[rc] = s.grad;
  }
  CHECK(losses[0] == losses[1]);
  REQUIRE(grads[0].size() == grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) {
    INFO("parameter " << i);
    CHECK(std::memcmp(grads[0][i].data(), grads[1][i].data(), grads[0][i].size() * 4) == 0);
  }
}

TEST_CASE("gpt2 freeze: frozen parameters get no gradient", "[gpt2]") {
  Fixture f;
  // The unfrozen run's gradients.
  std::vector<std::vector<float>> full;
  {
    Model m(f);
    REQUIRE(m.create(f.config("model", "gpt2", golden_config()), token_data(kT), kBatch) == TSR_OK);
    State s(m);
    s.load_hf();
    Batch batch = reference_batch();
    train_step(m, s, batch);
    full = s.grad;
  }

  auto starts = [](const std::string &n, const char *prefix) { return n.rfind(prefix, 0) == 0; };
  struct Case {
    const char *freeze;
    std::function<bool(const std::string &)> frozen;  // which names it freezes
  };
  const Case cases[] = {
      {R"(["transformer.wte.weight", "transformer.h.1.attn.*"])",
       [&](const std::string &n) {
         return n == "transformer.wte.weight" || starts(n, "transformer.h.1.attn.");
       }},
      // Everything below block 1: backward stops there.
      {R"(["transformer.w?e.weight", "transformer.h.0.*"])",
       [&](const std::string &n) {
         return n == "transformer.wte.weight" || n == "transformer.wpe.weight" ||
                starts(n, "transformer.h.0.");
       }},
      {R"(["*ln_*"])", [](const std::string &n) { return n.find(".ln_") != std::string::npos; }},
      {R"(["*"])", [](const std::string &) { return true; }},
  };
  for (const Case &c : cases) {
    DYNAMIC_SECTION("freeze = " << c.freeze) {
      Model m(f);
      REQUIRE(
          m.create(f.config("model", "gpt2", golden_config(std::string("freeze = ") + c.freeze)),
                   token_data(kT), kBatch) == TSR_OK);
      State s(m);
      s.load_hf();
      Batch batch = reference_batch();
      train_step(m, s, batch);
      CHECK(s.done == std::vector<uint32_t>{3, 2, 1, 0});
      for (size_t i = 0; i < s.info.size(); ++i) {
        const std::string name = s.info[i].name;
        INFO(name);
        const bool frozen = c.frozen(name);
        CHECK(s.info[i].trainable == (frozen ? 0 : 1));
        if (frozen) {
          CHECK(s.grads_asked.count(static_cast<uint32_t>(i)) == 0);
          CHECK(std::all_of(s.grad[i].begin(), s.grad[i].end(), [](float e) { return e == 0; }));
        } else {
          // Freezing others changes nothing about a trainable gradient.
          CHECK(std::memcmp(s.grad[i].data(), full[i].data(), full[i].size() * 4) == 0);
        }
      }
    }
  }

  SECTION("a pattern that matches nothing is an error") {
    Model m(f);
    CHECK(m.create(f.config("model", "gpt2", golden_config("freeze = [\"h.0.*\"]")), token_data(kT),
                   2) == TSR_ERR_CONFIG);
    CHECK_THAT(f.host.last_error(), Catch::Contains("'h.0.*' matches no parameter"));
  }
}

TEST_CASE("gpt2 init_from: config.json sets the dimensions", "[gpt2]") {
  Fixture f;
  const std::string dir = tessera::test::data_path("gpt2_L2_C64");
  SECTION("unset keys come from config.json") {
    Model m(f);
    REQUIRE(m.create(f.config("model", "gpt2", "init_from = \"" + dir + "\""), token_data(kT), 2) ==
            TSR_OK);
    const std::vector<tsr_param_info> p = m.infos();
    REQUIRE(p.size() == 2 + 12 * kLayers + 2);
    CHECK(p[0].shape[0] == kPadded);
    CHECK(p[0].shape[1] == kWidth);
    CHECK(p[1].shape[0] == kContext);
  }
  SECTION("explicit keys that agree are fine") {
    Model m(f);
    CHECK(m.create(f.config("model", "gpt2", golden_config("init_from = \"" + dir + "\"")),
                   token_data(kT), 2) == TSR_OK);
  }
  SECTION("an explicit key that disagrees names both values") {
    Model m(f);
    CHECK(m.create(f.config("model", "gpt2", "layers = 3\ninit_from = \"" + dir + "\""),
                   token_data(kT), 2) == TSR_ERR_CONFIG);
    CHECK_THAT(f.host.last_error(),
               Catch::Contains("model.layers = 3") && Catch::Contains("n_layer = 2"));
  }
  SECTION("a directory without a checkpoint") {
    Model m(f);
    CHECK(m.create(f.config("model", "gpt2", "init_from = \"" + dir + "/nope\""), token_data(kT),
                   2) == TSR_ERR_IO);
    CHECK_THAT(f.host.last_error(), Catch::Contains("model.safetensors"));
  }
}

TEST_CASE("gpt2 refuses bad configs, datasets and batches with clear messages", "[gpt2]") {
  Fixture f;
  SECTION("width not a multiple of heads") {
    Model m(f);
    CHECK(m.create(f.config("model", "gpt2",
                            "layers = 1\nheads = 3\nwidth = 64\ncontext = 8\n"
                            "vocab = 10"),
                   token_data(8, 10), 1) == TSR_ERR_CONFIG);
    CHECK_THAT(f.host.last_error(), Catch::Contains("multiple of heads"));
  }
  SECTION("windows longer than the context") {
    Model m(f);
    CHECK(m.create(f.config("model", "gpt2", golden_config()), token_data(kContext + 1), 1) ==
          TSR_ERR_CONFIG);
    CHECK_THAT(f.host.last_error(), Catch::Contains("33 tokens") && Catch::Contains("32"));
  }
  SECTION("float inputs (an image dataset)") {
    tsr_data_info d = token_data(kT);
    d.input_dtype = DLDataType{kDLFloat, 32, 1};
    Model m(f);
    CHECK(m.create(f.config("model", "gpt2", golden_config()), d, 1) == TSR_ERR_UNSUPPORTED);
    CHECK_THAT(f.host.last_error(), Catch::Contains("int32 token ids"));
  }
  SECTION("run-time misuse") {
    Model m(f);
    REQUIRE(m.create(f.config("model", "gpt2", golden_config()), token_data(kT), 2) == TSR_OK);
    State s(m);
    s.load_hf();
    Batch batch = reference_batch();  // 3 sequences > max_micro_batch 2
    tsr_step *step = f.host.step_handle(&s.hooks);
    tsr_forward_result r = fresh_result();
    CHECK(m.vt->forward(m.self, step, batch.get(), 1, &r) == TSR_ERR_INVALID);
    CHECK_THAT(f.host.last_error(), Catch::Contains("at most 2"));
    Batch two(std::vector<int32_t>(batch.x.begin(), batch.x.begin() + 2 * kT),
              std::vector<int32_t>(batch.y.begin(), batch.y.begin() + 2 * kT), 2, kT);
    REQUIRE(m.vt->forward(m.self, step, two.get(), 0, &r) == TSR_OK);
    CHECK(m.vt->backward(m.self, step, two.get(), 1.0f) == TSR_ERR_INVALID);
    CHECK_THAT(f.host.last_error(), Catch::Contains("training = 1"));
    for (const auto &g : s.grad)
      for (float e : g) REQUIRE(e == 0.0f);
  }
}
