"""bench/llama_gpu's result file from its scratch directory (bench/llama_gpu/run
writes it):

  report.py WORK REPS MODEL BATCH CONTEXT [LORA_RANK PACK]   (MODEL: 1b or qwen0.5b)

With LORA_RANK > 0 both sides fine-tune LoRA adapters on a frozen base
(the anchor: torch_llama_lora.py), PACK 1 with packed examples; MFU then
counts 4N + 6LHDT a token (no weight gradients of the frozen base; the
adapters' are below 1%).

WORK holds tessera-rI/ (I = 1..REPS: metrics.jsonl, summary.json; and
tessera-rI.log), torch.json (the anchor's one JSON line, when it ran),
env-before.json / env-after.json, and with an A/B ab.txt (the settings) and
tessera-b-rI/. Exits 1 when a figure is refused (its row says why).
"""
import datetime
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
import machine  # noqa: E402

WARMUP = 10  # tessera's warm-up steps (run plans with the same)
PEAK = 989e12  # dense bf16 of an H100/H200 SXM: MFU against it
# layers, width, heads, kv heads, head_dim, intermediate, vocab, tied, q/k/v bias
SHAPES = {"1b": (16, 2048, 32, 8, 64, 8192, 128256, True, False),
          "qwen0.5b": (24, 896, 14, 2, 64, 4864, 151936, True, True)}


def flops_per_token(shape, T, frozen=False):
    """Training FLOPs per token: 6 N (N the parameters, a tied embedding
    once: it is the head's product; 4 N when the base is frozen) + 6 L H D T
    for attention's two products (the causal mask halves 12 L H D T)."""
    L, C, H, KV, D, I, V, tied, bias = shape
    layer = C * H * D * 2 + 2 * C * KV * D + 3 * C * I + 2 * C + (H * D + 2 * KV * D if bias else 0)
    n = V * C * (1 if tied else 2) + L * layer + C
    return n, (4 if frozen else 6) * n + 6 * L * H * D * T


def main(argv):
    work, reps, model, B, T = argv[1], int(argv[2]), argv[3], int(argv[4]), int(argv[5])
    lora = int(argv[6]) if len(argv) > 6 else 0
    pack = len(argv) > 7 and argv[7] == "1"
    shape = SHAPES[model]
    n_params, fpt = flops_per_token(shape, T, frozen=lora > 0)

    def mfu(rate):
        return f"{100 * rate * fpt / PEAK:.1f}%" if rate else ""
    refused = []

    def tessera(prefix, what):
        return harness.tessera_runs(work, prefix, reps, WARMUP, what, refused)
    ours, mem = tessera("tessera-", "tessera")
    ab, ours_b, mem_b = None, None, ""
    if os.path.exists(os.path.join(work, "ab.txt")):
        with open(os.path.join(work, "ab.txt")) as f:
            ab = f.read().strip()
        ours_b, mem_b = tessera("tessera-b-", f"tessera {ab}")
    tj = {}
    if os.path.exists(os.path.join(work, "torch.json")):
        tj = harness.load_json(os.path.join(work, "torch.json"))
    else:
        refused.append("PyTorch: not run (no anchor) or failed (torch.err in the scratch)")
    theirs = tj.get("tokens_per_s")
    before = harness.load_json(os.path.join(work, "env-before.json"))
    after_p = os.path.join(work, "env-after.json")
    after = harness.load_json(after_p) if os.path.exists(after_p) else None
    L, C, H, KV, D, I, V, tied, bias = shape
    out = [f"# bench/llama_gpu — {datetime.date.today().isoformat()}", "",
           f"{model}: {L} layers, width {C}, {H} query / {KV} key-value heads of {D}, "
           f"intermediate {I}, vocab {V}, {'tied' if tied else 'untied'}"
           f"{', q/k/v biases' if bias else ''} ({n_params / 1e9:.2f}B parameters); batch {B} x "
           f"{T} tokens, bf16, AdamW, gradient clipping 1.0, random tokens, one GPU"
           + (f"; LoRA rank {lora} on q, k, v, o, gate, up, down (alpha {2 * lora}, dropout "
              "0.05), the base frozen" if lora else "")
           + ("; packed examples of 64-1024 tokens, attention within each" if pack else "")
           + f"; MFU at {'4N' if lora else '6N'} + 6LHDT FLOPs a token against "
           f"{PEAK / 1e12:.0f} TFLOP/s. tessera: the median "
           f"(min-max) of {reps} steady-state windows of at least {harness.MIN_WINDOW_S:g} s "
           "from the runs' own step timestamps (bench/lib/harness.py); PyTorch: the anchor's "
           "own timing of its steps after warm-up and compilation, one process.", "",
           "| system | tokens/s | tessera / PyTorch | MFU | peak GPU memory |", "|---|---|---|---|---|"]

    def row(label, fig, m):
        vs = f"{fig.median * T / theirs:.2f}x ({fig.lo * T / theirs:.2f}-{fig.hi * T / theirs:.2f})" \
            if fig and theirs else ""
        out.append(f"| {label} | {harness.fmt_figure(fig, T) if fig else 'refused (below)'} "
                   f"| {vs} | {mfu(fig.median * T if fig else 0)} | {m} |")
    row(f"tessera ({model})", ours, mem)
    if ab is not None:
        row(f"tessera, `{ab}`", ours_b, mem_b)
    if theirs:
        anchor = "torch_llama_lora.py over torch_llama.py" if lora else "torch_llama.py"
        out.append(f"| PyTorch {tj.get('impl', '')} ({anchor}) | {theirs:,.0f} | | "
                   f"{mfu(theirs)} | {tj.get('peak_gpu_GiB', '')} GiB (max_memory_allocated) |")
    out.append("")
    if ab is not None and ours and ours_b:
        out.append(f"- A/B: tessera as configured / with `{ab}` = "
                   f"{harness.fmt_ratio(harness.ratio(ours, ours_b))}.")
    for e in refused:
        out.append(f"- refused: {e}")
    log = os.path.join(work, "tessera-r1.log")
    if os.path.exists(log):
        lines = [l.rstrip() for l in open(log)
                 if re.search(r"tessera: (device|memory|expected)|MFU|TFLOP", l)]
        if lines:
            out += ["", "```"] + lines[:6] + ["```"]
    out += [""] + machine.markdown(before, after)
    print("\n".join(out))
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
