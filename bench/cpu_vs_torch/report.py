"""bench/cpu_vs_torch's result file, from its figures (bench.py calls it;
tests/bench/test_bench_reports.py feeds it made-up figures)."""
import datetime
import os
import re
import statistics
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
import machine  # noqa: E402

IMPL = {"eager": "PyTorch eager", "compile": "PyTorch torch.compile"}
PASSIVE = "-passive"  # OMP_WAIT_POLICY=PASSIVE


def layout(key):
    return f"{key[2]} x {key[3]}"


def torch_label(key):
    ddp = ", DDP gloo" if key[2] > 1 else ""
    env = ", OMP_WAIT_POLICY=PASSIVE" if key[1].endswith(PASSIVE) else ""
    return f"{IMPL[key[1].removesuffix(PASSIVE)]}{ddp}, {layout(key)}{env}"


def best(figs, w, impls):
    keys = [k for k in figs if k[0] == w and k[1].removesuffix(PASSIVE) in impls]
    return max(keys, key=lambda k: figs[k].median) if keys else None


NAME = re.compile(r"^(\w+)-(tessera|eager|compile)(-passive)?(?:-s(\d))?-(\d+)x(\d+)$")


def from_raw(raw):
    """(a, samples, figs, shares) again from a result's .json (bench.py
    --from-json); shares is empty for results written before it was kept."""
    figs, samples, shares = {}, {}, {}
    for name, j in raw["figures"].items():
        m = NAME.match(name)
        if not m:
            raise ValueError(f"{name}: not a configuration name")
        impl = m.group(2) + (m.group(3) or "")
        stage = int(m.group(4)) if m.group(4) is not None else None
        key = (m.group(1), impl, int(m.group(5)), int(m.group(6)), stage)
        figs[key] = harness.figure([harness.Sample(x["rate"], x["seconds"], x["steps"],
                                                   x.get("source", "")) for x in j["samples"]])
        samples[key] = [(None, load) for load in j.get("loads", [])]
        shares[key] = j.get("shares", [])
    args = raw["args"]
    a = SimpleNamespace(cores=args["cores"], reps=args["reps"], seconds=args["seconds"],
                        notes=args.get("notes"))
    return a, samples, figs, shares


def load_sentence(a, loads, shares):
    """How busy the machine was: the load averages, and where the runs
    measured it, the CPU time of other processes and the hypervisor's steal
    during each run (the 1-minute load average at a run's start still holds
    the bench's own previous run, so it cannot tell a quiet machine)."""
    text = (f"The machine's 1-minute load average at the start of the runs ranged "
            f"{min(loads):.2f}-{max(loads):.2f} on {a.cores} cores")
    if not shares:
        return text + (" (other work was running: the figures are those of a shared machine, "
                       "not a quiet one)" if max(loads) > a.cores * 0.75 else "") + "."
    others = [x["others"] for x in shares]
    steal = [x["steal"] for x in shares]
    busy = max(others) > 0.10 or max(steal) > 0.10
    return (text + ", which includes the bench's own previous run. During the runs, other "
            f"processes used {100 * statistics.median(others):.1f}% of the machine's CPU time "
            f"(median; at most {100 * max(others):.1f}%) and the hypervisor took "
            f"{100 * statistics.median(steal):.1f}% (steal; at most {100 * max(steal):.1f}%)" +
            (": other work was running, the figures are those of a shared machine, not a "
             "quiet one." if busy else ": nothing else of note ran beside them."))


