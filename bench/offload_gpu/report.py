"""bench/offload_gpu's table, from the runs' metrics and the anchors' JSON lines.

report.py WORK WARMUP GPU CPU COMMIT TORCH_JSON DS_JSON ALONE_JSON RUN...
"""
import datetime
import json
import os
import statistics
import sys


def per_step_rates(run_dir, warmup):
    """tokens/s of each step after `warmup`, from consecutive metrics lines."""
    lines = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for raw in f:
            j = json.loads(raw)
            if "elapsed_s" in j and "step" in j and "loss" in j:
                lines.append(j)
    rates, parts = [], []
    for a, b in zip(lines, lines[1:]):
        if b["step"] <= warmup or b["step"] != a["step"] + 1:
            continue
        dt = b["elapsed_s"] - a["elapsed_s"]
        if dt <= 0:
            raise SystemExit(f"{run_dir}: step {b['step']} took {dt} s: not a rate")
        rates.append(4 * 1024 / dt)
        parts.append(b.get("breakdown", {}))
    if not rates:
        raise SystemExit(f"{run_dir}: no steps after the {warmup} warm-up steps")
    return rates, parts


def mean_part(parts, *keys):
    vals = []
    for p in parts:
        x = p
        for k in keys:
            x = x.get(k, {}) if isinstance(x, dict) else {}
        if isinstance(x, (int, float)):
            vals.append(x / max(1, p.get("steps", 1)))
    return statistics.mean(vals) if vals else float("nan")


def main():
    work, warmup, gpu, cpu, commit = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    torch_j, ds_j, alone = (json.loads(x or "{}") for x in sys.argv[6:9])
    runs = sys.argv[9:]
    fsdp = torch_j.get("torch_fsdp2_cpuoffload", {})
    ref = fsdp.get("tokens_per_s")
    ds_ref = ds_j.get("tokens_per_s")
    print(f"# bench/offload_gpu — {datetime.date.today()}\n")
    print(f"Hardware: {gpu}; {cpu}. Commit {commit}. GPT-2 1.5B (48 x 1600), batch 4 x 1024, bf16, "
          "AdamW, one GPU, ZeRO stage 1 at one rank.\n")
    print("| system | tokens/s, median (min-max) | vs FSDP2 | vs DeepSpeed | GPU peak | wall - training (start-up, final eval) |")
    print("|---|---|---|---|---|---|")
    rows = {}
    for name in runs:
        d = os.path.join(work, name)
        try:
            rates, parts = per_step_rates(d, warmup)
            summary = json.load(open(os.path.join(d, "summary.json")))
        except (OSError, SystemExit, ValueError) as e:
            print(f"| tessera {name} | failed: {e} | | | | |")
            continue
        med = statistics.median(rates)
        spread = (max(rates) - min(rates)) / med
        rows[name] = (med, parts)
        vs = f"{med / ref:.2f}x" if ref else "-"
        vs_ds = f"{med / ds_ref:.2f}x" if ds_ref else "-"
        noisy = " (noisy)" if spread > 0.10 else ""
        start = summary.get("wall_s", 0) - summary.get("train_s", 0)
        print(f"| tessera offload {name} | {med:,.0f} ({min(rates):,.0f}-{max(rates):,.0f}){noisy} | {vs} | "
              f"{vs_ds} | {summary['peak_memory_bytes'] / 2**30:.2f} GiB (engine allocations) | {start:.1f} s |")
    if fsdp:
        print(f"| PyTorch FSDP2 + CPUOffloadPolicy | {ref:,.0f} | 1.00x | "
              f"{ref / ds_ref:.2f}x |" if ds_ref else f"| PyTorch FSDP2 + CPUOffloadPolicy | {ref:,.0f} | 1.00x | - |",
              f"{fsdp.get('peak_gpu_GiB', float('nan')):.2f} GiB | |")
    else:
        print("| PyTorch FSDP2 + CPUOffloadPolicy | not run (no anchor scripts or it failed) | | | | |")
    if ds_ref:
        print(f"| DeepSpeed ZeRO-2 + offload_optimizer cpu ({ds_j.get('impl', '')}) | {ds_ref:,.0f} | "
              f"{ds_ref / ref:.2f}x |" if ref else f"| DeepSpeed ZeRO-2 offload | {ds_ref:,.0f} | - |",
              f"1.00x | {ds_j.get('peak_gpu_GiB', float('nan')):.2f} GiB | |")
    else:
        print("| DeepSpeed ZeRO-2 + offload_optimizer cpu | not run (DeepSpeed not importable or failed) | | | | |")
    print()
    if "cpu" in rows:
        med, parts = rows["cpu"]
        step_ms = 4 * 1024 / med * 1e3
        fwd_none = mean_part(rows["none"][1], "forward") * 1e3 if "none" in rows else float("nan")
        print("Offloaded step (offload cpu, ratio 0), ms per step, from log.breakdown: "
              f"step {step_ms:.0f}; forward {mean_part(parts, 'forward') * 1e3:.0f} (of which waiting for "
              f"the CPU step {mean_part(parts, 'offload', 'wait') * 1e3:.0f}), backward "
              f"{mean_part(parts, 'backward') * 1e3:.0f}, optimizer {mean_part(parts, 'optimizer') * 1e3:.0f}; "
              f"beside it: d2h {mean_part(parts, 'offload', 'd2h') * 1e3:.0f}, CPU step "
              f"{mean_part(parts, 'offload', 'cpu_step') * 1e3:.0f}, h2d {mean_part(parts, 'offload', 'h2d') * 1e3:.0f}.")
        if alone.get("step_s"):
            bound = alone["step_s"] * 1e3 + fwd_none
            print(f"\nThe CPU step alone over {alone.get('params', 0):.3g} elements on {alone.get('threads')} threads: "
                  f"{alone['step_s'] * 1e3:.0f} ms; the GPU's forward (offload none): {fwd_none:.0f} ms; "
                  f"the offloaded step / (their sum) = {step_ms / bound:.2f} (target <= 1.15).")
            print(f"\nCPU AdamW alone (step_bench, {alone.get('kernel')} kernel): {alone.get('params_per_s', 0):.3g} "
                  f"params/s, {alone.get('GBps', 0):.0f} GB/s at 28 B/param; the read-modify-write ceiling on the same "
                  f"threads {alone.get('ceiling_GBps', 0):.0f} GB/s: {alone.get('pct_of_ceiling', 0):.0f}% of it.")
        print()
    for name in runs:
        log = os.path.join(work, name + ".log")
        if os.path.exists(log):
            for line in open(log):
                if "offload cpu (rank 0)" in line or "ratio = \"auto\"" in line:
                    print(f"- {name}: {line.strip()}")


if __name__ == "__main__":
    main()
