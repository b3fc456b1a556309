"""bench/offload_params_gpu's result file, from its scratch directory
(bench/offload_params_gpu/run writes it; tests/bench feeds it made-up runs):

  report.py --work WORK [--warmup W] [--windows K] [--cap GIB] [--commit C]

WORK holds runs.txt (one line per run: "tessera NAME L C H B" or "deepspeed
NAME L C H B"); per tessera run NAME/metrics.jsonl, NAME/summary.json,
NAME.log; per DeepSpeed run NAME.json (its JSON line, empty when it did not
finish), NAME/metrics.jsonl, NAME.err, NAME.rc, NAME.kill (dmesg's lines when
it was killed); for the NVMe part dd.txt
(dd's last lines, "write ..." / "read ...") and nvme-io.jsonl (iosample.py);
env-before.json and env-after.json. Each figure: the median (min-max) of K
consecutive windows of a run's steady state (bench/lib/harness.py). Exits 1
when a figure is refused (its row says why).
"""
import argparse
import datetime
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
import machine  # noqa: E402
from harness import BenchError  # noqa: E402

TOKENS = 1024  # per sample
NVME_TARGET = 0.70


load_json = harness.load_json_or_empty  # {} where an anchor or a run left nothing


def read_runs(work):
    runs = []
    for line in open(os.path.join(work, "runs.txt")):
        f = line.split()
        if len(f) == 6:
            runs.append((f[0], f[1], tuple(int(x) for x in f[2:])))
    return runs


def shape_text(shape, params=None):
    L, C, H, B = shape
    n = f"{params / 1e9:.2f}B parameters, " if params else ""
    return f"{n}{L} x {C}, {H} heads, B{B}"


def why_ds_stopped(work, name):
    """The line of a DeepSpeed run's stderr that says why it stopped."""
    rc = open(os.path.join(work, name + ".rc")).read().strip() if os.path.exists(
        os.path.join(work, name + ".rc")) else "?"
    err = os.path.join(work, name + ".err")
    lines = open(err, errors="replace").read().splitlines() if os.path.exists(err) else []
    hit = next((x for x in reversed(lines) if re.search(r"OutOfMemory|out of memory|Error", x)),
               lines[-1] if lines else "")
    if rc == "124":
        return "did not finish within DS_TIMEOUT (exit 124)"
    if rc == "137":
        kill = os.path.join(work, name + ".kill")
        said = open(kill, errors="replace").read().strip().splitlines() if os.path.exists(
            kill) else []
        return ("killed by SIGKILL (exit 137): the kernel's out-of-memory killer: "
                + (said[-1].strip()[:200] if said else "host memory ran out (dmesg not readable)"))
    return f"exit {rc}: {hit.strip()[:220]}"


def lowest_available(work, name):
    """The least host memory available (GiB) while a DeepSpeed run ran."""
    try:
        kib = [int(x) for x in open(os.path.join(work, name + ".mem")).read().split()]
    except (OSError, ValueError):
        return None
    return min(kib) / 2**20 if kib else None


def ds_run(work, name, a, refused):
    """(figure or None, its JSON line or why it stopped, lowest MemAvailable)."""
    low = lowest_available(work, name)
    how = " (pin_memory off)" if name.endswith("_unpinned") else ""
    j = load_json(os.path.join(work, name + ".json"))
    if not j:
        return None, {"why": why_ds_stopped(work, name), "how": how}, low
    try:
        return harness.figure_of_runs(
            [os.path.join(work, name, "metrics.jsonl")], j["tokens_per_step"] / TOKENS,
            j.get("warmup", 3), windows=a.windows), j, low
    except BenchError as e:
        refused.append(f"DeepSpeed {name}: {e}")
        return None, {"why": f"refused: {e}", "how": how}, low


def tessera_row(work, name, shape, a):
    d = os.path.join(work, name)
    s = harness.load_json(os.path.join(d, "summary.json"))
    f = harness.figure_of_runs([os.path.join(d, "metrics.jsonl")], None, a.warmup,
                               windows=a.windows)
    rank = (s.get("peak_memory_by_rank") or [{}])[0]
    return f, s, {"params": s.get("parameters"), "gpu": s.get("peak_memory_bytes", 0) / 2**30,
                  "host": rank.get("rss", 0) / 2**30, "mfu": s.get("mfu"),
                  "steps": s.get("steps")}


