"""bench/cpu_vs_torch: tessera against PyTorch at its best, on the same CPU cores.

  bench/cpu_vs_torch/run [--bin TESSERA] [--python PY] [--cores N] [--only mlp|gpt2|llama]
                         [--reps R] [--seconds S] [--no-compile] [--out OUT.md]

Workloads (issue 13): the quickstart MLP (784-256-128-10, global batch 128,
AdamW) and gpt2-tiny-cpu (4 layers, width 128, context 128, micro batch 16
per rank), and llama-tiny-cpu (2 layers, width 128, GQA 4/2, context 128, micro
batch 16 per rank). Layouts on N cores (--cores, default all): 1 rank x N threads
and 2 ranks x N/2 threads (and N x 1 where N > 2). tessera runs each layout
at ZeRO stage 0, and at stage 2 where there is more than one rank; PyTorch
runs each layout eager and with torch.compile (DDP over gloo at more than
one rank), and with OMP_WAIT_POLICY=PASSIVE where a rank has several threads. Every tessera row is set against PyTorch's best layout: the
fastest eager configuration, and the fastest of all (torch.compile too).

Measurement (bench/lib/harness.py, issue 24): every figure is the median
(min-max) of --reps (default 3, at least 3) runs, each timed over a
steady-state window of at least 5 s (--seconds, default 7) counted inside
the run from its step timestamps (tessera's metrics.jsonl, the anchor's
own). The runs of a repetition go round every configuration in turn, so a
change in the machine's load falls on all of them. A tessera run's steps
come from a probe run of the same layout. A figure whose spread exceeds 10%
is marked noisy; a negative or zero rate stops the bench.

Writes bench/results/cpu_vs_torch-DATE.md (--out) and the raw samples
beside it (.json; --from-json RAW writes the result file again from them,
with --notes FILE appended); scratch (runs, the fortune shards, a PyTorch venv when
no Python here imports torch, inductor's cache) under $TESSERA_BENCH_SCRATCH,
else ${TMPDIR:-/tmp}/tessera-bench. PyTorch: --python, else $TORCH_PYTHON,
else python3 when it imports torch, else that venv, filled from PyPI.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "lib"))
import harness  # noqa: E402
import machine  # noqa: E402
from harness import BenchError  # noqa: E402

WORKLOADS = {
    # config; warm-up steps; tessera's probe run (steps); PyTorch's probe steps
    # (inside its run, they time a step); tokens per sample
    "mlp": dict(config="configs/quickstart.toml", warmup=100, probe=400, torch_probe=200, tokens=None,
                label="MLP 784-256-128-10, global batch 128"),
    "gpt2": dict(config="configs/gpt2-tiny-cpu.toml", warmup=5, probe=15, torch_probe=5, tokens=128,
                 label="gpt2-tiny-cpu, micro batch 16 per rank"),
    "llama": dict(config="configs/llama-tiny-cpu.toml", warmup=5, probe=15, torch_probe=5,
                  tokens=128, label="llama-tiny-cpu (2 x 128, GQA 4/2), micro batch 16 per rank"),
}


def say(msg):
    print(f"bench/cpu_vs_torch: {msg}", flush=True)


def scratch_dir():
    base = os.environ.get("TESSERA_BENCH_SCRATCH") or os.path.join(
        os.environ.get("TMPDIR", "/tmp"), "tessera-bench")
    return os.path.join(base, "cpu_vs_torch")


def find_python(arg, scratch):
    for py in (arg, os.environ.get("TORCH_PYTHON")):
        if py:
            return py
    if subprocess.run([sys.executable, "-c", "import torch, numpy"],
                      capture_output=True).returncode == 0:
        return sys.executable
    venv = os.path.join(os.path.dirname(scratch), "venv")
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        say(f"installing PyTorch from PyPI into {venv} (the benchmark's own, large)")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([py, "-m", "pip", "install", "--quiet", "torch", "numpy"], check=True)
    return py


def layouts(cores):
    out = [(1, cores), (2, cores // 2)]
    if cores > 2:
        out.append((cores, 1))
    return out


class Bench:
    def __init__(self, a):
        self.a, self.bin = a, a.bin
        self.work = os.path.join(scratch_dir(), datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
        os.makedirs(self.work, exist_ok=True)
        self.fortunes = os.path.join(scratch_dir(), "fortunes")
        self.plans, self.samples, self.runs, self.shares = {}, {}, {}, {}

    # tessera ------------------------------------------------------------
    def tessera_cmd(self, w, ranks, threads, stage, steps, log_every, run_dir):
        cmd = [self.bin, "run"] + (["-n", str(ranks)] if ranks > 1 else [])
        cmd += [os.path.join(ROOT, WORKLOADS[w]["config"]),
                "--set", f"run.threads={threads}", "--set", f"run.steps={steps}",
                "--set", f"run.log_every={log_every}", "--set", "run.eval_every=1000000000",
                "--set", "log.plot=false", "--set", 'log.trace=""',
                "--set", "checkpoint.every=0", "--set", "checkpoint.final=false", "--set", f'zero.plugin="stage{stage}"',
                "--set", f'run.dir="{run_dir}"', "--set", f'checkpoint.dir="{run_dir}/ckpt"']
        if w == "mlp":
            cmd += ["--set", f"batch.micro={128 // ranks}"]
        else:
            cmd += ["--set", f'data.train.files="{self.fortunes}/fortunes_train_*.bin"',
                    "--set", f'data.eval.files="{self.fortunes}/fortunes_eval_*.bin"',
                    "--set", "data.eval.limit=16"]
        return cmd

    def run_logged(self, cmd, log, what, env=None):
        with open(log, "w") as f:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        if r.returncode != 0:
            with open(log) as f:
                tail = f.read().splitlines()[-25:]
            raise BenchError(f"{what} failed (exit {r.returncode}); {log}:\n" + "\n".join(tail))

    def tessera_sample(self, key, rep):
        w, _, ranks, threads, stage = key
        spec = WORKLOADS[w]
        if key not in self.plans:
            d = os.path.join(self.work, f"{self.name(key)}-probe")
            self.run_logged(self.tessera_cmd(w, ranks, threads, stage, spec["probe"],
                                             max(1, spec["probe"] // 40), d),
                            d + ".log", f"tessera probe {self.name(key)}")
            self.plans[key] = harness.plan(harness.read_steps(f"{d}/metrics.jsonl"),
                                           self.a.seconds, spec["warmup"])
        p = self.plans[key]
        for attempt in range(3):
            d = os.path.join(self.work, f"{self.name(key)}-r{rep}" + (f"-{attempt}" if attempt else ""))
            self.run_logged(self.tessera_cmd(w, ranks, threads, stage, p["steps"], p["log_every"], d),
                            d + ".log", f"tessera {self.name(key)}")
            m = f"{d}/metrics.jsonl"
            try:
                return harness.run_samples(m, harness.per_step_of(m), spec["warmup"])[0], d
            except BenchError as e:
                if "shorter than" not in str(e) or attempt == 2:
                    raise
                # Faster than the probe said (the load fell): a longer run.
                p["steps"] = int(p["steps"] * 1.6) // p["log_every"] * p["log_every"]
                say(f"{e}; again with {p['steps']} steps")

    # PyTorch ------------------------------------------------------------
    def torch_sample(self, key, rep):
        w, impl, ranks, threads, _ = key
        spec = WORKLOADS[w]
        warmup = spec["warmup"] if impl.startswith("eager") else max(spec["warmup"], 10)
        env = dict(os.environ)
        if impl.endswith("-passive"):
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        seconds = self.a.seconds
        for attempt in range(3):
            d = os.path.join(self.work, f"{self.name(key)}-r{rep}" + (f"-{attempt}" if attempt else ""))
            os.makedirs(d, exist_ok=True)
            cmd = [self.a.python, os.path.join(HERE, "torch_cpu.py"), w, "--ranks", str(ranks),
                   "--threads", str(threads), "--seconds", f"{seconds:g}", "--warmup", str(warmup),
                   "--probe", str(spec["torch_probe"]), "--metrics", f"{d}/metrics.jsonl",
                   "--port", str(29611 + rep)]
            if w != "mlp":
                cmd += ["--data", f"{self.fortunes}/fortunes_train_*.bin"]
            if impl.startswith("compile"):
                cmd.append("--compile")
            self.run_logged(cmd, d + ".log", f"PyTorch {self.name(key)}", env)
            with open(d + ".log") as f:
                j = json.loads([x for x in f if x.startswith('{"impl"')][-1])
            try:
                return harness.run_samples(f"{d}/metrics.jsonl", j["samples_per_step"], warmup)[0], d
            except BenchError as e:
                if "shorter than" not in str(e) or attempt == 2:
                    raise
                # Its probe steps were slower than the rest (the load fell): longer.
                seconds *= 1.6
                say(f"{e}; again for {seconds:g} s")

    # --------------------------------------------------------------------
    @staticmethod
    def name(key):
        w, impl, ranks, threads, stage = key
        return f"{w}-{impl}{'-s%d' % stage if impl == 'tessera' else ''}-{ranks}x{threads}"

    def configs(self):
        out = []
        for w in WORKLOADS:
            if self.a.only and w != self.a.only:
                continue
            for ranks, threads in layouts(self.a.cores):
                out.append((w, "tessera", ranks, threads, 0))
                if ranks > 1:
                    out.append((w, "tessera", ranks, threads, 2))
            for impl in ["eager"] + ([] if self.a.no_compile else ["compile"]):
                for ranks, threads in layouts(self.a.cores):
                    out.append((w, impl, ranks, threads, None))
                    # libgomp's default spin-waiting collapses on a shared
                    # VM (2.2 against 34 GFLOP/s in an sgemm at 2 threads
                    # here): PyTorch with OMP_WAIT_POLICY=PASSIVE too, where
                    # a rank has more than one thread.
                    if threads > 1:
                        out.append((w, impl + "-passive", ranks, threads, None))
        return out

    def measure(self):
        configs = self.configs()
        for rep in range(1, self.a.reps + 1):
            for key in configs:
                load = machine.load()["load1"]
                t0 = machine.cpu_times()
                fn = self.tessera_sample if key[1] == "tessera" else self.torch_sample
                s, d = fn(key, rep)
                # What the rest of the machine did meanwhile (the load
                # average cannot say: it still holds the previous run).
                share = machine.cpu_share(t0, machine.cpu_times())
                s.source = os.path.relpath(d, self.work)
                self.samples.setdefault(key, []).append((s, load))
                self.shares.setdefault(key, []).append(share)
                say(f"rep {rep}/{self.a.reps} {self.name(key)}: {s.rate:,.1f} samples/s over "
                    f"{s.seconds:.1f} s ({s.steps} steps), load {load:.2f}" +
                    (f", others {100 * share['others']:.1f}%, steal {100 * share['steal']:.1f}%"
                     if share else ""))
        return {k: harness.figure([s for s, _ in v]) for k, v in self.samples.items()}


def main():
    p = argparse.ArgumentParser(prog="bench/cpu_vs_torch/run", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "tessera"))
    p.add_argument("--python", default=None)
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--only", choices=sorted(WORKLOADS), default=None)
    p.add_argument("--reps", type=int, default=harness.MIN_REPS)
    p.add_argument("--seconds", type=float, default=7.0)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--out", default=os.path.join(
        ROOT, "bench", "results", f"cpu_vs_torch-{datetime.date.today().isoformat()}.md"))
    p.add_argument("--notes", default=None, help="a markdown file appended to the result")
    p.add_argument("--from-json", default=None, metavar="RAW",
                   help="no runs: the result file again from a run's .json (its raw samples)")
    a = p.parse_args()
    sys.path.insert(0, HERE)
    import report
    if a.from_json:
        with open(a.from_json) as f:
            raw = json.load(f)
        ra, samples, figs, shares = report.from_raw(raw)
        ra.notes = a.notes or ra.notes
        b = SimpleNamespace(samples=samples, shares=shares, name=Bench.name)
        text = report.markdown(ra, b, figs, raw["before"], raw["after"], WORKLOADS)
        with open(a.out, "w") as f:
            f.write(text)
        print(text)
        return
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"bench/cpu_vs_torch: no tessera binary at {a.bin} (tools/build, or --bin)")
    if a.cores < 2:
        sys.exit("bench/cpu_vs_torch: needs at least 2 cores (--cores)")
    if a.reps < harness.MIN_REPS or a.seconds < harness.MIN_WINDOW_S:
        sys.exit(f"bench/cpu_vs_torch: at least {harness.MIN_REPS} reps of "
                 f"{harness.MIN_WINDOW_S:g} s (--reps, --seconds)")
    a.bin = os.path.abspath(a.bin)
    os.makedirs(scratch_dir(), exist_ok=True)
    a.python = find_python(a.python, scratch_dir())
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(scratch_dir(), "inductor"))
    b = Bench(a)
    if a.only != "mlp" and not os.path.exists(f"{b.fortunes}/fortunes_train_000000.bin"):
        subprocess.run([os.path.join(ROOT, "tools", "prepare-fortunes"), "--tessera", a.bin,
                        "--out", b.fortunes], check=True, stdout=subprocess.DEVNULL)
    before = machine.snapshot(a.bin, a.python)
    say(f"load before: {before['load']['load1']:.2f}; runs under {b.work}")
    try:
        figs = b.measure()
    except BenchError as e:
        sys.exit(f"bench/cpu_vs_torch: {e}")
    after = machine.snapshot(a.bin)
    text = report.markdown(a, b, figs, before, after, WORKLOADS)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)
    raw = {"before": before, "after": after, "args": {k: v for k, v in vars(a).items()},
           "figures": {b.name(k): dict(f.as_json(), loads=[l for _, l in b.samples[k]],
                                       shares=b.shares.get(k, []))
                       for k, f in figs.items()}}
    with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
        json.dump(raw, f, indent=1)
    print(text)
    say(f"written to {a.out}")


if __name__ == "__main__":
    main()
