// LoRA in the llama plugin (lora.* keys), on the CPU in fp32, against
// references computed here from the golden models' weights
// (tests/data/llama3_L2_C64, qwen2_L2_C64) and adapters A, B drawn by the
// test (B nonzero, as after training):
//
// - forward: the LoRA model's loss and logits equal those of the plain
//   model (lora.rank = 0) whose adapted weights are W + (alpha/rank) B A,
//   merged here in double;
// - backward: with G the plain model's gradient of a merged weight (its
//   gradient is held to transformers' by test_llama.cpp), the chain rule
//   gives dA = s B^T G and dB = s G A^T; the LoRA model's adapter
//   gradients must equal those, and it asks for no gradient of a frozen
//   base parameter;
// - with recompute, and on Qwen2 (q/k/v biases, tied head) with only some
//   targets;
// - the declarations (names, shapes, groups, PEFT's initialisers), both TOML
//   forms of the dotted keys, and the refusals naming the key.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "gpt2_support.hpp"
#include "llama_support.hpp"
#include "plugin/layout.hpp"
#include "support/fixture.hpp"
#include "support/safetensors_read.hpp"
#include "train/init_from.hpp"

namespace unit_test_llama_lora {

using tessera::test::Fixture;
using tessera::test::RefTensor;
using tessera::test::gpt2_support::Batch;
using tessera::test::gpt2_support::fresh_result;
using tessera::test::gpt2_support::Model;
using tessera::test::gpt2_support::State;
using tessera::test::gpt2_support::token_data;
using tessera::test::gpt2_support::train_step;
using tessera::test::llama_support::Golden;
using tessera::test::llama_support::prefix_logits;
using tessera::test::llama_support::rel_err;

namespace {

const char *const kAll =
    "lora.targets = [\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\"]\n";

bool is_adapter(const std::string &name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

// The adapted weight's name of an adapter: q_proj.lora_A.weight -> q_proj.weight.
std::string base_of(const std::string &adapter) {
  const size_t at = adapter.find(".lora_");
  return adapter.substr(0, at) + ".weight";
}

// The LoRA model's values: the golden weights, and adapters of a fixed
// pseudo-random draw (B too: zero B would make the adapters invisible).
void load_lora(State &s, const Golden &g) {
  for (size_t i = 0; i < s.info.size(); ++i) {
    const std::string name = s.info[i].name;
    if (is_adapter(name)) {
      const double amp = name.find("lora_A") != std::string::npos ? 0.3 : 0.05;
      for (size_t j = 0; j < s.value[i].size(); ++j)
        s.value[i][j] = static_cast<float>(amp * std::sin(0.7 * static_cast<double>(j) + i));
      continue;
    }
    const RefTensor &r = g.weights.at(name);
    REQUIRE(r.shape == s.shape[i]);
    for (size_t j = 0; j < r.data.size(); ++j) s.value[i][j] = static_cast<float>(r.data[j]);
  }
}

// The plain model's values: the LoRA model's with W + scale B A (double).
void load_merged(State &plain, const State &lora, double scale) {
  for (size_t i = 0; i < plain.info.size(); ++i) {
    const std::string name = plain.info[i].name;
    const std::vector<float> &w = lora.value[lora.index(name)];
    std::vector<double> m(w.begin(), w.end());
    const std::string pre = name.substr(0, name.size() - std::string(".weight").size());
    for (size_t k = 0; k < lora.info.size(); ++k) {
      if (std::string(lora.info[k].name) != pre + ".lora_A.weight") continue;
      const std::vector<float> &a = lora.value[k],
                               &b = lora.value[lora.index(pre + ".lora_B.weight")];
      const int64_t r = lora.shape[k][0], in = lora.shape[k][1], out = plain.shape[i][0];
      for (int64_t o = 0; o < out; ++o)
        for (int64_t c = 0; c < in; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < r; ++j) acc += static_cast<double>(b[o * r + j]) * a[j * in + c];
          m[o * in + c] += scale * acc;
        }
    }
    for (size_t j = 0; j < m.size(); ++j) plain.value[i][j] = static_cast<float>(m[j]);
  }
}

// The LoRA model (`lora_keys`) against the plain one with merged weights.
void check_against_merged(const Golden &g, const std::string &lora_keys, double scale) {
  Fixture f;
  Model lora(f, "llama"), plain(f, "llama");
  const std::string base = "hf_config = \"" + g.dir + "/config.json\"\n";
  INFO(lora_keys);
  REQUIRE(lora.create(f.config("model", "llama", base + lora_keys), token_data(g.T, g.V), g.B) ==
          TSR_OK);
  REQUIRE(plain.create(f.config("model", "llama", base), token_data(g.T, g.V), g.B) == TSR_OK);
  State sl(lora), sp(plain);
  load_lora(sl, g);
  load_merged(sp, sl, scale);
  Batch b1 = g.batch(), b2 = g.batch();
  const tsr_forward_result rl = train_step(lora, sl, b1), rp = train_step(plain, sp, b2);
  REQUIRE(rl.count == rp.count);
  INFO("loss " << rl.loss_sum / rl.count << ", merged " << rp.loss_sum / rp.count);
  CHECK(std::fabs(rl.loss_sum - rp.loss_sum) <= 1e-6 * std::fabs(rp.loss_sum));
  size_t adapters = 0;
  for (size_t i = 0; i < sl.info.size(); ++i) {
    const std::string name = sl.info[i].name;
    INFO(name);
    if (!is_adapter(name)) {
      CHECK(sl.info[i].trainable == 0);
      CHECK(sl.grads_asked.count(static_cast<uint32_t>(i)) == 0);
      continue;
    }
    ++adapters;
    CHECK(sl.info[i].trainable == 1);
    // G: the plain model's gradient of the merged weight, [out, in].
    const std::string w = base_of(name);
    const std::vector<float> &G = sp.grad[sp.index(w)];
    const std::string pre = w.substr(0, w.size() - std::string(".weight").size());
    const size_t ia = sl.index(pre + ".lora_A.weight"), ib = sl.index(pre + ".lora_B.weight");
    const int64_t r = sl.shape[ia][0], in = sl.shape[ia][1], out = sl.shape[ib][0];
    std::vector<double> want;
    if (i == ia) {  // s B^T G: [r, in]
      want.assign(static_cast<size_t>(r * in), 0.0);
      for (int64_t j = 0; j < r; ++j)
        for (int64_t o = 0; o < out; ++o)
          for (int64_t c = 0; c < in; ++c)
            want[j * in + c] += scale * sl.value[ib][o * r + j] * G[o * in + c];
    } else {  // s G A^T: [out, r]
      want.assign(static_cast<size_t>(out * r), 0.0);
      for (int64_t o = 0; o < out; ++o)
        for (int64_t j = 0; j < r; ++j)
          for (int64_t c = 0; c < in; ++c)
            want[o * r + j] += scale * G[o * in + c] * sl.value[ia][j * in + c];
    }
    const double e = rel_err(sl.grad[i], want);
    INFO("relative error " << e);
    CHECK(e <= 1e-4);
  }
  CHECK(adapters > 0);
  CHECK(sl.done == std::vector<uint32_t>{3, 2, 1, 0});
  for (int64_t t : {int64_t{0}, g.T / 2, g.T - 1}) {
    const std::vector<float> zl = prefix_logits(lora, sl, g, t),
                             zp = prefix_logits(plain, sp, g, t);
    for (int64_t b = 0; b < g.B; ++b) {
      const std::vector<float> a(zl.begin() + b * g.V, zl.begin() + (b + 1) * g.V);
      const std::vector<double> want(zp.begin() + b * g.V, zp.begin() + (b + 1) * g.V);
      INFO("prefix " << t + 1 << ", row " << b);
      CHECK(rel_err(a, want) <= 1e-5);
    }
  }
}

}  // namespace

TEST_CASE("llama LoRA equals the merged model, adapter gradients by the chain rule",
          "[llama][lora]") {
  const Golden g("llama3_L2_C64");
  check_against_merged(g, std::string("lora.rank = 3\nlora.alpha = 6.0\n") + kAll, 2.0);
  check_against_merged(g, std::string("lora.rank = 4\nlora.alpha = 2.0\nrecompute = true\n") + kAll,
                       0.5);
  // One SwiGLU output for both layers: the down adapter's dA reads layer
  // 0's again.
  check_against_merged(
      g, std::string("lora.rank = 3\nlora.alpha = 6.0\nrecompute_swiglu = \"always\"\n") + kAll,
      2.0);
}

TEST_CASE("llama LoRA on Qwen2 (q/k/v biases, tied head) with some targets", "[llama][lora]") {
  const Golden g("qwen2_L2_C64");
  check_against_merged(g, "lora.rank = 2\nlora.targets = [\"q\", \"v\", \"down\"]\n", 4.0);
}

TEST_CASE("llama LoRA declares PEFT's adapters in the layer's group, the base frozen",
          "[llama][lora]") {
  const Golden g("llama3_L2_C64");
  // The dotted keys as a sub-table (lora.rank = ...) and quoted, as a run's
  // config.toml writes them back: the same model.
  for (const char *keys : {"lora.rank = 8\nlora.targets = [\"k\", \"gate\"]\n",
                           "\"lora.rank\" = 8\n\"lora.targets\" = [\"k\", \"gate\"]\n"}) {
    INFO(keys);
    Fixture f;
    Model m(f, "llama");
    REQUIRE(
        m.create(f.config("model", "llama", "hf_config = \"" + g.dir + "/config.json\"\n" + keys),
                 token_data(g.T, g.V), 1) == TSR_OK);
    const std::vector<tsr_param_info> infos = m.infos();
    std::map<std::string, tsr_param_info> by;
    for (const auto &p : infos) by[p.name] = p;
    REQUIRE(infos.size() == g.weights.size() + 2 * 2 * 2);  // 2 layers, 2 targets, A and B
    const tsr_param_info &a = by.at("model.layers.1.self_attn.k_proj.lora_A.weight");
    const tsr_param_info &b = by.at("model.layers.1.self_attn.k_proj.lora_B.weight");
    const tsr_param_info &k = by.at("model.layers.1.self_attn.k_proj.weight");
    CHECK(a.ndim == 2);
    CHECK(a.shape[0] == 8);
    CHECK(a.shape[1] == k.shape[1]);
    CHECK(b.shape[0] == k.shape[0]);
    CHECK(b.shape[1] == 8);
    CHECK(a.group == k.group);
    CHECK(b.group == k.group);
    // kaiming_uniform_(a = sqrt(5)) over fan_in = in: uniform in +-1/sqrt(in).
    CHECK(a.init == TSR_INIT_UNIFORM);
    CHECK(a.init_b == Approx(1.0 / std::sqrt(static_cast<double>(k.shape[1]))));
    CHECK(a.init_a == Approx(-a.init_b));
    CHECK(b.init == TSR_INIT_ZEROS);
    const tsr_param_info &down = by.at("model.layers.0.mlp.gate_proj.lora_B.weight");
    CHECK(down.shape[0] == by.at("model.layers.0.mlp.gate_proj.weight").shape[0]);
    CHECK(by.count("model.layers.0.self_attn.q_proj.lora_A.weight") == 0);
    for (const auto &p : infos) CHECK(p.trainable == (is_adapter(p.name) ? 1 : 0));
    // Group order holds: non-decreasing over declaration order.
    for (size_t i = 1; i < infos.size(); ++i) CHECK(infos[i].group >= infos[i - 1].group);
  }
}

// FLOPs per sample count what the step computes: 6 n T for a trained
// matrix, 4 n T for a frozen one backward passes through (no weight
// gradient), and the attention's 6 Hq D T^2 per layer; the untied
// embedding is a lookup; with only the head training, backward stops at
// its weight gradient. Counted here from the declared shapes.
TEST_CASE("llama FLOPs per sample: frozen weights count no weight gradient", "[llama][lora]") {
  const Golden g("llama3_L2_C64");
  const double T = static_cast<double>(g.T);
  // The plugin's count and the one written out here, from the declared
  // shapes, while the model (which owns the names) lives.
  // head_only: only lm_head trains, so backward stops at its weight
  // gradient (no input gradient of the head, nothing below it).
  auto counts = [&](const std::string &keys, bool *all_trainable, bool head_only = false) {
    Fixture f;
    Model m(f, "llama");
    REQUIRE(
        m.create(f.config("model", "llama", "hf_config = \"" + g.dir + "/config.json\"\n" + keys),
                 token_data(g.T, g.V), 1) == TSR_OK);
    double want = 0, qd = 0;
    int layers = 0;
    *all_trainable = true;
    for (const auto &p : m.infos()) {
      const std::string name = p.name;
      *all_trainable = *all_trainable && p.trainable;
      if (p.ndim < 2 || name == "model.embed_tokens.weight") continue;
      const double n = static_cast<double>(p.shape[0]) * static_cast<double>(p.shape[1]);
      want += (2.0 + (p.trainable ? 2.0 : 0.0) + (head_only ? 0.0 : 2.0)) * n * T;
      if (name.find("self_attn.q_proj.weight") != std::string::npos) {
        qd = static_cast<double>(p.shape[0]);
        ++layers;
      }
    }
    REQUIRE(layers == 2);
    REQUIRE(m.vt->flops_per_sample);
    const double attention = (head_only ? 2.0 : 6.0) * layers * qd * T * T;
    return std::pair{m.vt->flops_per_sample(m.self), want + attention};
  };
  bool all_trainable = false;
  const auto [all, all_want] = counts("", &all_trainable);
  CHECK(all_trainable);
  CHECK(all == Approx(all_want).epsilon(1e-12));
  const auto [adapted, adapted_want] =
      counts("lora.rank = 4\nlora.targets = [\"q\", \"down\"]\n", &all_trainable);
  CHECK_FALSE(all_trainable);
  CHECK(adapted == Approx(adapted_want).epsilon(1e-12));
  CHECK(adapted < all);
  const auto [head, head_want] = counts("freeze = [\"model.*\"]\n", &all_trainable, true);
  CHECK_FALSE(all_trainable);
  CHECK(head == Approx(head_want).epsilon(1e-12));
}

// ABI 1.8's init-from may_lack: the llama plugin answers 1 for its adapters
// only, so the engine's loader fills the base from a Hugging Face file and
// leaves the adapters their initialisers; without the answer the file's
// missing adapters are an error naming one.
TEST_CASE("llama LoRA: init_from loads the base, the adapters keep their initialisers",
          "[llama][lora][abi]") {
  static_assert(offsetof(tsr_export_args, adapters) == 72, "ABI 1.8 appends adapters at 72");
  static_assert(offsetof(tsr_ext_model_init_from, may_lack) == 16, "ABI 1.8: may_lack at 16");
  const Golden g("llama3_L2_C64");
  Fixture f;
  Model m(f, "llama");
  REQUIRE(
      m.create(f.config("model", "llama", "init_from = \"" + g.dir + "\"\nlora.rank = 2\n" + kAll),
               token_data(g.T, g.V), 1) == TSR_OK);
  const auto *ext = f.registry.find("model", "llama")
                        ->extension<tsr_ext_model_init_from>(TSR_EXT_MODEL_INIT_FROM);
  REQUIRE(ext != nullptr);
  REQUIRE(ext->struct_size >= tsr_ext_model_init_from_STRUCT_SIZE);
  REQUIRE(ext->may_lack != nullptr);
  const tessera::Layout layout = tessera::make_layout(m.vt, m.self, 1, "llama");
  std::vector<float> flat(layout.total), init(layout.total);
  tessera::init_params(layout, init.data(), 77);
  flat = init;
  CHECK_THROWS_WITH(tessera::init_from_safetensors(g.dir, layout, flat.data()),
                    Catch::Contains("lora_A.weight"));
  flat = init;
  const auto may_lack = [&](size_t i) { return ext->may_lack(m.self, i) != 0; };
  CHECK_THAT(tessera::init_from_safetensors(g.dir, layout, flat.data(), nullptr, may_lack),
             Catch::Contains("28 (adapters) from their initialisers"));
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const tessera::ParamSlot &p = layout.params[i];
    INFO(p.name);
    CHECK(may_lack(i) == is_adapter(p.name));
    const std::vector<float> got(flat.begin() + p.offset, flat.begin() + p.offset + p.numel);
    if (is_adapter(p.name)) {
      CHECK(got == std::vector<float>(init.begin() + p.offset, init.begin() + p.offset + p.numel));
      const float bound = p.init_b;
      for (float v : got) CHECK(std::fabs(v) <= bound);
    } else {
      const RefTensor &r = g.weights.at(p.name);
      for (size_t j = 0; j < p.numel; ++j) REQUIRE(got[j] == static_cast<float>(r.data[j]));
    }
  }
}

