// `tessera plugin check` on Llama-style blocks at a standard initialisation
// (std 0.02), through two test plugins that wrap the llama plugin
// (tests/plugins/llama_wrap.cpp): a correct backward whose loss is summed in
// fp32 (the check's finite differences then meet fp32's rounding, and must
// still pass it), and a wrong swiglu backward (the check must name the
// tensor the error starts at, not the first one declared).
#include <catch2/catch.hpp>
#include <string>

#include "harness.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace itest_test_plugin_check {

using namespace tessera::itest;

namespace {

// A two-layer Llama-style model of plugin `plugin` (width 16, SwiGLU 32,
// vocabulary 512) at init std 0.02 on random token windows of 64.
fs::path block_config(const std::string &plugin) {
  const fs::path dir = scratch() / "check_block";
  const fs::path tokens = dir / "tok_000000.bin";
  write_token_shard(tokens, 64 * 16 + 1, 512, 2);
  const fs::path cfg = dir / (plugin + ".toml");
  write_text(cfg, "[run]\ndevice = \"cpu\"\nseed = 3\ndir = \"" + (dir / "run").string() +
                      "\"\n\n[batch]\nmicro = 4\n\n[model]\nplugin = \"" + plugin +
                      "\"\nlayers = 2\nwidth = 16\nheads = 2\nkv_heads = 1\nhead_dim = 8\n"
                      "intermediate = 32\nvocab = 512\nmax_seq = 64\ninit_std = 0.02\n\n"
                      "[data.train]\nplugin = \"tokens\"\nfiles = \"" +
                      tokens.string() + "\"\ncontext = 64\nvocab = 512\n");
  return cfg;
}

std::string plugin_dir(const std::string &variant) {
  return std::string(TESSERA_TEST_PLUGIN_ROOT) + "/llama_" + variant;
}

}  // namespace

TEST_CASE("plugin check passes a correct Llama-style block at std 0.02 with an fp32 loss",
          "[plugin-check][llama]") {
  RunResult r = run_cli({"plugin", "check", block_config("llama_fp32_loss").string(),
                         "--plugin-path", plugin_dir("fp32_loss")},
                        {{}, {}, {}, 120});
  INFO(describe(r));
  CHECK(r.status == 0);
  CHECK(contains(r.out, "passed: 21 parameter tensors"));
  CHECK_FALSE(contains(r.out, "FAIL"));
  // Each tensor line gives fp32's noise at its step; the attention
  // projections' gradients are small at std 0.02, near the noise, and the
  // note says how to check them closely.
  CHECK(any_line_has(lines(r.out), {"ok", "self_attn.q_proj.weight", "fp32 noise"}));
  CHECK(any_line_has(lines(r.out), {"note:", "q_proj.weight", "raise the model's initial scale"}));
}

TEST_CASE("plugin check names the tensor a wrong backward starts at", "[plugin-check][llama]") {
  RunResult r = run_cli({"plugin", "check", block_config("llama_broken_swiglu").string(),
                         "--plugin-path", plugin_dir("broken_swiglu")},
                        {{}, {}, {}, 120});
  INFO(describe(r));
  CHECK(r.status == 1);
  const std::vector<std::string> ls = lines(r.out);
  // The error starts at the up projections and flows on to what backward
  // computes after them (the norms before the MLPs)...
  for (const char *bad :
       {"model.layers.1.mlp.up_proj.weight", "model.layers.1.post_attention_layernorm.weight",
        "model.layers.0.mlp.up_proj.weight", "model.layers.0.post_attention_layernorm.weight"})
    CHECK(any_line_has(ls, {"FAIL", bad}));
  // ...while what backward computed before it, and the gate beside it, pass.
  for (const char *ok :
       {"lm_head.weight", "model.norm.weight", "model.layers.1.mlp.down_proj.weight",
        "model.layers.1.mlp.gate_proj.weight"})
    CHECK(any_line_has(ls, {"  ok  ", ok}));
  // The verdict names where the error starts: not the first failing tensor
  // declared (layer 0's norm), but the last layer's up projection.
  CHECK(contains(r.err,
                 "tessera plugin check: failed: model.layers.1.mlp.up_proj.weight: the "
                 "analytic gradient (backward) does not match"));
  CHECK(contains(r.err, "where the error starts"));
}

}  // namespace itest_test_plugin_check
