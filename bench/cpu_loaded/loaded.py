"""bench/cpu_loaded: tessera and PyTorch quiet, and beside CPU-bound processes.

  bench/cpu_loaded/run [--bin TESSERA] [--python PY] [--cores N] [--only mlp|gpt2]
                       [--hogs H] [--reps R] [--seconds S] [--compile] [--smoke]
                       [--out OUT.md]

Issue 53: a busy machine. Users run N ranks on shared nodes; an engine
whose threads spin or yield while they wait falls apart when other work
wants the cores (a 2-rank test went from 7.7 s to 120 s beside two
CPU-bound processes). This bench runs bench/cpu_vs_torch's workloads (the
quickstart MLP and gpt2-tiny-cpu) at 1 rank x N threads and 2 ranks x N/2
threads (N: --cores, default the cores this process may use: what
tessera's default, run.threads = 0, divides among the ranks), each
twice: quiet, and loaded, with --hogs (default 2) `yes > /dev/null`
processes running beside it for the whole run. PyTorch runs the same
layouts the same two ways (eager, and with OMP_WAIT_POLICY=PASSIVE where a
rank has several threads; --compile adds torch.compile), and its best
layout in each state is set beside tessera's rows.

Measurement: bench/cpu_vs_torch's runs (bench/lib/harness.py: each figure
the median (min-max) of --reps >= 3 runs timed over steady-state windows of
at least 5 s, --seconds planned), every configuration quiet and loaded in
turn within each repetition. A loaded run's steps come from a loaded probe.
The table gives each configuration's slowdown (quiet rate over loaded rate)
and flags one over 3x (issue 53's bound for the 2-rank runs). No PyTorch
importable (--python, $TORCH_PYTHON, python3): the PyTorch rows are
skipped, and the result file says so.

--smoke: one short run of each configuration (1 s windows, no figures, no
result file): to check that the bench runs, not to measure.

Writes bench/results/cpu_loaded-DATE.md (--out) and its raw samples (.json);
scratch under $TESSERA_BENCH_SCRATCH, else ${TMPDIR:-/tmp}/tessera-bench.
"""
import argparse
import datetime
import functools
import importlib.util
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "lib"))
import harness  # noqa: E402
import machine  # noqa: E402
from harness import BenchError  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "cpu_vs_torch_bench", os.path.join(ROOT, "bench", "cpu_vs_torch", "bench.py"))
vs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vs)

STATES = ("quiet", "loaded")
SLOWDOWN_BOUND = 3.0  # issue 53: loaded at most 3x the quiet time


def say(msg):
    print(f"bench/cpu_loaded: {msg}", flush=True)


def scratch_dir():
    base = os.environ.get("TESSERA_BENCH_SCRATCH") or os.path.join(
        os.environ.get("TMPDIR", "/tmp"), "tessera-bench")
    return os.path.join(base, "cpu_loaded")


def torch_python(arg):
    """A Python that imports torch and numpy, or None (the PyTorch rows are
    then skipped: this bench installs nothing)."""
    for py in (arg, os.environ.get("TORCH_PYTHON"), sys.executable):
        if py and subprocess.run([py, "-c", "import torch, numpy"],
                                 capture_output=True).returncode == 0:
            return py
    return None


class Hogs:
    """`yes > /dev/null`, n times, while the block runs."""

    def __init__(self, n):
        self.n, self.procs = n, []

    def __enter__(self):
        self.procs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL)
                      for _ in range(self.n)]
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        self.procs = []


class StateBench(vs.Bench):
    """bench/cpu_vs_torch's Bench with PyTorch's rendezvous on ports of its
    own (a port per state: a quiet run's store may still hold its port when
    the loaded run starts, and bench/cpu_vs_torch uses 29611 + rep)."""

    def __init__(self, a, port_base):
        super().__init__(a)
        self.port_base = port_base

    def run_logged(self, cmd, log, what, env=None):
        if "--port" in cmd:
            i = cmd.index("--port") + 1
            cmd = cmd[:i] + [str(self.port_base + int(cmd[i]) - 29611)] + cmd[i + 1:]
        return super().run_logged(cmd, log, what, env)


