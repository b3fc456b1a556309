"""bench/offload_llama_gpu's result file from its scratch directory
(bench/offload_llama_gpu/run writes it; tests/bench feeds it made-up runs):

  report.py WORK MODEL BATCH REPS        (MODEL: 3b or 8b)

WORK holds tessera-r1/ (metrics.jsonl with log.breakdown, summary.json) and
tessera-r1.log; for 3b the anchors' one JSON line each, anchor-fsdp2.json
and anchor-deepspeed.json (when they ran); env-before.json and
env-after.json. tessera's figure: the median (min-max) of REPS consecutive
steady-state windows of its run after 4 warm-up steps
(bench/lib/harness.py). Exits 1 when a figure is refused (it says why).
"""
import datetime
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
import machine  # noqa: E402
from harness import BenchError, breakdowns, mean_part  # noqa: E402

T = 2048
WARMUP = 4
SHAPES = {"3b": "Llama-3.2-3B's shape (28 x 3072, 24 query / 8 key-value heads of 128, "
                "intermediate 8192, vocab 128256, tied), offload cpu ratio 0, no recompute, "
                "random tokens",
          "8b": "Llama-3.1-8B's shape (32 x 4096, 32 / 8 heads of 128, intermediate 14336, "
                "vocab 128256, untied), configs/llama3.1-8b-offload.toml: offload cpu ratio "
                "\"auto\", recompute, this repository's docs as byte-level text"}
GOALS = {"fsdp2": 2.0, "deepspeed": 2.5}  # issue 52, for the 3B shape
TARGET_8B = 6000  # tokens/s (torchtitan's per-GPU figure for 8B on eight H100s)


load_json = harness.load_json_or_empty  # {} where an anchor or a run left nothing


def losses(metrics):
    out = []
    for raw in open(metrics):
        j = json.loads(raw)
        if j.get("type", "train") == "train" and "loss" in j:
            out.append((j["step"], j["loss"]))
    return out


def bound_lines(step_ms, cpu, held, tokens_per_step, gpu_own=float("nan")):
    """What bounds the step. The host's timings cannot give the GPU's own
    time (the host blocks in wait_params while the GPU runs what it
    queued): gpu_own comes from the GPU's events in the breakdown where the
    run has them (gpu_passes - gpu_waited), else it is inferred. The host's
    timings give the CPU's side: its update, and how long its ranges waited
    for the norm."""
    if not (step_ms == step_ms and cpu == cpu and step_ms > 0 and cpu > 0):
        return []
    rate = tokens_per_step / step_ms * 1e3
    if held == held and held > 0.25 * step_ms:
        measured = gpu_own == gpu_own
        gpu = gpu_own if measured else step_ms - cpu
        said = ("the GPU's own work, from its events, being" if measured else
                "which puts the GPU's own near")
        return [f"Bounds: clipping held the CPU's ranges for the norm {held:.0f} ms a step "
                f"(the norm clipped, and after a clipped step speculation = \"adaptive\" steps "
                f"nothing ahead), so "
                f"the CPU's update ({cpu:.0f} ms) ran after backward and before the next "
                f"forward could pass the first layer it holds: the step ({step_ms:.0f} ms, "
                f"{rate:,.0f} tokens/s) is the GPU's forward and backward plus that update, "
                f"{said} {gpu:.0f} ms. Where the norm does not clip "
                f"(speculation keeps the ranges stepped during backward) the update hides "
                f"behind backward, and the longer of the two bounds the step at "
                f"{tokens_per_step / max(gpu, cpu) * 1e3:,.0f} tokens/s."]
    who = "the CPU's update bounds it" if cpu >= 0.9 * step_ms else (
        "the GPU's forward and backward (or the transfers) take the rest")
    gpu = (f", the GPU's own work {gpu_own:.0f} ms (from its events)"
           if gpu_own == gpu_own else "")
    return [f"Bounds: the CPU's update {cpu:.0f} ms of a {step_ms:.0f} ms step{gpu}: {who}; "
            f"the update alone would allow {tokens_per_step / cpu * 1e3:,.0f} tokens/s."]


def breakdown_lines(parts, tokens_per_step, step_ms):
    def ms(*keys):
        return mean_part(parts, *keys) * 1e3

    def f(*keys, digits=0):  # "-" where no breakdown has the part
        v = ms(*keys)
        return f"{v:.{digits}f}" if v == v else "-"
    redone = sum(p.get("offload", {}).get("redone_steps", 0) for p in parts)
    out = [f"Where a step's time goes (log.breakdown, mean ms per step over {len(parts)} "
           f"measured steps): forward {f('forward')} (of which waiting for the CPU's update "
           f"{f('offload', 'wait')}), backward {f('backward')}, optimizer {f('optimizer')}, "
           f"communication wait {f('comm_wait')}, data {f('data')}; beside it: gradients to "
           f"the host (d2h) {f('offload', 'd2h')}, the CPU's update {f('offload', 'cpu_step')}, "
           f"parameters back (h2d) {f('offload', 'h2d')}, the GPU's share of the update "
           f"{f('offload', 'device_share')}; ranges held for the norm "
           f"{f('offload', 'held_for_norm')}.",
           f"Speculation: {redone} of {len(parts)} steps redone (clipping changed the update "
           f"after ranges were stepped); keeping the pre-step state "
           f"{f('offload', 'speculation_save', digits=1)} ms, redoing "
           f"{f('offload', 'redo', digits=1)} ms per step."]
    gpu_own = ms("offload", "gpu_passes") - ms("offload", "gpu_waited")
    if gpu_own == gpu_own:  # CUDA events: the GPU's own figures
        out.append(f"The GPU's side, from its own events: its passes {f('offload', 'gpu_passes')} "
                   f"ms a step, of which idle at the waits for the CPU's update "
                   f"{f('offload', 'gpu_waited')} ms: its own work {gpu_own:.0f} ms.")
    out += bound_lines(step_ms, ms("offload", "cpu_step"), ms("offload", "held_for_norm"),
                       tokens_per_step, gpu_own)
    return out