def markdown(a, b, figs, before, after, workloads):
    """a: the arguments (cores, reps, seconds); b: the bench (its samples
    with the load at each, name(key)); figs: {key: Figure}, key =
    (workload, impl, ranks, threads, stage); workloads: bench.WORKLOADS."""
    out = [f"# bench/cpu_vs_torch — {datetime.date.today().isoformat()}", "",
           f"tessera against PyTorch at its best on the same {a.cores} CPU cores. Samples/s, "
           f"each figure the median (min-max) of {a.reps} runs, each run timed over a "
           f"steady-state window of at least {harness.MIN_WINDOW_S:g} s (about {a.seconds:g} s "
           "planned) from the steps' own timestamps (bench/lib/harness.py). A figure whose "
           f"spread exceeds {100 * harness.NOISY_SPREAD:.0f}% is marked noisy. A ratio is "
           "median over median; in brackets the range the two spreads allow (our min over "
           "their max, our max over their min). Layouts are ranks x threads per rank.", ""]
    below, reach, noisy = [], [], []
    for w in workloads:
        if not any(k[0] == w for k in figs):
            continue
        spec = workloads[w]
        be, ba = best(figs, w, ("eager",)), best(figs, w, ("eager", "compile"))
        tok = spec["tokens"]
        out += [f"## {spec['label']}", ""]
        out += ["| tessera | samples/s" + (" (tokens/s = x %d)" % tok if tok else "") +
                " | vs PyTorch's best eager layout | vs PyTorch's best of all |",
                "|---|---|---|---|"]
        for k in sorted((k for k in figs if k[0] == w and k[1] == "tessera"),
                        key=lambda k: (k[2], k[4])):
            f = figs[k]
            cells, said, reached = [], set(), set()
            for ref in (be, ba):
                if ref is None:
                    cells.append("not measured")
                    continue
                r = harness.ratio(f, figs[ref])
                cells.append(f"{harness.fmt_ratio(r)} against {torch_label(ref)}")
                if r.value < 1.0 and ref not in said:
                    said.add(ref)
                    below.append(f"{spec['label'].split(',')[0]} tessera stage {k[4]} "
                                 f"{layout(k)}: {r.value:.2f}x {torch_label(ref)}")
                if r.lo < 1.0 and ref not in reached:
                    reached.add(ref)
                    reach.append(f"{spec['label'].split(',')[0]} tessera stage {k[4]} "
                                 f"{layout(k)}: {r.value:.2f}x ({r.lo:.2f}-{r.hi:.2f}) "
                                 f"{torch_label(ref)}")
            out.append(f"| stage {k[4]}, {layout(k)} | {harness.fmt_figure(f)} | "
                       f"{cells[0]} | {cells[1]} |")
        out += ["", "| PyTorch | samples/s | |", "|---|---|---|"]
        for k in sorted((k for k in figs if k[0] == w and k[1] != "tessera"),
                        key=lambda k: (not k[1].startswith("eager"), k[2], k[1])):
            mark = "best eager" if k == be else ""
            if k == ba:
                mark = (mark + ", " if mark else "") + "best of all"
            out.append(f"| {torch_label(k)} | {harness.fmt_figure(figs[k])} | {mark} |")
        out.append("")
        for k in figs:
            if k[0] == w and figs[k].noisy:
                noisy.append(f"{b.name(k)} ({100 * figs[k].spread:.0f}%)")
    loads = [l for v in b.samples.values() for _, l in v]
    out += ["## Reading it", ""]
    if below:
        out.append("**Rows below 1.0x** (tessera slower than that PyTorch configuration): " +
                   "; ".join(below) + ".")
    else:
        out.append("Every tessera row is at or above 1.0x against both PyTorch references.")
    out.append("")
    if reach:
        out.append("**Rows whose range reaches below 1.0x** (our min over their max under 1.0x: "
                   "within the two spreads, tessera may be the slower): " + "; ".join(reach) +
                   ".")
    else:
        out.append("Every tessera row's range is at or above 1.0x too (our min over their max), "
                   "against both PyTorch references.")
    out.append("")
    if noisy:
        out.append(f"**Noisy figures** (spread over {100 * harness.NOISY_SPREAD:.0f}%): " +
                   ", ".join(noisy) + ".")
    else:
        out.append(f"No figure's spread exceeds {100 * harness.NOISY_SPREAD:.0f}%.")
    out += ["", load_sentence(a, loads, [x for v in b.shares.values() for x in v if x]), ""]
    out += ["## How it runs", "",
            "- tessera: `tessera run` on configs/quickstart.toml (micro batch 128 / ranks) and "
            "configs/gpt2-tiny-cpu.toml and configs/llama-tiny-cpu.toml, `run.threads` per rank, no evaluation, checkpoint or "
            "trace inside the run; a probe run of each layout sets `run.steps` and "
            "`run.log_every` (a line about every 0.1 s); the window runs from the first logged "
            "step past the warm-up to the last (metrics.jsonl's `elapsed_s`, evaluation "
            "excluded).",
            "- PyTorch (bench/cpu_vs_torch/torch_cpu.py): the same models and batches, data in "
            "memory, `torch.optim.AdamW(fused=True)`, `torch.set_num_threads` per rank, the loss "
            "read every step; DistributedDataParallel over gloo at more than one rank; "
            "torch.compile (inductor, default mode) of the model or of the DDP module; where a rank "
            "has more than one thread, also with OMP_WAIT_POLICY=PASSIVE (libgomp's default "
            "spin-wait collapses when another process wants the core). Warm-up "
            "steps (compilation included), then a probe of a few steps sets the step count; "
            "each step's timestamp is kept in memory and written after the run.",
            f"- The {a.reps} repetitions go round every configuration in turn (tessera and "
            "PyTorch interleaved); raw samples, with the load at each run's start, in the .json "
            "beside this file.", ""]
    out += machine.markdown(before, after)
    notes = getattr(a, "notes", None)
    if notes:
        with open(notes) as f:
            text = f.read().strip()
        # A notes file that starts with the heading itself: not twice.
        text = text.removeprefix("## Notes from the run").lstrip("\n")
        out += ["", "## Notes from the run", "", text]
    return "\n".join(out) + "\n"
