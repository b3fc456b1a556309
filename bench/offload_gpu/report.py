"""bench/offload_gpu's result file, from its scratch directory (bench/offload_gpu/run
writes it; tests/bench feeds it made-up runs):

  report.py --work WORK [--warmup W] [--windows K] [--commit C] RUN...

WORK holds, per tessera RUN (none, cpu, cpu_auto): RUN/metrics.jsonl (one
line per step, with log.breakdown), RUN/summary.json, RUN.log; the
anchors' anchor-fsdp2.json / anchor-deepspeed.json with
anchor-*/metrics.jsonl; alone.json (step_bench's line); env-before.json
and env-after.json. Each figure: the median (min-max) of K consecutive
windows of a run's steady state (bench/lib/harness.py). Exits 1 when a
figure is refused (its row says why).
"""
import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
import machine  # noqa: E402
from harness import BenchError, breakdowns, mean_part  # noqa: E402

TOKENS = 1024  # per sample


load_json = harness.load_json_or_empty  # {} where an anchor or a run left nothing


def vs(a, b):
    return harness.fmt_ratio(harness.ratio(a, b)) if a and b else "-"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", required=True)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--windows", type=int, default=harness.MIN_REPS)
    p.add_argument("--commit", default="")
    p.add_argument("runs", nargs="*")
    a = p.parse_args(argv)
    w, refused = a.work, []
    anchors = {}
    for name in ("fsdp2", "deepspeed"):
        j = load_json(os.path.join(w, f"anchor-{name}.json"))
        if not j:
            continue
        try:
            f = harness.figure_of_runs([os.path.join(w, f"anchor-{name}", "metrics.jsonl")],
                                       j["tokens_per_step"] / TOKENS, j.get("warmup", 3),
                                       windows=a.windows)
            anchors[name] = (f, j)
        except BenchError as e:
            refused.append(f"{j.get('impl', name)}: {e}")
    fsdp = anchors.get("fsdp2", (None, {}))[0]
    ds = anchors.get("deepspeed", (None, {}))[0]
    out = [f"# bench/offload_gpu — {datetime.date.today().isoformat()}", "",
           f"GPT-2 1.5B (48 x 1600), batch 4 x 1024, bf16, AdamW, one GPU, ZeRO stage 1 at one "
           f"rank; commit {a.commit or '?'}. Tokens/s, each figure the median (min-max) of "
           f"{a.windows} consecutive steady-state windows (at least {harness.MIN_WINDOW_S:g} s "
           f"each) of one run after {a.warmup} warm-up steps, from the steps' own timestamps "
           f"(bench/lib/harness.py); noisy past {100 * harness.NOISY_SPREAD:.0f}% spread; "
           "ratios median over median, with the range the spreads allow.", "",
           "| system | tokens/s | vs FSDP2 | vs DeepSpeed | GPU peak | wall - training (start-up, final eval) |",
           "|---|---|---|---|---|---|"]
    rows = {}
    for name in a.runs:
        d = os.path.join(w, name)
        try:
            f = harness.figure_of_runs([os.path.join(d, "metrics.jsonl")], None, a.warmup,
                                       windows=a.windows)
            summary = harness.load_json(os.path.join(d, "summary.json"))
        except (OSError, ValueError) as e:
            out.append(f"| tessera offload {name} | failed: {e} | | | | |")
            refused.append(f"tessera {name}: {e}")
            continue
        except BenchError as e:
            out.append(f"| tessera offload {name} | refused (below) | | | | |")
            refused.append(f"tessera {name}: {e}")
            continue
        rows[name] = (f, breakdowns(os.path.join(d, "metrics.jsonl"), a.warmup))
        start = summary.get("wall_s", 0) - summary.get("train_s", 0)
        out.append(f"| tessera offload {name} | {harness.fmt_figure(f, TOKENS)} | {vs(f, fsdp)} | "
                   f"{vs(f, ds)} | {summary['peak_memory_bytes'] / 2**30:.2f} GiB (engine "
                   f"allocations) | {start:.1f} s |")
    for name, label, other in (("fsdp2", "PyTorch FSDP2 + CPUOffloadPolicy", ds),
                               ("deepspeed", "DeepSpeed ZeRO-2 + offload_optimizer cpu", fsdp)):
        if name not in anchors:
            out.append(f"| {label} | not run or failed (anchor-{name}.err) | | | | |")
            continue
        f, j = anchors[name]
        cells = ("1.00x", vs(f, other)) if name == "fsdp2" else (vs(f, other), "1.00x")
        out.append(f"| {j.get('impl', label)} | {harness.fmt_figure(f, TOKENS)} | {cells[0]} | "
                   f"{cells[1]} | {j.get('peak_gpu_GiB', float('nan')):.2f} GiB | |")
    out.append("")
    for e in refused:
        out.append(f"- refused: {e}")
    if refused:
        out.append("")
    for name, (f, parts) in rows.items():
        if name == "cpu" or not any("redone_steps" in p.get("offload", {}) for p in parts):
            continue
        # The speculative step under clipping (issue 52): how often a step
        # stepped ahead of the norm was redone, and what that cost.
        redone = sum(p["offload"].get("redone_steps", 0) for p in parts)
        out.append(f"Speculation ({name}): {redone} of {len(parts)} measured steps redone; per "
                   f"step: keeping the pre-step state "
                   f"{mean_part(parts, 'offload', 'speculation_save') * 1e3:.1f} ms, redoing "
                   f"{mean_part(parts, 'offload', 'redo') * 1e3:.1f} ms, ranges held for the "
                   f"norm {mean_part(parts, 'offload', 'held_for_norm') * 1e3:.1f} ms.")
        if "cpu" in rows:
            what = (" (a max norm no step reaches: every verdict keeps what was stepped ahead)"
                    if name == "cpu_clip_kept" else "")
            out.append(f"{name}{what} against cpu without clipping: {vs(f, rows['cpu'][0])}.")
    alone = load_json(os.path.join(w, "alone.json"))
    if "cpu" in rows:
        f, parts = rows["cpu"]
        step_ms = 4 / f.median * 1e3  # f: samples/s, 4 samples a step
        fwd_none = mean_part(rows["none"][1], "forward") * 1e3 if "none" in rows else float("nan")
        out.append("Offloaded step (offload cpu, ratio 0), ms per step at the median, from "
                   f"log.breakdown: step {step_ms:.0f}; forward {mean_part(parts, 'forward') * 1e3:.0f} "
                   f"(of which waiting for the CPU step {mean_part(parts, 'offload', 'wait') * 1e3:.0f}), "
                   f"backward {mean_part(parts, 'backward') * 1e3:.0f}, optimizer "
                   f"{mean_part(parts, 'optimizer') * 1e3:.0f}; beside it: d2h "
                   f"{mean_part(parts, 'offload', 'd2h') * 1e3:.0f}, CPU step "
                   f"{mean_part(parts, 'offload', 'cpu_step') * 1e3:.0f}, h2d "
                   f"{mean_part(parts, 'offload', 'h2d') * 1e3:.0f}.")
        if alone.get("step_s"):
            bound = alone["step_s"] * 1e3 + fwd_none
            out += ["", f"The CPU step alone over {alone.get('params', 0):.3g} elements on "
                    f"{alone.get('threads')} threads (step_bench, median of its windows): "
                    f"{alone['step_s'] * 1e3:.0f} ms; the GPU's forward (offload none): "
                    f"{fwd_none:.0f} ms; the offloaded step / (their sum) = {step_ms / bound:.2f} "
                    "(target <= 1.15).", "",
                    f"CPU AdamW alone ({alone.get('kernel')} kernel): "
                    f"{alone.get('params_per_s', 0):.3g} params/s, {alone.get('GBps', 0):.0f} GB/s "
                    f"at 28 B/param; the read-modify-write ceiling on the same threads "
                    f"{alone.get('ceiling_GBps', 0):.0f} GB/s: {alone.get('pct_of_ceiling', 0):.0f}% "
                    "of it."]
        out.append("")
    for name in a.runs:
        log = os.path.join(w, name + ".log")
        if os.path.exists(log):
            for line in open(log):
                if "offload cpu (rank 0)" in line or "ratio = \"auto\"" in line:
                    out.append(f"- {name}: {line.strip()}")
    out += machine.markdown_of(w)
    print("\n".join(out))
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
