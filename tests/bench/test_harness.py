"""bench/lib/harness.py: its statistics, its windows over metrics.jsonl, and
its refusals (a negative or zero rate, a short window, too few samples).
No torch, no tessera binary: made-up metrics files only."""
import io
import json
import os
import shutil
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "lib"))
import harness  # noqa: E402
import machine  # noqa: E402
from harness import BenchError, Sample  # noqa: E402


def write_metrics(path, points, extra=None, summary=None):
    """points: (step, elapsed_s); extra: lines inserted verbatim after the first."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for i, (s, t) in enumerate(points):
            f.write(json.dumps({"type": "train", "step": s, "loss": 1.0, "elapsed_s": t}) + "\n")
            if i == 0 and extra:
                for e in extra:
                    f.write(json.dumps(e) + "\n")
    if summary:
        with open(os.path.join(os.path.dirname(path), "summary.json"), "w") as f:
            json.dump(summary, f)
    return path


def steady_run(step_s, steps, start=0.5, every=1):
    """A run whose first step takes `start` s, then `step_s` s per step."""
    return [(s, start + (s - 1) * step_s) for s in range(1, steps + 1) if s % every == 0 or s == 1]


class Statistics(unittest.TestCase):
    def test_median_min_max_and_spread(self):
        f = harness.figure([100.0, 104.0, 98.0, 101.0, 103.0])
        self.assertEqual(f.median, 101.0)
        self.assertEqual((f.lo, f.hi, f.n), (98.0, 104.0, 5))
        self.assertAlmostEqual(f.spread, 6.0 / 101.0)
        self.assertFalse(f.noisy)

    def test_even_count_median(self):
        self.assertEqual(harness.figure([1.0, 2.0, 3.0, 10.0]).median, 2.5)

    def test_noisy_past_ten_percent(self):
        self.assertFalse(harness.figure([95.0, 100.0, 105.0]).noisy)  # exactly 10%
        f = harness.figure([94.0, 100.0, 105.0])
        self.assertTrue(f.noisy)
        self.assertIn("noisy 11%", harness.fmt_figure(f))
        self.assertNotIn("noisy", harness.fmt_figure(harness.figure([99.0, 100.0, 101.0])))

    def test_negative_rate_is_refused(self):
        with self.assertRaisesRegex(BenchError, "negative, zero or non-finite"):
            harness.figure([100.0, -68.0, 101.0])

    def test_zero_and_nan_rates_are_refused(self):
        for bad in (0.0, float("nan"), float("inf")):
            with self.assertRaises(BenchError):
                harness.figure([100.0, bad, 101.0])

    def test_negative_sample_is_refused(self):
        s = [Sample(100.0, 6.0, 600), Sample(-5.0, 6.0, 600), Sample(99.0, 6.0, 600)]
        with self.assertRaisesRegex(BenchError, "not a row|negative"):
            harness.figure(s)

    def test_fewer_than_three_is_refused(self):
        with self.assertRaisesRegex(BenchError, "at least 3"):
            harness.figure([100.0, 101.0])

    def test_settings_that_would_be_refused_are_refused_before_a_run(self):
        harness.check_settings(3, 5.0)
        harness.check_settings(5)
        with self.assertRaisesRegex(BenchError, "REPS=2: .*at least 3"):
            harness.check_settings(2, 6.0)
        with self.assertRaisesRegex(BenchError, "WINDOW_S=4: .*at least 5"):
            harness.check_settings(3, 4.0)
        with self.assertRaisesRegex(BenchError, "WINDOW_S=nan"):
            harness.check_settings(3, float("nan"))

    def test_ratio_and_its_range(self):
        a, b = harness.figure([110.0, 120.0, 130.0]), harness.figure([90.0, 100.0, 110.0])
        r = harness.ratio(a, b)
        self.assertAlmostEqual(r.value, 1.2)
        self.assertAlmostEqual(r.lo, 1.0)
        self.assertAlmostEqual(r.hi, 130.0 / 90.0)
        self.assertTrue(r.noisy)  # both spreads are 16.7% and 20%
        self.assertNotIn("below", harness.fmt_ratio(r))
        self.assertIn("below", harness.fmt_ratio(harness.ratio(b, a)))


class Windows(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="bench-harness-")
        self.addCleanup(shutil.rmtree, self.dir)

    def path(self, name):
        return os.path.join(self.dir, name, "metrics.jsonl")

    def test_rate_from_step_timestamps_after_warmup(self):
        # 1 s of start-up in step 1, then 10 ms a step for 1000 steps: 128 samples a step.
        m = write_metrics(self.path("a"), steady_run(0.01, 1001, start=1.0))
        [s] = harness.run_samples(m, 128, warmup_steps=1)
        self.assertEqual(s.steps, 1000)
        self.assertAlmostEqual(s.seconds, 10.0)
        self.assertAlmostEqual(s.rate, 12800.0)

    def test_warmup_in_seconds_and_steps(self):
        pts = [(1, 3.0)] + [(s, 3.0 + (s - 1) * 0.01) for s in range(2, 1002)]
        m = write_metrics(self.path("b"), pts)
        [s] = harness.run_samples(m, 1, warmup_steps=0, warmup_s=4.0)
        self.assertEqual(s.steps, 900)  # from step 101 (4.0 s) to step 1001
        self.assertAlmostEqual(s.rate, 100.0)

    def test_eval_and_other_lines_are_skipped(self):
        extra = [{"type": "eval", "step": 5, "eval_loss": 2.0}, {"note": "no step here"}]
        m = write_metrics(self.path("c"), steady_run(0.01, 701, every=100), extra)
        self.assertEqual(len(harness.read_steps(m)), 8)

    def test_window_under_five_seconds_is_refused(self):
        m = write_metrics(self.path("d"), steady_run(0.01, 401))
        with self.assertRaisesRegex(BenchError, "shorter than 5 s"):
            harness.run_samples(m, 1)

    def test_consecutive_windows_of_one_run(self):
        # 0.1 s a step for 200 steps, then 0.12: three windows of ~6.7 s.
        pts, t = [], 0.0
        for s in range(1, 201):
            t += 0.1 if s <= 120 else 0.12
            pts.append((s, t))
        m = write_metrics(self.path("e"), pts)
        got = harness.run_samples(m, 4, windows=3)
        self.assertEqual(len(got), 3)
        self.assertEqual(sum(x.steps for x in got), 199)
        self.assertGreater(got[0].rate, got[2].rate)
        self.assertAlmostEqual(got[0].rate, 40.0, places=6)
        f = harness.figure(got)
        self.assertAlmostEqual(f.hi, 40.0, places=6)
        with self.assertRaisesRegex(BenchError, "shorter than"):
            harness.run_samples(m, 4, windows=5)

    def test_steps_that_go_back_are_refused(self):
        m = write_metrics(self.path("f"), [(1, 0.1), (2, 0.2), (3, 0.15)])
        with self.assertRaisesRegex(BenchError, "must increase"):
            harness.read_steps(m)

    def test_a_broken_line_is_refused(self):
        m = self.path("g")
        os.makedirs(os.path.dirname(m))
        with open(m, "w") as f:
            f.write('{"step": 1, "elapsed_s": 0.1}\n{"step": 2, "elaps\n')
        with self.assertRaisesRegex(BenchError, "not a JSON line"):
            harness.read_steps(m)

    def test_too_few_points_after_warmup(self):
        m = write_metrics(self.path("h"), [(1, 1.0), (100, 10.0)])
        with self.assertRaisesRegex(BenchError, "after the warm-up"):
            harness.run_samples(m, 1, warmup_steps=50)

    def test_per_step_from_summary(self):
        m = write_metrics(self.path("i"), steady_run(0.01, 701), summary={"samples": 89600,
                                                                             "steps": 700})
        self.assertEqual(harness.per_step_of(m), 128)
        f = harness.figure_of_runs([m, m, m], None)
        self.assertAlmostEqual(f.median, 12800.0)

    def test_plan_from_a_probe(self):
        pts = [(s, 1.0 + s * 0.002) for s in range(20, 401, 20)]  # 500 steps/s past its start
        p = harness.plan(pts, 7.0, warmup_steps=100)
        self.assertEqual(p["log_every"], 50)
        self.assertAlmostEqual(p["steps_per_s"], 500.0)
        # 7 s at 500 steps/s is 3500 steps; planned 15% longer (4025), in
        # whole log intervals of 50: 4050.
        self.assertEqual(p["steps"], 100 + 4050)
        # A run 10% slower than its probe still times the 7 s asked for.
        self.assertGreaterEqual((p["steps"] - 100) / (500.0 / 1.1), 7.0)
        with self.assertRaises(BenchError):
            harness.plan([(1, 0.5)], 7.0)

    def test_step_clock_round_trip(self):
        clock, now = harness.StepClock(), [0.0]
        real = harness.time.perf_counter
        harness.time.perf_counter = lambda: now[0]
        try:
            clock.t0 = 0.0

            def step(i):
                now[0] += 0.5 if i <= 3 else 0.01  # slow warm-up, then 10 ms
                return i

            agreed = []
            last = harness.run_steady(step, clock, 3, 6.0, lambda n: agreed.append(n) or n, 10)
        finally:
            harness.time.perf_counter = real
        self.assertEqual(agreed, [600])
        self.assertEqual(last, 3 + 10 + 600)
        m = self.path("j")
        clock.write(m)
        [s] = harness.run_samples(m, 2, warmup_steps=3)
        self.assertEqual(s.steps, 610)
        self.assertAlmostEqual(s.rate, 200.0)


class Command(unittest.TestCase):
    def run_main(self, *argv):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            rc = harness.main(list(argv))
        return rc, out.getvalue(), err.getvalue()

    def test_figure_command(self):
        d = tempfile.mkdtemp(prefix="bench-cli-")
        self.addCleanup(shutil.rmtree, d)
        ms = [write_metrics(os.path.join(d, f"r{i}", "metrics.jsonl"),
                            steady_run(0.01 * (1 + 0.02 * i), 701)) for i in range(3)]
        rc, out, _ = self.run_main("figure", "--per-step", "128", *ms)
        self.assertEqual(rc, 0)
        j = json.loads(out)
        self.assertEqual(j["n"], 3)
        self.assertAlmostEqual(j["median"], 12800 / 1.02)
        self.assertFalse(j["noisy"])

    def test_refusal_exits_one(self):
        d = tempfile.mkdtemp(prefix="bench-cli-")
        self.addCleanup(shutil.rmtree, d)
        m = write_metrics(os.path.join(d, "short", "metrics.jsonl"), steady_run(0.01, 101))
        rc, out, err = self.run_main("figure", "--per-step", "1", m, m, m)
        self.assertEqual((rc, out), (1, ""))
        self.assertIn("shorter than 5 s", err)


class Environment(unittest.TestCase):
    def test_snapshot_and_markdown(self):
        os.environ["OPENBLAS_L2_SIZE"] = "524288"
        try:
            snap = machine.snapshot(None, None)
        finally:
            del os.environ["OPENBLAS_L2_SIZE"]
        json.dumps(snap)
        self.assertIn("load1", snap["load"])
        self.assertGreaterEqual(snap["cpu"]["cores_allowed"], 1)
        text = "\n".join(machine.markdown(snap, snap))
        for want in ("tessera commit", "CPU:", "load average", "before:", "after:",
                     "openblas_get_corename", "OPENBLAS_L2_SIZE=524288", "GPU:"):
            self.assertIn(want, text)

    def test_markdown_of_a_gpu_host(self):
        snap = {"date": "2026-12-01T00:00:00+00:00", "git": {"commit": "abc", "dirty": True},
                "cpu": {"model": "Xeon", "cores_online": 16, "cores_allowed": 16},
                "kernel": "6.1", "load": {"load1": 0.5, "load5": 0.4, "load15": 0.3},
                "openblas": {"library": "/usr/lib/libopenblas.so.0", "coretype": "SkylakeX",
                             "env": {"OPENBLAS_CORETYPE": "Haswell"}},
                "gpu": {"gpus": ["NVIDIA H200, 580.159.04, 143771 MiB"], "driver_cuda": "13.0",
                        "nvcc": "13.0"},
                "torch": {"version": "2.11.0+cu130", "cuda": "13.0", "blas": "mkl",
                          "deepspeed": "0.19.8", "python": "python3"}}
        text = "\n".join(machine.markdown(snap))
        for want in ("uncommitted", "SkylakeX", "OPENBLAS_CORETYPE=Haswell", "H200", "13.0",
                     "torch 2.11.0+cu130", "DeepSpeed: 0.19.8"):
            self.assertIn(want, text)


if __name__ == "__main__":
    unittest.main()
