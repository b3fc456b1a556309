"""The measuring harness every bench under bench/ uses (issue 24).

A figure is the median, with min-max, of at least MIN_REPS samples; a
sample is the rate over one timed window of at least MIN_WINDOW_S seconds
of steady-state work, counted inside the run: from the step timestamps a
run writes itself (tessera: run.dir/metrics.jsonl; the anchors: the same
format through StepClock), never from the difference of two processes.
A figure whose spread (max - min) / median exceeds NOISY_SPREAD is marked
noisy; a negative, zero or non-finite rate is an error (BenchError), not
a row.

metrics.jsonl: one JSON object per line; the lines used are those with
"step" and "elapsed_s" (seconds since training began, evaluation
excluded) whose "type" is absent or "train".

As a command (for the bench scripts written in bash):

  harness.py sample METRICS [--per-step N] [--warmup-steps W] [--warmup-s S]
                            [--windows K] [--min-window S]
      the samples of one run, one JSON object per line ({"rate", "seconds",
      "steps"}); --per-step defaults to summary.json's samples / steps
      beside METRICS; --windows K splits the steady state into K
      consecutive windows, each of at least --min-window seconds.
  harness.py figure [same options] METRICS...
      one JSON figure over the runs' samples (one per file, or --windows
      per file): median, min, max, spread, noisy, n, samples.
  harness.py plan METRICS --seconds S [--warmup-steps W] [--log-s L]
      from a probe run: the run.steps and run.log_every that give a
      steady window of S seconds after W warm-up steps (JSON).
  harness.py env [--bin TESSERA] [--python PY]
      the machine, software and load now (machine.py), as JSON.
  harness.py env-md BEFORE.json AFTER.json
      the result file's environment section, in markdown.

Every error exits with status 1 and one line on stderr.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field

MIN_REPS = 3
MIN_WINDOW_S = 5.0
NOISY_SPREAD = 0.10


class BenchError(Exception):
    """A measurement the harness refuses to turn into a row."""


@dataclass
class Sample:
    rate: float  # units (samples, tokens) per second
    seconds: float  # the timed window
    steps: int  # steps inside it
    source: str = ""

    def as_json(self):
        return {"rate": self.rate, "seconds": self.seconds, "steps": self.steps,
                "source": self.source}


@dataclass
class Figure:
    median: float
    lo: float
    hi: float
    samples: list = field(default_factory=list)

    @property
    def n(self):
        return len(self.samples)

    @property
    def spread(self):
        return (self.hi - self.lo) / self.median

    @property
    def noisy(self):
        return self.spread > NOISY_SPREAD

    def as_json(self):
        return {"median": self.median, "min": self.lo, "max": self.hi, "spread": self.spread,
                "noisy": self.noisy, "n": self.n,
                "samples": [s.as_json() if isinstance(s, Sample) else s for s in self.samples]}

    @staticmethod
    def from_json(j):
        return Figure(j["median"], j["min"], j["max"], list(j.get("samples", [])))


@dataclass
class Ratio:
    value: float  # median over median
    lo: float  # the worst case: min of ours over max of theirs
    hi: float  # the best case
    noisy: bool


def check_rate(rate, seconds, min_window_s=MIN_WINDOW_S, source=""):
    """Refuses what is not a rate over a long enough window (seconds None:
    the rate alone)."""
    where = f"{source}: " if source else ""
    if not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
        raise BenchError(f"{where}a rate of {rate!r}: a negative, zero or non-finite rate is an "
                         "error, not a row")
    if seconds is None:
        return
    if not math.isfinite(seconds) or seconds < min_window_s:
        raise BenchError(f"{where}a timed window of {seconds:.3g} s: shorter than "
                         f"{min_window_s:g} s of steady-state work (run more steps)")


def read_steps(path):
    """The (step, elapsed_s) pairs of a metrics.jsonl, in order."""
    out = []
    try:
        f = open(path)
    except OSError as e:
        raise BenchError(f"{path}: {e.strerror}") from None
    with f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                j = json.loads(raw)
            except ValueError:
                raise BenchError(f"{path}:{n}: not a JSON line") from None
            if not isinstance(j, dict) or j.get("type", "train") != "train":
                continue
            if "step" not in j or "elapsed_s" not in j:
                continue
            step, t = j["step"], float(j["elapsed_s"])
            if out and (step <= out[-1][0] or t < out[-1][1]):
                raise BenchError(f"{path}:{n}: step {step} at {t} s after step {out[-1][0]} at "
                                 f"{out[-1][1]} s: steps and times must increase")
            out.append((step, t))
    return out


def steady(points, warmup_steps=0, warmup_s=0.0):
    """The points from the first one past both warm-ups on: it is the start
    of the timed window, so the warm-up steps' time is outside it."""
    return [p for p in points if p[0] >= warmup_steps and p[1] >= warmup_s]


