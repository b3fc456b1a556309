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
//
// This file checks the numbers against that reference: forward and
// backward, init_from through the engine's loader, log-probabilities and
// predict. The plugin's declaration and config keys (freeze, recompute,
// init_from's config.json, refusals) are in test_gpt2_config.cpp.
#include <tessera/tessera.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "gpt2_support.hpp"
#include "plugin/layout.hpp"
#include "support/fixture.hpp"
#include "support/safetensors_read.hpp"
#include "train/init_from.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_gpt2 {

using namespace tessera::test::gpt2_support;

namespace {

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

}  // namespace unit_test_gpt2
