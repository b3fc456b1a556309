"""bench/gpt2_gpu's result file from its scratch directory (bench/gpt2_gpu/run
writes it; tests/bench feeds it made-up runs):

  report.py WORK REPS [MODEL LAYERS HEADS WIDTH BATCH]   (default 124m 12 12 768 16)

WORK holds tessera-rI/ (I = 1..REPS: metrics.jsonl, summary.json; and
tessera-rI.log), torch.json (the anchor's line) with torch/metrics.jsonl,
and env-before.json / env-after.json; with an A/B (run's AB_SET), ab.txt
(the settings) and tessera-b-rI/ (the runs with them). Exits 1 when a
figure is refused (its row says why).
"""
import datetime
import json
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


def losses(path):
    """{step: (previous logged step, loss)} of a metrics.jsonl's train lines:
    a logged loss is the mean over the steps since the previous one."""
    out, prev = {}, 0
    with open(path) as f:
        for raw in f:
            j = json.loads(raw) if raw.strip() else {}
            if j.get("type", "train") == "train" and "loss" in j and "step" in j:
                out[j["step"]] = (prev, j["loss"])
                prev = j["step"]
    return out


def ab_lines(work, reps, ab, a, b):
    """The A/B's ratio and how far apart its loss curves are: run 1 of each
    (same seed, data and plan), at the steps both logged over the same
    interval."""
    out = []
    if a and b:
        out.append(f"- A/B: tessera as configured / tessera with `{ab}` = "
                   f"{harness.fmt_ratio(harness.ratio(a, b))} (tokens/s, median over median, "
                   f"{reps} runs each, interleaved).")
    try:
        ca = losses(os.path.join(work, "tessera-r1", "metrics.jsonl"))
        cb = losses(os.path.join(work, "tessera-b-r1", "metrics.jsonl"))
    except (OSError, ValueError) as e:
        return out + [f"- A/B loss curves: not compared ({e})"]
    common = sorted(s for s in set(ca) & set(cb) if ca[s][0] == cb[s][0])
    if not common:
        return out + ["- A/B loss curves: no step logged by both over the same interval"]
    worst = max((abs(ca[s][1] - cb[s][1]) / max(abs(cb[s][1]), 1e-30), s) for s in common)
    out.append(f"- A/B loss curves (run 1 of each, same seed and data, {len(common)} logged "
               f"steps {common[0]}-{common[-1]}): worst relative difference {worst[0]:.2e} "
               f"(step {worst[1]}); first / last loss {ca[common[0]][1]:.4f} / "
               f"{ca[common[-1]][1]:.4f} as configured, {cb[common[0]][1]:.4f} / "
               f"{cb[common[-1]][1]:.4f} with `{ab}`.")
    return out


def main(argv):
    work, reps = argv[1], int(argv[2])
    model, L, H, C, B = (argv[3], *map(int, argv[4:8])) if len(argv) > 7 else ("124m", 12, 12, 768, 16)
    n_params, fpt = flops_per_token(L, C)

    def mfu(f):
        return f"{100 * f.median * TOKENS * fpt / PEAK:.1f}%" if f else ""
    refused = []

    def tessera(prefix, what):
        return harness.tessera_runs(work, prefix, reps, WARMUP, what, refused)
    ours, mem = tessera("tessera-", "tessera")
    ab, ours_b, mem_b = None, None, ""
    if os.path.exists(os.path.join(work, "ab.txt")):
        with open(os.path.join(work, "ab.txt")) as f:
            ab = f.read().strip()
        ours_b, mem_b = tessera("tessera-b-", f"tessera {ab}")
    theirs = None
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

    def row(label, fig, mem):
        vs = harness.fmt_ratio(harness.ratio(fig, theirs)) if fig and theirs else ""
        out.append(f"| {label} | {harness.fmt_figure(fig, TOKENS) if fig else 'refused (below)'} "
                   f"| {vs} | {mfu(fig)} | {mem} |")
    row(f"tessera (configs/gpt2-{model}.toml)", ours, mem)
    if ab is not None:
        row(f"tessera, `{ab}`", ours_b, mem_b)
    label = f"PyTorch {tj.get('torch', '')} torch.compile, SDPA, fused AdamW"
    peak = f"{tj['peak_mem_gib']:.2f} GiB (max_memory_allocated)" if "peak_mem_gib" in tj else ""
    out.append(f"| {label} | {harness.fmt_figure(theirs, TOKENS) if theirs else 'refused (below)'}"
               f" | | {mfu(theirs)} | {peak} |")
    out.append("")
    if ab is not None:
        out += ab_lines(work, reps, ab, ours, ours_b)
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