def per_step_of(metrics_path):
    """Units per step from the summary.json beside a tessera metrics.jsonl."""
    path = os.path.join(os.path.dirname(os.path.abspath(metrics_path)), "summary.json")
    try:
        with open(path) as f:
            s = json.load(f)
    except (OSError, ValueError) as e:
        raise BenchError(f"{path}: no summary to take samples per step from ({e}); "
                         "pass --per-step") from None
    if not s.get("steps"):
        raise BenchError(f"{path}: no steps")
    return s["samples"] / s["steps"]


def window_cuts(pts, windows):
    """Indices into pts that split it into `windows` consecutive windows of
    about equal time: window k ends at the first point at or past
    t0 + (k + 1) / windows of the span."""
    t0, total = pts[0][1], pts[-1][1] - pts[0][1]
    cuts = [0]
    for k in range(1, windows):
        goal = t0 + total * k / windows
        i = next((j for j in range(cuts[-1] + 1, len(pts)) if pts[j][1] >= goal), len(pts) - 1)
        cuts.append(i)
    cuts.append(len(pts) - 1)
    return cuts


def steady_points(path, warmup_steps=0, warmup_s=0.0, windows=1):
    """A run's steady (step, elapsed_s) points, at least windows + 1 of them."""
    pts = steady(read_steps(path), warmup_steps, warmup_s)
    if len(pts) < windows + 1:
        raise BenchError(f"{path}: {len(pts)} logged step(s) after the warm-up "
                         f"({warmup_steps} steps, {warmup_s:g} s): need {windows + 1} "
                         "(more steps, or a smaller run.log_every)")
    return pts


def run_samples(path, per_step, warmup_steps=0, warmup_s=0.0, windows=1,
                min_window_s=MIN_WINDOW_S):
    """The samples of one run: its steady state as `windows` consecutive
    windows of about equal length, each at least min_window_s long."""
    pts = steady_points(path, warmup_steps, warmup_s, windows)
    cuts = window_cuts(pts, windows)
    out = []
    for a, b in zip(cuts, cuts[1:]):
        steps, secs = pts[b][0] - pts[a][0], pts[b][1] - pts[a][1]
        rate = steps * per_step / secs if secs > 0 else float("nan") if steps else 0.0
        src = f"{path} steps {pts[a][0]}-{pts[b][0]}"
        check_rate(rate, secs, min_window_s, src)
        out.append(Sample(rate, secs, steps, src))
    return out


def check_settings(reps, window_s=None):
    """Refuses, before any run, settings whose figure would be refused at the
    end (a bench that ran for minutes and then printed nothing)."""
    if reps < MIN_REPS:
        raise BenchError(f"REPS={reps}: a figure needs at least {MIN_REPS} samples (set REPS >= {MIN_REPS})")
    if window_s is not None and not window_s >= MIN_WINDOW_S:
        raise BenchError(f"WINDOW_S={window_s:g}: a timed window must be at least {MIN_WINDOW_S:g} s "
                         f"(set WINDOW_S >= {MIN_WINDOW_S:g})")


def figure(samples, min_reps=MIN_REPS):
    """The median (min-max) of the samples (Sample or plain rates)."""
    rates = [s.rate if isinstance(s, Sample) else s for s in samples]
    if len(rates) < min_reps:
        raise BenchError(f"{len(rates)} sample(s): a figure needs at least {min_reps}")
    for s in samples:
        if isinstance(s, Sample):
            check_rate(s.rate, s.seconds, 0.0, s.source)
        else:
            check_rate(s, None)
    return Figure(statistics.median(rates), min(rates), max(rates), list(samples))


def figure_of_runs(paths, per_step=None, warmup_steps=0, warmup_s=0.0, windows=1,
                   min_window_s=MIN_WINDOW_S):
    """The figure over the samples of runs (one metrics.jsonl each; per_step
    None: from each run's summary.json)."""
    got = []
    for path in paths:
        per = per_step if per_step is not None else per_step_of(path)
        got += run_samples(path, per, warmup_steps, warmup_s, windows, min_window_s)
    return figure(got)