// lora.dropout: a training pass drops the adapters' input, evaluation does
// not; a recomputed layer and the backward draw the forward's masks (with
// recompute the loss and every adapter gradient are those without); each
// step position draws its own. (The gradients' agreement with the dropped
// forward is checked by finite differences in `tessera plugin check`,
// tests/integration/test_llama.cpp; the op's masks in test_cpu_dropout.)
TEST_CASE("llama LoRA dropout: training drops, recompute draws the same masks, eval does not",
          "[llama][lora][dropout]") {
  const Golden g("llama3_L2_C64");
  const std::string base = "hf_config = \"" + g.dir + "/config.json\"\nlora.rank = 3\n" + kAll;
  Fixture f;
  Model plain(f, "llama"), drop(f, "llama"), drop_rc(f, "llama");
  REQUIRE(plain.create(f.config("model", "llama", base), token_data(g.T, g.V), g.B) == TSR_OK);
  const std::string d = "lora.dropout = 0.3\n";
  REQUIRE(drop.create(f.config("model", "llama", base + d), token_data(g.T, g.V), g.B) == TSR_OK);
  REQUIRE(drop_rc.create(f.config("model", "llama", base + d + "recompute = true\n"),
                         token_data(g.T, g.V), g.B) == TSR_OK);
  State sp(plain), sd(drop), sr(drop_rc);
  for (State *s : {&sp, &sd, &sr}) load_lora(*s, g);
  Batch b1 = g.batch(), b2 = g.batch(), b3 = g.batch();
  const tsr_forward_result rp = train_step(plain, sp, b1), rd = train_step(drop, sd, b2),
                           rr = train_step(drop_rc, sr, b3);
  INFO("loss without dropout " << rp.loss_sum << ", with " << rd.loss_sum << ", recompute "
                               << rr.loss_sum);
  CHECK(std::fabs(rd.loss_sum - rp.loss_sum) > 1e-4 * std::fabs(rp.loss_sum));
  for (size_t i = 0; i < sd.info.size(); ++i) {
    if (!is_adapter(sd.info[i].name)) continue;
    INFO(sd.info[i].name);
    CHECK(sr.grad[i] == sd.grad[i]);
    // Only the adapters' input is dropped: A's gradient changes, and B's.
    CHECK(sd.grad[i] != sp.grad[i]);
  }
  // Evaluation does not drop: an evaluation forward's loss and predict's
  // logits are the plain model's.
  std::vector<double> eval_loss;
  for (auto [m, s] : {std::pair{&drop, &sd}, std::pair{&plain, &sp}}) {
    Batch b = g.batch();
    tsr_forward_result r = fresh_result();
    REQUIRE(m->vt->forward(m->self, m->f.host.step_handle(&s->hooks), b.get(), 0, &r) == TSR_OK);
    eval_loss.push_back(r.loss_sum);
  }
  CHECK(eval_loss[0] == eval_loss[1]);
  for (int64_t t : {int64_t{0}, g.T - 1}) {
    const std::vector<float> zd = prefix_logits(drop, sd, g, t),
                             zp = prefix_logits(plain, sp, g, t);
    CHECK(zd == zp);
  }
  // Another step, or another micro-batch of the step: other masks.
  sd.hooks.update = 1;
  Batch b4 = g.batch();
  const tsr_forward_result next = train_step(drop, sd, b4);
  CHECK(next.loss_sum != rd.loss_sum);
  sd.hooks.update = 0;
  sd.hooks.micro = 1;
  Batch b5 = g.batch();
  const tsr_forward_result micro = train_step(drop, sd, b5);
  CHECK(micro.loss_sum != rd.loss_sum);
  CHECK(micro.loss_sum != next.loss_sum);
}

