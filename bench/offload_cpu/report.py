"""bench/offload_cpu's result file, from its scratch directory (bench/offload_cpu/run
writes it; tests/bench feeds it made-up runs):

  report.py WORK CAP_REFUSED

WORK holds ours.json (step_bench's line: per-window rates and lengths),
torch.json and ds.json (the anchors' lines, or {"error": ...}),
offload_cap/ (the capacity run's metrics.jsonl and summary.json, when it
ran) and env-before.json / env-after.json. Each figure: the median
(min-max) of the windows (bench/lib/harness.py), each at least 5 s; a
refused figure makes a row that says why, and the exit status 1.
"""
import datetime
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
import machine  # noqa: E402
from harness import BenchError, Sample  # noqa: E402

CAP_WARMUP = 3


load = harness.load_json_or_empty  # {} where an anchor or a run left nothing


def windows_figure(j, prefix):
    """The figure over a line's per-window rates and lengths."""
    rates, secs = j.get(f"{prefix}rates"), j.get(f"{prefix}windows_s")
    if not rates or not secs:
        raise BenchError("no per-window rates (an older script?)")
    samples = []
    for r, s in zip(rates, secs):
        harness.check_rate(r, s)
        samples.append(Sample(r, s, 0))
    return harness.figure(samples)


def main(argv):
    work, cap_refused = argv[1], argv[2] if len(argv) > 2 else "skipped"
    o, t, d = (load(os.path.join(work, f)) for f in ("ours.json", "torch.json", "ds.json"))
    refused = []
    out = [f"# bench/offload_cpu — {datetime.date.today().isoformat()}", ""]
    if not o:
        print("bench/offload_cpu: no step_bench result", file=sys.stderr)
        return 1
    out += [f"## (a) AdamW step over {o['params']:.3g} parameters on {o['threads']} pinned threads "
            f"(CPUs {o['cpus']})", "",
            f"Params/s, the median (min-max) of {o['reps']} windows of {o['steps']} steps (each at "
            f"least {harness.MIN_WINDOW_S:g} s); tessera and the ceiling alternate window by "
            "window. Ratio: tessera's median over the row's, with the range the spreads allow.", "",
            "| | params/s | GB/s at 28 B/param (median) | tessera / this |", "|---|---|---|---|"]
    figs = {}
    rows = [("ours", f"tessera adamw, bf16 grads + bf16 copy ({o['kernel']})", o, "ours_"),
            ("nt", f"RMW ceiling, non-temporal copy ({o['ceiling_isa']})", o, "ceiling_nt_"),
            ("plain", f"RMW ceiling, plain stores ({o['ceiling_isa']})", o, "ceiling_plain_"),
            ("torch", t.get("impl", "torch AdamW fused"), t, ""),
            ("ds", d.get("impl", "DeepSpeedCPUAdam"), d, "")]
    for key, label, j, prefix in rows:
        if "error" in j or not j:
            out.append(f"| {label} | {j.get('error', 'not run')} | | |")
            continue
        try:
            figs[key] = windows_figure(j, prefix)
        except BenchError as e:
            out.append(f"| {label} | refused (below) | | |")
            refused.append(f"{label}: {e}")
            continue
        f = figs[key]
        vs = harness.fmt_ratio(harness.ratio(figs["ours"], f)) if key != "ours" and "ours" in figs \
            else ""
        out.append(f"| {label} | {harness.fmt_figure(f)} | {f.median * 28 / 1e9:.1f} | {vs} |")
    out.append("")

    def verdict(name, key, want, fmt):
        if "ours" not in figs or key not in figs:
            out.append(f"- {name}: not measured (target {fmt(want)})")
            return
        r = harness.ratio(figs["ours"], figs[key])
        out.append(f"- {name}: {fmt(r.value)} ({fmt(r.lo)}-{fmt(r.hi)}; target {fmt(want)}): "
                   f"{'met' if r.value >= want else 'NOT met'}{' (noisy)' if r.noisy else ''}")

    if "nt" in figs and "plain" in figs:
        figs["ceiling"] = max(figs["nt"], figs["plain"], key=lambda f: f.median)
    verdict("tessera / RMW ceiling (the faster store)", "ceiling", 0.9, lambda x: f"{100 * x:.0f}%")
    verdict("tessera / torch fused", "torch", 1.05, lambda x: f"{x:.2f}x")
    verdict("tessera / DeepSpeedCPUAdam", "ds", 1.1, lambda x: f"{x:.2f}x")
    out += ["", "## (b) capacity: GPT-2 shape, 32 layers x 2560, run.max_gpu_memory = 24GiB, "
            "one GPU", "", f"- without offload: {cap_refused}"]
    cap = os.path.join(work, "offload_cap", "metrics.jsonl")
    if os.path.exists(cap):
        try:
            f = harness.figure_of_runs([cap], None, CAP_WARMUP, windows=3)
            s = load(os.path.join(work, "offload_cap", "summary.json"))
            out.append(f"- offload cpu: {harness.fmt_figure(f, 1024)} tokens/s (3 windows of one "
                       f"run; {s.get('parameters', 0) / 1e9:.2f}B parameters, peak GPU memory "
                       f"{s.get('peak_memory_bytes', 0) / 2**30:.2f} GiB)")
        except BenchError as e:
            out.append("- offload cpu: refused (below)")
            refused.append(f"capacity run: {e}")
    else:
        out.append("- offload cpu: skipped")
    for e in refused:
        out.append(f"- refused: {e}")
    out += machine.markdown_of(work)
    print("\n".join(out))
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