class Loaded:
    """bench/cpu_vs_torch's Bench once per state, each with its own probes
    and run directories (STATE/ under this bench's scratch)."""

    def __init__(self, a):
        self.a = a
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        self.benches = {}
        for n, state in enumerate(STATES):
            b = StateBench(a, 29811 + 50 * n)
            b.work = os.path.join(scratch_dir(), stamp, state)
            os.makedirs(b.work, exist_ok=True)
            self.benches[state] = b
        self.work = os.path.join(scratch_dir(), stamp)
        self.fortunes = self.benches["quiet"].fortunes
        self.samples, self.shares = {}, {}

    def configs(self):
        out = []
        for w in vs.WORKLOADS:
            if self.a.only and w != self.a.only:
                continue
            for ranks, threads in self.a.layouts:
                out.append((w, "tessera", ranks, threads, 0))
            if not self.a.python:
                continue
            for impl in ["eager"] + (["compile"] if self.a.compile else []):
                for ranks, threads in self.a.layouts:
                    out.append((w, impl, ranks, threads, None))
                    if threads > 1:
                        out.append((w, impl + "-passive", ranks, threads, None))
        return out

    def measure(self):
        configs = self.configs()
        for rep in range(1, self.a.reps + 1):
            for key in configs:
                for state in STATES:
                    b = self.benches[state]
                    fn = b.tessera_sample if key[1] == "tessera" else b.torch_sample
                    t0 = machine.cpu_times()
                    with Hogs(self.a.hogs if state == "loaded" else 0):
                        s, d = fn(key, rep)
                    share = machine.cpu_share(t0, machine.cpu_times())
                    s.source = os.path.relpath(d, self.work)
                    self.samples.setdefault((state, key), []).append(s)
                    self.shares.setdefault((state, key), []).append(share)
                    say(f"rep {rep}/{self.a.reps} {state} {vs.Bench.name(key)}: "
                        f"{s.rate:,.1f} samples/s over {s.seconds:.1f} s ({s.steps} steps)" +
                        (f", others {100 * share['others']:.1f}%" if share else ""))
        if self.a.smoke:
            return {}
        return {k: harness.figure(v) for k, v in self.samples.items()}


def slowdown(quiet, loaded):
    """Quiet rate over loaded rate (how many times longer a step takes
    loaded), with the range the two spreads allow."""
    return harness.ratio(quiet, loaded)


def fmt_slowdown(r):
    s = f"{r.value:.2f}x ({r.lo:.2f}-{r.hi:.2f})"
    return f"**{s} over {SLOWDOWN_BOUND:g}x**" if r.value > SLOWDOWN_BOUND else s


def best_torch(figs, w, state):
    keys = [k for (st, k) in figs if st == state and k[0] == w and k[1] != "tessera"]
    return max(keys, key=lambda k: figs[(state, k)].median) if keys else None