def ratio(a, b):
    """a over b, with the range the two spreads allow."""
    return Ratio(a.median / b.median, a.lo / b.hi, a.hi / b.lo, a.noisy or b.noisy)


PLAN_MARGIN = 1.15


def plan(points, seconds, warmup_steps=0, log_s=0.1):
    """From a probe run's points: {"steps", "log_every", "steps_per_s"} for
    a run with a steady window of `seconds` after `warmup_steps`, logging
    about every `log_s` seconds. The probe's rate is taken past its own
    warm-up (warmup_steps, or half the probe when it is shorter). The window
    is planned PLAN_MARGIN longer than asked: a run a little slower than
    its probe (or a window cut at log points) still times `seconds`, where
    planning it exactly had runs refused at 4.97 s of a 5 s minimum."""
    if not points:
        raise BenchError("the probe logged no steps to plan from")
    skip = min(warmup_steps, points[-1][0] // 2)
    pts = [p for p in points if p[0] >= skip]
    if len(pts) < 2 or pts[-1][1] <= pts[0][1]:
        raise BenchError("the probe logged too few steps to plan from (a longer probe, or a "
                         "smaller run.log_every)")
    steps_per_s = (pts[-1][0] - pts[0][0]) / (pts[-1][1] - pts[0][1])
    log_every = max(1, int(steps_per_s * log_s))
    timed = math.ceil(steps_per_s * seconds * PLAN_MARGIN / log_every) * log_every
    start = math.ceil(warmup_steps / log_every) * log_every
    return {"steps": start + timed, "log_every": log_every, "steps_per_s": steps_per_s}


def load_json(path):
    """A JSON file, or the last line of a file of JSON lines."""
    with open(path) as f:
        text = f.read().strip()
    try:
        return json.loads(text)
    except ValueError:
        return json.loads(text.splitlines()[-1])


def load_json_or_empty(path):
    """load_json, or {} where the file is missing, empty or not JSON (an
    anchor that did not run)."""
    try:
        return load_json(path)
    except (OSError, ValueError, IndexError):
        return {}


def tessera_runs(work, prefix, reps, warmup_steps, what, refused):
    """The figure (samples/s) and peak memory of the tessera runs
    WORK/{prefix}r1..rREPS (each a run.dir: metrics.jsonl, summary.json), as
    the GPU benches' reports read them: (None, ...) with the reason appended
    to `refused` when the runs give no figure; the memory ("" when unknown)
    from run 1's summary."""
    runs = [os.path.join(work, f"{prefix}r{r}", "metrics.jsonl") for r in range(1, reps + 1)]
    fig, mem = None, ""
    try:
        fig = figure_of_runs(runs, None, warmup_steps)
    except BenchError as e:
        refused.append(f"{what}: {e}")
    try:
        s = load_json(os.path.join(work, f"{prefix}r1", "summary.json"))
        mem = f"{s['peak_memory_bytes'] / 2**30:.2f} GiB (engine allocations)"
    except (OSError, ValueError, KeyError):
        pass
    return fig, mem


class StepClock:
    """Step timestamps an anchor takes in memory (no I/O inside the timed
    steps) and writes as metrics.jsonl for the harness to read."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.points = []

    def mark(self, step):
        self.points.append((step, time.perf_counter() - self.t0))

    def write(self, path):
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        with open(path, "w") as f:
            for s, t in self.points:
                f.write(json.dumps({"type": "train", "step": s, "elapsed_s": t}) + "\n")


def run_steady(step, clock, warmup_steps, seconds, agree=None, probe_steps=5):
    """Runs `step` warmup_steps times, then `probe_steps` more to time it,
    then enough for a window of `seconds` (agree(n) -> the n every rank
    uses, e.g. rank 0's through a broadcast). Marks every step on `clock`.
    Returns the last step's return value."""
    out, i = None, 0
    for _ in range(warmup_steps):
        i += 1
        out = step(i)
        clock.mark(i)
    t = time.perf_counter()
    for _ in range(probe_steps):
        i += 1
        out = step(i)
        clock.mark(i)
    per = (time.perf_counter() - t) / probe_steps
    n = max(1, math.ceil(seconds / max(per, 1e-9)))
    if agree:
        n = agree(n)
    for _ in range(n):
        i += 1
        out = step(i)
        clock.mark(i)
    return out


def repeat_windows(step, reps, steps=0, window_s=5.5, units_per_step=1.0):
    """For micro-benchmarks timed in-process (one operation a step): one
    warm-up step, which also times a step when steps is 0 (then each window
    is as many steps as fill window_s), then `reps` windows of `steps`
    steps. Returns a Sample per window (units_per_step x steps / seconds)."""
    t = time.perf_counter()
    step()
    first = time.perf_counter() - t
    if steps <= 0:
        steps = max(1, math.ceil(window_s / max(first, 1e-9)))
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(steps):
            step()
        dt = time.perf_counter() - t
        out.append(Sample(units_per_step * steps / dt, dt, steps))
    return out


def breakdowns(metrics, warmup):
    """Each logged train line's log.breakdown (docs/observability.md) past
    the warm-up steps."""
    out = []
    for raw in open(metrics):
        j = json.loads(raw)
        if j.get("type", "train") == "train" and j.get("step", 0) > warmup and "breakdown" in j:
            out.append(j["breakdown"])
    return out


def mean_part(parts, *keys):
    """The mean per step of one part of the breakdowns (keys: a path into
    each, e.g. "offload", "cpu_step"); nan where no breakdown has it."""
    vals = []
    for p in parts:
        x = p
        for k in keys:
            x = x.get(k, {}) if isinstance(x, dict) else {}
        if isinstance(x, (int, float)):
            vals.append(x / max(1, p.get("steps", 1)))
    return statistics.mean(vals) if vals else float("nan")


def fmt_num(x):
    if x >= 1e7:
        return f"{x:.3g}"
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def fmt_figure(f, scale=1.0):
    """'95,409 (93,100-97,200)', and ' **noisy 14%**' past NOISY_SPREAD."""
    s = f"{fmt_num(f.median * scale)} ({fmt_num(f.lo * scale)}-{fmt_num(f.hi * scale)})"
    return s + (f" **noisy {100 * f.spread:.0f}%**" if f.noisy else "")


def fmt_ratio(r):
    s = f"{r.value:.2f}x ({r.lo:.2f}-{r.hi:.2f})"
    if r.value < 1.0:
        s = f"**{s} below**"
    return s + (" noisy" if r.noisy else "")


def _samples_args(p):
    p.add_argument("--per-step", type=float, default=None)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--warmup-s", type=float, default=0.0)
    p.add_argument("--windows", type=int, default=1)
    p.add_argument("--min-window", type=float, default=MIN_WINDOW_S)


def _samples(a, path):
    per = a.per_step if a.per_step is not None else per_step_of(path)
    return run_samples(path, per, a.warmup_steps, a.warmup_s, a.windows, a.min_window)


def main(argv=None):
    p = argparse.ArgumentParser(prog="harness.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("metrics")
    _samples_args(s)
    f = sub.add_parser("figure")
    f.add_argument("metrics", nargs="+")
    _samples_args(f)
    f.add_argument("--min-reps", type=int, default=MIN_REPS)
    pl = sub.add_parser("plan")
    pl.add_argument("metrics")
    pl.add_argument("--seconds", type=float, required=True)
    pl.add_argument("--warmup-steps", type=int, default=0)
    pl.add_argument("--log-s", type=float, default=0.1)
    c = sub.add_parser("check")
    c.add_argument("--reps", type=int, required=True)
    c.add_argument("--window", type=float, default=None)
    e = sub.add_parser("env")
    e.add_argument("--bin", default=None)
    e.add_argument("--python", default=None)
    em = sub.add_parser("env-md")
    em.add_argument("before")
    em.add_argument("after")
    a = p.parse_args(argv)
    try:
        if a.cmd == "sample":
            for x in _samples(a, a.metrics):
                print(json.dumps(x.as_json()))
        elif a.cmd == "figure":
            got = [x for m in a.metrics for x in _samples(a, m)]
            print(json.dumps(figure(got, a.min_reps).as_json()))
        elif a.cmd == "check":
            check_settings(a.reps, a.window)
        elif a.cmd == "plan":
            print(json.dumps(plan(read_steps(a.metrics), a.seconds, a.warmup_steps, a.log_s)))
        elif a.cmd == "env":
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import machine
            print(json.dumps(machine.snapshot(a.bin, a.python)))
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import machine
            before, after = (load_json(x) for x in (a.before, a.after))
            print("\n".join(machine.markdown(before, after)))
    except BenchError as err:
        print(f"bench harness: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