def capacity_section(work, runs, a, refused):
    out = ["| system | shape | fits under the cap | tokens/s | vs DeepSpeed | GPU peak | "
           "host memory | MFU |", "|---|---|---|---|---|---|---|---|"]
    ours, theirs = {}, {}
    for kind, name, shape in runs:
        if name == "nvme":
            continue
        if kind == "tessera":
            try:
                ours[shape] = tessera_row(work, name, shape, a)
            except (OSError, ValueError, KeyError) as e:
                ours[shape] = None
                refused.append(f"tessera {name}: did not finish ({e}; see {name}.log)")
            except BenchError as e:
                ours[shape] = None
                refused.append(f"tessera {name}: {e}")
        else:
            theirs.setdefault(shape, []).append(ds_run(work, name, a, refused))
    ratios = []
    for shape in sorted(set(ours) | set(theirs), key=lambda s: -s[1] * s[0]):
        o, ds = ours.get(shape), theirs.get(shape, [])
        fit = [r for r in ds if r[0]]
        best = max(fit, key=lambda r: r[0].median)[0] if fit else None
        if o:
            f, s, m = o
            vs = "-"
            if best:
                r = harness.ratio(f, best)
                vs = harness.fmt_ratio(r)
                ratios.append((shape, m["params"], r))
            mfu = f"{100 * m['mfu']:.1f}%" if m["mfu"] else "-"
            out.append(f"| tessera stage 3 + offload cpu, params \"cpu\" | "
                       f"{shape_text(shape, m['params'])} | yes ({m['steps']} steps) | "
                       f"{harness.fmt_figure(f, TOKENS)} | {vs} | {m['gpu']:.2f} GiB (engine "
                       f"allocations) | peak RSS {m['host']:.1f} GiB | {mfu} |")
        elif shape in ours:
            out.append(f"| tessera stage 3 + offload cpu, params \"cpu\" | {shape_text(shape)} | "
                       "no (below) | | | | | |")
        for tf, tj, low in ds:
            host = f"MemAvailable fell to {low:.1f} GiB" if low is not None else "-"
            if tf:
                vs = "1.00x" if tf is best else harness.fmt_ratio(harness.ratio(tf, best))
                out.append(f"| {tj.get('impl', 'DeepSpeed')} | {shape_text(shape, tj.get('params'))}"
                           f" | yes | {harness.fmt_figure(tf, TOKENS)} | {vs} | "
                           f"{tj.get('peak_gpu_GiB', float('nan')):.2f} GiB (torch allocations) | "
                           f"{host} | - |")
            else:
                out.append(f"| DeepSpeed ZeRO-3 + offload_param + offload_optimizer"
                           f"{tj['how']} | {shape_text(shape)} | no: {tj['why']} | | | | {host} "
                           "| |")
    out.append("")
    for shape, params, r in ratios:
        met = "met" if r.value >= 1.5 else "NOT met"
        out.append(f"- {shape_text(shape, params)}: tessera / DeepSpeed = {harness.fmt_ratio(r)} "
                   f"(target >= 1.5x where both fit): {met}.")
    fits = [(m[2]["params"], shape) for shape, m in ours.items() if m]
    if fits:
        n, shape = max(fits)
        met = "met" if n >= 6e9 else "NOT met"
        out.append(f"- Largest shape tessera trained under {a.cap:g} GiB here: "
                   f"{shape_text(shape, n)} (target >= 6B): {met}.")
    return out


def dd_rates(work):
    """dd's bytes per second, by direction, from its summary lines."""
    got = {"write": [], "read": []}
    path = os.path.join(work, "dd.txt")
    if not os.path.exists(path):
        return got
    for line in open(path):
        m = re.match(r"(write|read) (\d+) bytes .* copied, ([0-9.]+) s", line)
        if m and float(m.group(3)) > 0:
            got[m.group(1)].append(int(m.group(2)) / float(m.group(3)))
    return got


def io_at(samples, t):
    """Cumulative (read, written) bytes at time t, linear between samples."""
    for (t0, r0, w0), (t1, r1, w1) in zip(samples, samples[1:]):
        if t0 <= t <= t1:
            x = (t - t0) / (t1 - t0) if t1 > t0 else 0.0
            return r0 + x * (r1 - r0), w0 + x * (w1 - w0)
    raise BenchError(f"no I/O sample around time {t:.1f} (iosample.py stopped early?)")


def nvme_windows(work, a):
    """Bytes/s read and written in each steady window of the nvme run."""
    metrics = os.path.join(work, "nvme", "metrics.jsonl")
    times = {}
    for raw in open(metrics):
        j = json.loads(raw)
        if j.get("type", "train") == "train" and "time" in j:
            times[j["step"]] = j["time"]
    pts = harness.steady_points(metrics, a.warmup, 0.0, a.windows)
    cuts = harness.window_cuts(pts, a.windows)
    samples = [(j["time"], j["read_bytes"], j["write_bytes"])
               for j in map(json.loads, open(os.path.join(work, "nvme-io.jsonl")))]
    reads, writes, secs = [], [], []
    for i, k in zip(cuts, cuts[1:]):
        ta, tb = times[pts[i][0]], times[pts[k][0]]
        (ra, wa), (rb, wb) = io_at(samples, ta), io_at(samples, tb)
        harness.check_rate((rb - ra) / (tb - ta), tb - ta, source=f"{metrics} reads")
        harness.check_rate((wb - wa) / (tb - ta), tb - ta, source=f"{metrics} writes")
        reads.append((rb - ra) / (tb - ta))
        writes.append((wb - wa) / (tb - ta))
        secs.append(tb - ta)
    return harness.figure(reads), harness.figure(writes), statistics.median(secs)


