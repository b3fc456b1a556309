"""bench/gpt2_gpu's result file from its scratch directory (bench/gpt2_gpu/run
writes it; tests/bench feeds it made-up runs):

  report.py WORK REPS [MODEL LAYERS HEADS WIDTH BATCH]   (default 124m 12 12 768 16)

WORK holds tessera-rI/ (I = 1..REPS: metrics.jsonl, summary.json; and
tessera-rI.log), torch.json (the anchor's line) with torch/metrics.jsonl,
and env-before.json / env-after.json. Exits 1 when a figure is refused
(its row says why).
"""
import datetime
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
import machine  # noqa: E402
from harness import BenchError  # noqa: E402

WARMUP = 10  # tessera's warm-up steps (bench/gpt2_gpu/run plans with the same)
TOKENS = 1024  # per sample


def flops_per_token(L, C, V=50304, T=TOKENS):
    """Training FLOPs per token: 6 N (N the parameters, the tied embedding
    once, the vocab padded to 50304) + 6 L C T for attention's two matmuls
    (the causal mask halves 12 L C T)."""
    n = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    return n, 6 * n + 6 * L * C * T


PEAK = 989e12  # dense bf16 of an H100/H200 SXM: MFU against it


def main(argv):
    work, reps = argv[1], int(argv[2])
    model, L, H, C, B = (argv[3], *map(int, argv[4:8])) if len(argv) > 7 else ("124m", 12, 12, 768, 16)
    n_params, fpt = flops_per_token(L, C)

    def mfu(f):
        return f"{100 * f.median * TOKENS * fpt / PEAK:.1f}%" if f else ""
    refused = []
    runs = [os.path.join(work, f"tessera-r{r}", "metrics.jsonl") for r in range(1, reps + 1)]
    ours = theirs = None
    try:
        ours = harness.figure_of_runs(runs, None, WARMUP)
    except BenchError as e:
        refused.append(f"tessera: {e}")
    mem = ""
    try:
        s = harness.load_json(os.path.join(work, "tessera-r1", "summary.json"))
        mem = f"{s['peak_memory_bytes'] / 2**30:.2f} GiB (engine allocations)"
    except (OSError, ValueError, KeyError):
        pass
    tj = {}
    if os.path.exists(os.path.join(work, "torch.json")):
        tj = harness.load_json(os.path.join(work, "torch.json"))
        try:
            theirs = harness.figure_of_runs([os.path.join(work, "torch", "metrics.jsonl")],
                                            tj["tokens_per_step"] / TOKENS, tj.get("warmup", 8),
                                            windows=reps)
        except BenchError as e:
            refused.append(f"PyTorch: {e}")
    else:
        refused.append("PyTorch: not run or failed (torch.err in the scratch)")
    before = harness.load_json(os.path.join(work, "env-before.json"))
    after_p = os.path.join(work, "env-after.json")
    after = harness.load_json(after_p) if os.path.exists(after_p) else None
    out = [f"# bench/gpt2_gpu — {datetime.date.today().isoformat()}", "",
           f"GPT-2 {model} ({L} layers, {H} heads, width {C}, vocab 50257 padded to 50304, "
           f"{n_params / 1e6:.0f}M parameters), batch {B} x 1024 tokens, bf16, AdamW, gradient "
           "clipping 1.0, random tokens, one GPU; MFU at 6N + 6LCT FLOPs a token against "
           f"{PEAK / 1e12:.0f} TFLOP/s. "
           f"Tokens/s, each figure the median (min-max) of {reps} steady-state windows of at "
           f"least {harness.MIN_WINDOW_S:g} s (tessera: {reps} runs; PyTorch: {reps} "
           "consecutive windows of one process, compiled once), from the steps' own "
           f"timestamps (bench/lib/harness.py); noisy past {100 * harness.NOISY_SPREAD:.0f}% "
           "spread.", "",
           "| system | tokens/s | tessera / PyTorch | MFU | peak GPU memory |", "|---|---|---|---|---|"]
    vs = harness.fmt_ratio(harness.ratio(ours, theirs)) if ours and theirs else ""
    out.append(f"| tessera (configs/gpt2-{model}.toml) | "
               f"{harness.fmt_figure(ours, TOKENS) if ours else 'refused (below)'} | {vs} | "
               f"{mfu(ours)} | {mem} |")
    label = f"PyTorch {tj.get('torch', '')} torch.compile, SDPA, fused AdamW"
    peak = f"{tj['peak_mem_gib']:.2f} GiB (max_memory_allocated)" if "peak_mem_gib" in tj else ""
    out.append(f"| {label} | {harness.fmt_figure(theirs, TOKENS) if theirs else 'refused (below)'}"
               f" | | {mfu(theirs)} | {peak} |")
    out.append("")
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