// With B nonzero (the plugin check starts from B = 0, where A's gradient
// and the adapters' share of dx vanish) the adapter gradients of a dropped
// pass against central differences of that pass's loss: the step position
// is fixed, so every forward draws the same masks.
TEST_CASE("llama LoRA dropout: adapter gradients match finite differences of the dropped loss",
          "[llama][lora][dropout]") {
  const Golden g("llama3_L2_C64");
  Fixture f;
  Model m(f, "llama");
  REQUIRE(m.create(f.config("model", "llama",
                            "hf_config = \"" + g.dir + "/config.json\"\nlora.rank = 2\n" +
                                "lora.dropout = 0.4\n" + kAll),
                   token_data(g.T, g.V), g.B) == TSR_OK);
  State s(m);
  load_lora(s, g);
  Batch b = g.batch();
  const tsr_forward_result r = train_step(m, s, b);
  const double count = static_cast<double>(r.count);
  tsr_step *step = m.f.host.step_handle(&s.hooks);
  const auto loss = [&] {
    tsr_forward_result x = fresh_result();
    REQUIRE(m.vt->forward(m.self, step, b.get(), 1, &x) == TSR_OK);
    return x.loss_sum / count;
  };
  int checked = 0;
  for (size_t i = 0; i < s.info.size(); ++i) {
    const std::string name = s.info[i].name;
    // Layer 0's adapters: their gradients pass through layer 1's dx.
    if (!is_adapter(name) || name.find("layers.0.") == std::string::npos) continue;
    std::vector<float> &w = s.value[i];
    // The element with the largest gradient, and one in the middle.
    size_t big = 0;
    for (size_t j = 1; j < w.size(); ++j)
      if (std::fabs(s.grad[i][j]) > std::fabs(s.grad[i][big])) big = j;
    for (size_t j : {big, w.size() / 2}) {
      const float keep = w[j], h = 3e-3f;
      w[j] = keep + h;
      const double up = loss();
      w[j] = keep - h;
      const double down = loss();
      w[j] = keep;
      const double numeric = (up - down) / (2.0 * h), analytic = s.grad[i][j];
      INFO(name << "[" << j << "]: numeric " << numeric << ", analytic " << analytic);
      CHECK(std::fabs(numeric - analytic) <= 5e-3 * std::fabs(s.grad[i][big]) + 1e-5);
      ++checked;
    }
  }
  CHECK(checked == 28);
}

TEST_CASE("llama LoRA refuses dropout 1, an unknown target and a zero alpha, naming the key",
          "[llama][lora]") {
  const Golden g("llama3_L2_C64");
  const std::string base = "hf_config = \"" + g.dir + "/config.json\"\nlora.rank = 4\n";
  const std::pair<const char *, const char *> cases[] = {
      {"lora.dropout = 1.0\n", "model.lora.dropout"},
      {"lora.alpha = 0.0\n", "model.lora.alpha"},
      {"lora.targets = []\n", "model.lora.targets"},
  };
  for (const auto &[keys, want] : cases) {
    INFO(keys);
    Fixture f;
    Model m(f, "llama");
    CHECK(m.create(f.config("model", "llama", base + keys), token_data(g.T, g.V), 1) != TSR_OK);
    CHECK_THAT(f.host.last_error(), Catch::Contains(want));
  }
  Fixture f;
  CHECK_THROWS_WITH(f.config("model", "llama", base + "lora.targets = [\"q\", \"qkv\"]\n"),
                    Catch::Contains("lora.targets") && Catch::Contains("q|k|v|o|gate|up|down"));
}

}  // namespace unit_test_llama_lora