def nvme_section(work, runs, a, refused):
    shape = next((s for k, n, s in runs if n == "nvme"), None)
    if shape is None:
        return []
    out = [f"### NVMe: offload nvme, params \"nvme\" ({shape_text(shape)})", ""]
    dd = dd_rates(work)
    if len(dd["read"]) < harness.MIN_REPS or len(dd["write"]) < harness.MIN_REPS:
        refused.append(f"dd: {len(dd['read'])} read and {len(dd['write'])} write figure(s) in "
                       "dd.txt, need 3 each")
        return out + ["dd did not give three figures each way (dd.txt)."]
    disk = {k: harness.figure(v) for k, v in dd.items()}
    try:
        rd, wr, secs = nvme_windows(work, a)
        tok = harness.figure_of_runs([os.path.join(work, "nvme", "metrics.jsonl")], None,
                                     a.warmup, windows=a.windows)
    except (OSError, ValueError, KeyError) as e:
        refused.append(f"tessera nvme: {e}")
        return out + [f"The nvme run gave no figures ({e}; see nvme.log)."]
    except BenchError as e:
        refused.append(f"tessera nvme: {e}")
        return out + [f"The nvme run was refused: {e}"]
    gb = 1e9
    busy = rd.median / disk["read"].median + wr.median / disk["write"].median
    out += ["| | read | write |", "|---|---|---|",
            f"| disk, sequential (dd, O_DIRECT, 64 MiB blocks) | "
            f"{harness.fmt_figure(disk['read'], 1 / gb)} GB/s | "
            f"{harness.fmt_figure(disk['write'], 1 / gb)} GB/s |",
            f"| tessera's training steps (windows of {secs:.1f} s) | "
            f"{harness.fmt_figure(rd, 1 / gb)} GB/s | {harness.fmt_figure(wr, 1 / gb)} GB/s |",
            f"| share of the disk's bandwidth | {100 * rd.median / disk['read'].median:.0f}% | "
            f"{100 * wr.median / disk['write'].median:.0f}% |", "",
            f"Tokens/s of the nvme run: {harness.fmt_figure(tok, TOKENS)}. Against the target "
            f"(each direction >= {100 * NVME_TARGET:.0f}% of dd's rate): read "
            f"{'met' if rd.median / disk['read'].median >= NVME_TARGET else 'NOT met'}, write "
            f"{'met' if wr.median / disk['write'].median >= NVME_TARGET else 'NOT met'}. "
            "For information, the disk's busy time (each direction's bytes at dd's rate for "
            f"it, summed): {100 * busy:.0f}%."]
    log = os.path.join(work, "nvme.log")
    if os.path.exists(log):
        out += [""] + [f"- {line.strip()}" for line in open(log, errors="replace")
                       if "offload nvme (rank 0)" in line or "on disk" in line][:2]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", required=True)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--windows", type=int, default=harness.MIN_REPS)
    p.add_argument("--cap", type=float, default=24.0)
    p.add_argument("--commit", default="")
    a = p.parse_args(argv)
    refused = []
    runs = read_runs(a.work)
    out = [f"# bench/offload_params_gpu — {datetime.date.today().isoformat()}", "",
           f"Parameter offload at ZeRO stage 3 on one GPU capped at {a.cap:g} GiB "
           "(tessera run.max_gpu_memory; DeepSpeed torch.cuda.set_per_process_memory_fraction), "
           "GPT-2 shapes, context 1024, bf16, AdamW state in host memory, recompute on; commit "
           f"{a.commit or '?'}. Tokens/s, each figure the median (min-max) of {a.windows} "
           f"consecutive steady-state windows (at least {harness.MIN_WINDOW_S:g} s each) of one "
           f"run after the warm-up steps, from the steps' own timestamps (bench/lib/harness.py); "
           f"noisy past {100 * harness.NOISY_SPREAD:.0f}% spread; ratios median over median, with "
           "the range the spreads allow.", ""]
    out += capacity_section(a.work, runs, a, refused)
    out += [""] + nvme_section(a.work, runs, a, refused)
    out.append("")
    for e in refused:
        out.append(f"- refused: {e}")
    for name in (n for k, n, _ in runs if k == "tessera"):
        log = os.path.join(a.work, name + ".log")
        if os.path.exists(log):
            for line in open(log, errors="replace"):
                if "parameters of rank 0" in line or "expected" in line:
                    out.append(f"- {name}: {line.strip()}")
    out += machine.markdown_of(a.work)
    print("\n".join(out))
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
