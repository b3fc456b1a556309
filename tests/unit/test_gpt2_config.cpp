// The gpt2 model plugin, loaded from the build tree the way a run loads it:
// its descriptor, the parameters it declares (Hugging Face's names and
// shapes, one group per block, initialisers, FLOPs; GPT-2 small by default),
// and its config keys: recompute and recompute_gelu (bitwise the same
// gradients; recompute_gelu's memory), fused (the
// ABI 1.3 ops or the sequences they fuse, and a 1.1 host's table without
// them: bitwise the same gradients), freeze
// (frozen parameters get no gradient), init_from's config.json setting the
// dimensions, and refusals of bad configs, datasets and batches. The
// golden model (tests/data/gpt2_L2_C64/) is described in test_gpt2.cpp,
// which checks the numbers against Hugging Face.
#include <tessera/tessera.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.hpp"
#include "gpt2_support.hpp"
#include "support/fixture.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_gpt2_config {

using namespace tessera::test::gpt2_support;

TEST_CASE("gpt2 is a model plugin for CPU and CUDA", "[gpt2]") {
  Fixture f;
  const tsr_plugin_descriptor &d = f.desc("model", "gpt2");
  CHECK(std::string(d.kind) == TSR_KIND_MODEL);
  CHECK(d.devices == (TSR_DEVICE_CPU | TSR_DEVICE_CUDA));
  std::vector<std::string> keys;
  for (size_t i = 0; i < d.num_params; ++i) keys.push_back(d.params[i].name);
  CHECK(keys == std::vector<std::string>{"layers", "heads", "width", "context", "vocab",
                                         "vocab_pad_to", "init_from", "freeze", "recompute",
                                         "recompute_gelu", "fused", "init_std"});
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

TEST_CASE("gpt2 recompute and recompute_gelu give bitwise the same gradients", "[gpt2]") {
  Fixture f;
  // recompute_gelu rebuilds the GELU with act_forward, the same function the
  // CPU's linear applies: the same bits, alone or beside recompute.
  const char *variants[] = {"recompute = false", "recompute = true", "recompute_gelu = true",
                            "recompute = true\nrecompute_gelu = true"};
  std::vector<std::vector<float>> grads[4];
  double losses[4] = {0, 0, 0, 0};
  for (int v = 0; v < 4; ++v) {
    Model m(f);
    REQUIRE(m.create(f.config("model", "gpt2", golden_config(variants[v])), token_data(kT),
                     kBatch) == TSR_OK);
    State s(m);
    s.load_hf();
    Batch batch = reference_batch();
    losses[v] = train_step(m, s, batch).loss_sum;
    CHECK(s.done == std::vector<uint32_t>{3, 2, 1, 0});
    grads[v] = s.grad;
  }
  for (int v = 1; v < 4; ++v) {
    INFO(variants[v]);
    CHECK(losses[0] == losses[v]);
    REQUIRE(grads[0].size() == grads[v].size());
    for (size_t i = 0; i < grads[0].size(); ++i) {
      INFO("parameter " << i);
      CHECK(std::memcmp(grads[0][i].data(), grads[v][i].data(), grads[0][i].size() * 4) == 0);
    }
  }
}

TEST_CASE("gpt2 recompute_gelu takes a quarter of a block's activations less", "[gpt2]") {
  Fixture f;
  size_t bytes[2] = {0, 0};
  for (int v = 0; v < 2; ++v) {
    Model m(f);
    REQUIRE(
        m.create(f.config("model", "gpt2",
                          golden_config(v ? "recompute_gelu = true" : "recompute_gelu = false")),
                 token_data(kT), kBatch) == TSR_OK);
    bytes[v] = f.host.memory().current[TSR_MEM_ACTIVATIONS];
  }
  // One [kBatch * kContext, 4C] float32 buffer per layer fewer.
  CHECK(bytes[0] - bytes[1] == static_cast<size_t>(kLayers * kBatch * kContext * 4 * kWidth * 4));
}

namespace {

// The CPU ops behind a table whose ABI 1.3 entries count their calls: a
// model that uses a fused op it should not (fused = false, or past a
// smaller table's struct_size) is seen.
int g_fused_calls = 0;
tsr_status spy_add_ln(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *y, const DLTensor *w,
                      const DLTensor *b, float eps, DLTensor *r, DLTensor *out, DLTensor *mean,
                      DLTensor *rstd) {
  ++g_fused_calls;
  return tessera::cpu_ops()->add_layernorm_forward(ctx, x, y, w, b, eps, r, out, mean, rstd);
}
tsr_status spy_bias_grad(tsr_host_ctx *ctx, const DLTensor *a, int32_t ta, const DLTensor *b,
                         int32_t tb, DLTensor *c, float alpha, float beta, DLTensor *dbias) {
  ++g_fused_calls;
  return tessera::cpu_ops()->matmul_bias_grad(ctx, a, ta, b, tb, c, alpha, beta, dbias);
}
tsr_status spy_act_grad(tsr_host_ctx *ctx, const DLTensor *a, int32_t ta, const DLTensor *b,
                        int32_t tb, tsr_activation act, const DLTensor *pre, DLTensor *c,
                        DLTensor *dbias) {
  ++g_fused_calls;
  return tessera::cpu_ops()->matmul_act_backward(ctx, a, ta, b, tb, act, pre, c, dbias);
}
tsr_status spy_ln_sum(tsr_host_ctx *ctx, const DLTensor *dy, const DLTensor *x, const DLTensor *w,
                      const DLTensor *mean, const DLTensor *rstd, DLTensor *dx, DLTensor *dw,
                      DLTensor *db, DLTensor *dsum) {
  ++g_fused_calls;
  return tessera::cpu_ops()->layernorm_backward_sum(ctx, dy, x, w, mean, rstd, dx, dw, db, dsum);
}

}  // namespace

TEST_CASE("gpt2 with the fused ops, without them and on a 1.1 host: bitwise the same", "[gpt2]") {
  Fixture f;
  tsr_ops spy = *tessera::cpu_ops();
  spy.add_layernorm_forward = spy_add_ln;
  spy.matmul_bias_grad = spy_bias_grad;
  spy.matmul_act_backward = spy_act_grad;
  spy.layernorm_backward_sum = spy_ln_sum;
  tsr_host with_spy = *f.host.table();
  with_spy.ops = &spy;
  // A 1.3 tessera's table ends at matmul_act_backward: no
  // layernorm_backward_sum, so the projections' bias gradients come from
  // matmul_bias_grad again.
  tsr_ops ops13 = spy;
  ops13.struct_size = TSR_STRUCT_SIZE(tsr_ops, matmul_act_backward);
  tsr_host host13 = with_spy;
  host13.ops = &ops13;
  // A 1.1 or 1.2 tessera's table ends at attention_backward: the entries
  // after it are not the model's to read, whatever the memory holds.
  tsr_ops old_ops = spy;
  old_ops.struct_size = TSR_STRUCT_SIZE(tsr_ops, attention_backward);
  tsr_host old_host = with_spy;
  old_host.ops = &old_ops;

  struct Run {
    const char *what;
    std::string keys;
    const tsr_host *host;
    int calls_per_block;
  };
  for (const char *rc : {"recompute = false", "recompute = true"}) {
    const bool rec = std::string(rc) == "recompute = true";
    // Fused calls per block. 1.4: two add+layernorms in forward (ln_2, and
    // the next ln_1 or ln_f); in backward qkv's weight gradient with its
    // bias, the input gradient through GELU, and two layernorm backwards
    // with a projection's bias gradient (ln_2 for attn's c_proj; ln_1 of
    // the block above, or ln_f, for the MLP's c_proj); and a recompute's
    // ln_2. 1.3: the three weight gradients with their bias instead.
    const Run runs[] = {{"fused", std::string(rc), &with_spy, 6 + rec},
                        {"a 1.3 host", std::string(rc), &host13, 6 + rec},
                        {"fused = false", std::string(rc) + "\nfused = false", &with_spy, 0},
                        {"a 1.1 host", std::string(rc), &old_host, 0}};
    std::vector<std::vector<float>> want;
    double want_loss = 0;
    for (const Run &run : runs) {
      INFO(run.what << ", " << rc);
      g_fused_calls = 0;
      Model m(f);
      REQUIRE(m.create(f.config("model", "gpt2", golden_config(run.keys)), token_data(kT), kBatch,
                       run.host) == TSR_OK);
      State s(m);
      s.load_hf();
      Batch batch = reference_batch();
      // A loss scale of a power of two: the fused path scales the loss
      // gradient in the LM head's matmuls, the unfused one in
      // cross_entropy, and only a power of two makes both exact.
      tsr_step *step = f.host.step_handle(&s.hooks);
      tsr_forward_result r = fresh_result();
      REQUIRE(m.vt->forward(m.self, step, batch.get(), 1, &r) == TSR_OK);
      REQUIRE(m.vt->backward(m.self, step, batch.get(), 1.0f / 128) == TSR_OK);
      const double loss = r.loss_sum;
      CHECK(g_fused_calls == run.calls_per_block * static_cast<int>(kLayers));
      if (&run == &runs[0]) {
        want = s.grad;
        want_loss = loss;
        continue;
      }
      CHECK(loss == want_loss);
      REQUIRE(s.grad.size() == want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        INFO("parameter " << s.info[i].name);
        CHECK(std::memcmp(s.grad[i].data(), want[i].data(), want[i].size() * 4) == 0);
      }
    }
  }
}

TEST_CASE("gpt2 writes its first weight gradients where the host says they began at zero",
          "[gpt2]") {
  // ABI 1.5's grads_zeroed: the weight matrices' first contribution is
  // written (matmul beta = 0) instead of added. Over zeroed buffers that is
  // bitwise what adding gives; over a buffer that holds something else it
  // shows which gradients the model overwrote. wpe (added per sequence),
  // the biases and the layernorms still add.
  Fixture f;
  struct Run {
    float prefill;
    bool zeroed;
  };
  const Run runs[] = {{0.0f, false}, {0.0f, true}, {0.5f, false}, {0.5f, true}};
  std::vector<std::vector<float>> want;
  for (const Run &run : runs) {
    INFO("prefill " << run.prefill << ", grads_zeroed " << run.zeroed);
    Model m(f);
    REQUIRE(m.create(f.config("model", "gpt2", golden_config()), token_data(kT), kBatch) == TSR_OK);
    State s(m);
    s.load_hf();
    for (auto &g : s.grad) std::fill(g.begin(), g.end(), run.prefill);
    int asked = 0;
    s.hooks.grads_zeroed = [&asked, &run] {
      ++asked;
      return run.zeroed;
    };
    Batch batch = reference_batch();
    train_step(m, s, batch);
    CHECK(asked == 1);  // asked once, as backward begins
    if (&run == &runs[0]) {
      want = s.grad;
      continue;
    }
    for (size_t i = 0; i < want.size(); ++i) {
      const std::string name = s.info[i].name;
      INFO("parameter " << name);
      const bool written = run.zeroed && s.info[i].ndim == 2 && name != "transformer.wpe.weight";
      if (run.prefill == 0.0f || written) {
        CHECK(std::memcmp(s.grad[i].data(), want[i].data(), want[i].size() * 4) == 0);
        continue;
      }
      // Added into 0.5 (BLAS accumulates in blocks: equal to rounding).
      double worst = 0;
      for (size_t k = 0; k < want[i].size(); ++k)
        worst = std::max(worst, std::fabs(double(s.grad[i][k]) - (0.5 + double(want[i][k]))));
      CHECK(worst < 1e-5);
    }
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

// With `freeze` the count is what runs: per parameter 2 n T forward, 2 n T
// for its gradient when it trains, 2 n T for its input's gradient where
// backward reaches its block (wte as the LM head: always, while anything
// trains); per layer 2 C T^2 forward, 4 C T^2 more where backward reaches
// it. Written out here from the declared shapes and groups.
TEST_CASE("gpt2 FLOPs per sample count only the backward that runs under freeze", "[gpt2]") {
  Fixture f;
  const double T = static_cast<double>(kT), C = static_cast<double>(kWidth);
  auto counts = [&](const std::string &keys, int64_t lowest_stage) {
    Model m(f);
    REQUIRE(m.create(f.config("model", "gpt2", golden_config(keys)), token_data(kT), 2) == TSR_OK);
    double want = 0;
    for (const tsr_param_info &q : m.infos()) {
      double n = 1;
      for (int32_t k = 0; k < q.ndim; ++k) n *= static_cast<double>(q.shape[k]);
      const int64_t stage =
          std::string(q.name) == "transformer.wte.weight" ? kLayers + 1 : int64_t(q.group);
      want += (2.0 + (q.trainable ? 2.0 : 0.0) + (stage >= lowest_stage ? 2.0 : 0.0)) * n * T;
    }
    for (int64_t l = 0; l < kLayers; ++l) want += (l + 1 >= lowest_stage ? 6.0 : 2.0) * C * T * T;
    return std::pair{m.vt->flops_per_sample(m.self), want};
  };
  const auto [all, all_want] = counts("", 0);
  CHECK(all == Approx(all_want).epsilon(1e-12));
  // Everything trains: the closed form 6 N T + 6 L C T^2.
  Model whole(f);
  REQUIRE(whole.create(f.config("model", "gpt2", golden_config()), token_data(kT), 2) == TSR_OK);
  double N = 0;
  for (const tsr_param_info &q : whole.infos()) {
    double n = 1;
    for (int32_t k = 0; k < q.ndim; ++k) n *= static_cast<double>(q.shape[k]);
    N += n;
  }
  CHECK(all == Approx(6.0 * N * T + 6.0 * kLayers * C * T * T).epsilon(1e-12));
  // Embeddings and block 0 frozen, and block 1's MLP: backward stops at
  // block 1 (stage 2).
  const auto [part, part_want] =
      counts("freeze = [\"transformer.w*\", \"transformer.h.0.*\", \"transformer.h.1.mlp.*\"]", 2);
  CHECK(part == Approx(part_want).epsilon(1e-12));
  CHECK(part < all);
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

}  // namespace unit_test_gpt2_config