def main(argv):
    work, model, B, reps = argv[1], argv[2], int(argv[3]), int(argv[4])
    run = os.path.join(work, "tessera-r1")
    refused, fig, summary, parts = [], None, {}, []
    try:
        fig = harness.figure_of_runs([os.path.join(run, "metrics.jsonl")], None, WARMUP,
                                     windows=reps)
        summary = harness.load_json(os.path.join(run, "summary.json"))
        parts = breakdowns(os.path.join(run, "metrics.jsonl"), WARMUP)
    except (OSError, ValueError, BenchError) as e:
        refused.append(f"tessera: {e}")
    out = [f"# bench/offload_llama_gpu — {datetime.date.today().isoformat()}", "",
           f"{model}: {SHAPES[model]}; batch {B} x {T}, bf16, AdamW (fp32 master weights and "
           "moments in host memory), gradient clipping 1.0, one GPU. tessera: the median "
           f"(min-max) of {reps} consecutive steady-state windows of one run after {WARMUP} "
           "warm-up steps, from its own step timestamps (bench/lib/harness.py); the anchors: "
           "their own timing of their steps after warm-up, one process.", ""]
    rss = max((r.get("rss", 0) for r in summary.get("peak_memory_by_rank", [])),
              default=summary.get("peak_rss_bytes", 0))
    mem = (f"{summary.get('peak_memory_bytes', 0) / 2**30:.1f} GiB (engine allocations); host "
           f"RSS {rss / 2**30:.1f} GiB") if summary else ""
    if model == "3b":
        out += ["| system | tokens/s | tessera / it | goal | GPU peak |", "|---|---|---|---|---|",
                f"| tessera offload cpu | {harness.fmt_figure(fig, T) if fig else 'refused'} | "
                f"| | {mem} |"]
        for name, label in (("fsdp2", "PyTorch FSDP2 + CPUOffloadPolicy"),
                            ("deepspeed", "DeepSpeed ZeRO-2 + offload_optimizer cpu")):
            j = load_json(os.path.join(work, f"anchor-{name}.json"))
            if not j.get("tokens_per_s"):
                out.append(f"| {label} | not run or failed (anchor-{name}.err) | | "
                           f"{GOALS[name]:g}x | |")
                continue
            theirs = j["tokens_per_s"] / T
            r = harness.ratio(fig, harness.Figure(theirs, theirs, theirs, [theirs])) if fig else None
            out.append(f"| {j.get('impl', label)} ({label}) | {j['tokens_per_s']:,.0f} | "
                       f"{harness.fmt_ratio(r) if r else ''} | {GOALS[name]:g}x | "
                       f"{j.get('peak_gpu_GiB', '')} GiB (max_memory_allocated) |")
    else:
        rate = fig.median * T if fig else 0
        out += ["| run | tokens/s | goal | memory |", "|---|---|---|---|",
                f"| tessera 8B, offload cpu ratio \"auto\" | "
                f"{harness.fmt_figure(fig, T) if fig else 'refused'} | {TARGET_8B:,} "
                f"({'met' if rate >= TARGET_8B else 'not met'}) | {mem} |"]
        ls = losses(os.path.join(run, "metrics.jsonl")) if os.path.exists(run) else []
        if ls:
            out += ["", f"Loss over {len(ls)} logged steps: {ls[0][1]:.3f} at step {ls[0][0]}, "
                    f"{min(l for _, l in ls):.3f} lowest, {ls[-1][1]:.3f} at step {ls[-1][0]}."]
    out.append("")
    if parts:
        out += breakdown_lines(parts, B * T, B * T / (fig.median * T) * 1e3 if fig else float("nan")) + [""]
    for e in refused:
        out.append(f"- refused: {e}")
    log = run + ".log"
    if os.path.exists(log):
        lines = [l.rstrip() for l in open(log)
                 if re.search(r"tessera: (model|memory|where|expected)|offload cpu \(rank 0\)|"
                              r"ratio = \"auto\"|summary|throughput|peak memory|time \(rank", l)]
        if lines:
            out += ["", "```"] + lines[:24] + ["```"]
    out += machine.markdown_of(work)
    print("\n".join(out))
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
