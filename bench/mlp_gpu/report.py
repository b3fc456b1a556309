"""bench/mlp_gpu's result file from its scratch directory (bench/mlp_gpu/run
writes it; tests/bench feeds it made-up runs):

  report.py WORK REPS

WORK holds tessera-rI/ (I = 1..REPS: metrics.jsonl, summary.json, and
tessera-rI.log), torch-MODE.json (the anchor's line) with
torch-MODE/metrics.jsonl, and env-before.json / env-after.json. Exits 1
when a figure is refused (its row says why).
"""
import datetime
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
import machine  # noqa: E402
from harness import BenchError  # noqa: E402

WARMUP = 100  # tessera's warm-up steps (bench/mlp_gpu/run plans with the same)
MODES = {"eager": "PyTorch eager (autocast bf16)", "compile": "PyTorch torch.compile",
         "max-autotune": "PyTorch torch.compile(mode=\"max-autotune\")"}


def main(argv):
    work, reps = argv[1], int(argv[2])
    refused = []
    rows = []  # (label, figure or None, peak memory, why there is no figure)
    runs = [os.path.join(work, f"tessera-r{r}", "metrics.jsonl") for r in range(1, reps + 1)]
    try:
        ours = harness.figure_of_runs(runs, None, WARMUP)
    except BenchError as e:
        ours = None
        refused.append(f"tessera: {e}")
    why = "refused (below)"
    mem = ""
    try:
        s = harness.load_json(os.path.join(work, "tessera-r1", "summary.json"))
        mem = f"{s['peak_memory_bytes'] / 2**30:.2f} GiB (engine allocations)"
    except (OSError, ValueError, KeyError):
        pass
    rows.append(("tessera (data loader, bf16 compute, fused SGD)", ours, mem, why))
    theirs = {}
    for mode, label in MODES.items():
        jp = os.path.join(work, f"torch-{mode}.json")
        if not os.path.exists(jp):
            rows.append((label, None, "", "not run or failed (torch-MODE.err in the scratch)"))
            continue
        j = harness.load_json(jp)
        try:
            f = harness.figure_of_runs([os.path.join(work, f"torch-{mode}", "metrics.jsonl")],
                                       j["samples_per_step"], j.get("warmup", 30), windows=reps)
            theirs[mode] = f
        except BenchError as e:
            f = None
            refused.append(f"{label}: {e}")
        rows.append((f"{label}, torch {j.get('torch')}, SGD {j.get('sgd')}", f,
                     f"{j.get('peak_mem_gib', float('nan')):.2f} GiB (max_memory_allocated)", why))
    best = max(theirs, key=lambda m: theirs[m].median) if theirs else None
    before = harness.load_json(os.path.join(work, "env-before.json"))
    after_p = os.path.join(work, "env-after.json")
    after = harness.load_json(after_p) if os.path.exists(after_p) else None
    out = [f"# bench/mlp_gpu — {datetime.date.today().isoformat()}", "",
           "MLP 4 x 4096 + 10-way head, batch 1024, bf16, SGD momentum 0.9, one GPU. Samples/s, "
           f"each figure the median (min-max) of {reps} steady-state windows of at least "
           f"{harness.MIN_WINDOW_S:g} s (tessera: {reps} runs; PyTorch: {reps} consecutive "
           "windows of one process per mode), from the steps' own timestamps "
           f"(bench/lib/harness.py); noisy past {100 * harness.NOISY_SPREAD:.0f}% spread.", "",
           "| system | samples/s | ms per step (at the median) | tessera / this | peak GPU memory |",
           "|---|---|---|---|---|"]
    for label, f, peak, why in rows:
        if f is None:
            out.append(f"| {label} | {why} | | | {peak} |")
            continue
        vs = harness.fmt_ratio(harness.ratio(ours, f)) if ours and f is not ours else ""
        out.append(f"| {label} | {harness.fmt_figure(f)} | {1024 / f.median * 1e3:.3f} | {vs} | "
                   f"{peak} |")
    out.append("")
    if ours and best:
        r = harness.ratio(ours, theirs[best])
        out.append(f"Against PyTorch's best here ({MODES[best]}): {harness.fmt_ratio(r)}.")
    for e in refused:
        out.append(f"- refused: {e}")
    out.append("")
    log = os.path.join(work, "tessera-r1.log")
    if os.path.exists(log):
        lines = [l.rstrip() for l in open(log)
                 if re.search(r"tessera: (device|memory|expected)", l)]
        if lines:
            out += ["```"] + lines[:6] + ["```", ""]
    out += machine.markdown(before, after)
    print("\n".join(out))
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