def markdown(a, figs, shares, before, after):
    sys.path.insert(0, os.path.join(ROOT, "bench", "cpu_vs_torch"))
    import report  # noqa: E402  (torch_label, layout)
    out = [f"# bench/cpu_loaded — {datetime.date.today().isoformat()}", "",
           f"Quiet, and loaded: {a.hogs} `yes > /dev/null` processes beside each run, on "
           f"{a.cores} cores. Samples/s, each figure the median (min-max) of {a.reps} runs, each "
           f"timed over a steady-state window of at least {harness.MIN_WINDOW_S:g} s "
           "(bench/lib/harness.py); quiet and loaded runs interleaved. Slowdown: quiet rate over "
           "loaded rate, in brackets the range the two spreads allow; over "
           f"{SLOWDOWN_BOUND:g}x is flagged (issue 53). Layouts are ranks x threads per rank.", ""]
    if not a.python:
        out += ["**No PyTorch**: no Python here imports torch and numpy (--python, "
                "$TORCH_PYTHON): the PyTorch rows are skipped.", ""]
    over = []
    for w, spec in vs.WORKLOADS.items():
        if not any(k[0] == w for _, k in figs):
            continue
        out += [f"## {spec['label']}", "",
                "| run | quiet | loaded | slowdown | loaded, vs PyTorch's best loaded |",
                "|---|---|---|---|---|"]
        tb = best_torch(figs, w, "loaded")
        rows = sorted({k for _, k in figs if k[0] == w and k[1] == "tessera"},
                      key=lambda k: k[2])
        rows += [k for k in (best_torch(figs, w, "quiet"), tb) if k]
        seen = set()
        for k in rows:
            if k in seen or ("quiet", k) not in figs or ("loaded", k) not in figs:
                continue
            seen.add(k)
            q, l = figs[("quiet", k)], figs[("loaded", k)]
            r = slowdown(q, l)
            if r.value > SLOWDOWN_BOUND:
                over.append(f"{spec['label'].split(',')[0]} {vs.Bench.name(k)}: {r.value:.2f}x")
            label = (f"tessera {report.layout(k)}" if k[1] == "tessera" else
                     report.torch_label(k) + " (best " +
                     " and ".join(s for s in STATES if best_torch(figs, w, s) == k) + ")")
            vs_torch = (harness.fmt_ratio(harness.ratio(l, figs[("loaded", tb)]))
                        if k[1] == "tessera" and tb else "")
            out.append(f"| {label} | {harness.fmt_figure(q)} | {harness.fmt_figure(l)} | "
                       f"{fmt_slowdown(r)} | {vs_torch} |")
        out.append("")
    out += ["## Reading it", ""]
    out.append(("**Slowdowns over %gx**: " % SLOWDOWN_BOUND + "; ".join(over) + ".") if over else
               f"No configuration's loaded run is over {SLOWDOWN_BOUND:g}x slower than its quiet "
               "one.")
    quiet_others = [x["others"] for (st, _), v in shares.items() if st == "quiet" for x in v if x]
    if quiet_others:
        out += ["", f"During the quiet runs other processes used at most "
                f"{100 * max(quiet_others):.1f}% of the machine's CPU time" +
                (": other work was running, the quiet figures are those of a shared machine."
                 if max(quiet_others) > 0.10 else ".")]
    out += ["", "## How it runs", "",
            "- bench/cpu_vs_torch's runs (its result file says how tessera and PyTorch run); "
            "tessera at ZeRO stage 0 with run.threads = cores / ranks (what its default, "
            "run.threads = 0, picks: the cores this process may use divided among the ranks).",
            f"- Loaded: {a.hogs} `yes` processes (stdout to /dev/null) start before the run "
            "and are killed after it; a loaded probe sets a loaded run's steps.", ""]
    out += machine.markdown(before, after)
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser(prog="bench/cpu_loaded/run", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "tessera"))
    p.add_argument("--python", default=None)
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--only", choices=sorted(vs.WORKLOADS), default=None)
    p.add_argument("--hogs", type=int, default=2)
    p.add_argument("--reps", type=int, default=harness.MIN_REPS)
    p.add_argument("--seconds", type=float, default=7.0)
    p.add_argument("--compile", action="store_true", help="PyTorch with torch.compile too")
    p.add_argument("--smoke", action="store_true",
                   help="one short run of each configuration: checks that it runs, no figures")
    p.add_argument("--out", default=os.path.join(
        ROOT, "bench", "results", f"cpu_loaded-{datetime.date.today().isoformat()}.md"))
    a = p.parse_args()
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"bench/cpu_loaded: no tessera binary at {a.bin} (tools/build, or --bin)")
    if a.cores < 2:
        sys.exit("bench/cpu_loaded: needs at least 2 cores (--cores)")
    if a.smoke:
        # Short windows, one repetition: a check that every run works.
        a.reps, a.seconds = 1, 1.0
        harness.run_samples = functools.partial(harness.run_samples, min_window_s=0.5)
        for w in vs.WORKLOADS.values():
            w.update(warmup=min(w["warmup"], 20), probe=min(w["probe"], 60))
    elif a.reps < harness.MIN_REPS or a.seconds < harness.MIN_WINDOW_S:
        sys.exit(f"bench/cpu_loaded: at least {harness.MIN_REPS} reps of "
                 f"{harness.MIN_WINDOW_S:g} s (--reps, --seconds)")
    a.bin = os.path.abspath(a.bin)
    a.layouts = [(1, a.cores), (2, a.cores // 2)]
    a.no_compile = not a.compile
    a.python = torch_python(a.python)
    if not a.python:
        say("no Python here imports torch and numpy (--python, $TORCH_PYTHON): "
            "the PyTorch rows are skipped")
    os.makedirs(scratch_dir(), exist_ok=True)
    vs.scratch_dir = scratch_dir  # runs, fortunes and inductor's cache under this bench's
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(scratch_dir(), "inductor"))
    b = Loaded(a)
    if a.only in (None, "gpt2") and not os.path.exists(f"{b.fortunes}/fortunes_train_000000.bin"):
        subprocess.run([os.path.join(ROOT, "tools", "prepare-fortunes"), "--tessera", a.bin,
                        "--out", b.fortunes], check=True, stdout=subprocess.DEVNULL)
    before = machine.snapshot(a.bin, a.python)
    say(f"load before: {before['load']['load1']:.2f}; runs under {b.work}")
    try:
        figs = b.measure()
    except BenchError as e:
        sys.exit(f"bench/cpu_loaded: {e}")
    if a.smoke:
        say("smoke run done: every configuration ran (no figures, no result file)")
        return
    after = machine.snapshot(a.bin)
    text = markdown(a, figs, b.shares, before, after)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)
    raw = {"before": before, "after": after,
           "args": {k: v for k, v in vars(a).items()},
           "figures": {f"{st}-{vs.Bench.name(k)}": dict(f.as_json(), shares=b.shares[(st, k)])
                       for (st, k), f in figs.items()}}
    with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
        json.dump(raw, f, indent=1)
    print(text)
    say(f"written to {a.out}")


if __name__ == "__main__":
    main()
