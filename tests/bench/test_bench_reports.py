"""The benches' pure-Python parts on made-up runs: the GPU benches' reports
(bench/mlp_gpu, gpt2_gpu, attention_gpu, offload_gpu, offload_params_gpu:
they run only on the GPU host), bench/cpu_vs_torch's and bench/cpu_loaded's
result files, from fake metrics.jsonl files and logs (the scripts
themselves: test_bench_scripts.py). No torch, no GPU, no tessera binary."""
import json
import os
import shutil
import subprocess
import sys
import re
import tempfile
import unittest
from types import SimpleNamespace

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "lib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import machine  # noqa: E402
from test_harness import write_metrics  # noqa: E402


def steps(step_s, n, every=1, start=2.0, slow_from=None, slow=1.0):
    """(step, elapsed) for n steps of step_s seconds after a start of `start`
    s; from step slow_from on, each step takes `slow` times longer."""
    pts, t = [], start
    for s in range(1, n + 1):
        t += step_s * (slow if slow_from and s >= slow_from else 1.0)
        if s % every == 0 or s == n:
            pts.append((s, t))
    return pts


class Reports(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="bench-reports-")
        self.addCleanup(shutil.rmtree, self.work)
        env = machine.snapshot(None, None)
        for name in ("env-before.json", "env-after.json"):
            with open(os.path.join(self.work, name), "w") as f:
                json.dump(env, f)

    def put(self, rel, obj):
        path = os.path.join(self.work, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(json.dumps(obj) + "\n")

    def report(self, bench, *args):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", bench, "report.py"), *args],
                           capture_output=True, text=True)
        self.assertEqual(r.stderr, "")
        return r.returncode, r.stdout

    def test_mlp_gpu(self):
        for r in (1, 2, 3):  # 1.5 ms a step, 1024 samples: ~683K samples/s
            write_metrics(os.path.join(self.work, f"tessera-r{r}", "metrics.jsonl"),
                          steps(0.0015 * (1 + 0.01 * r), 5100, every=50),
                          summary={"samples": 5100 * 1024, "steps": 5100,
                                   "peak_memory_bytes": 900 * 2**20})
        with open(os.path.join(self.work, "tessera-r1.log"), "w") as f:
            f.write("tessera: device cuda:0 (NVIDIA H200)\nstep 1/2 | loss 1\n")
        for mode, step_s in (("eager", 0.0026), ("compile", 0.002)):
            write_metrics(os.path.join(self.work, f"torch-{mode}", "metrics.jsonl"),
                          steps(step_s, 30 + int(21 / step_s)))
            self.put(f"torch-{mode}.json", {"impl": f"pytorch {mode}", "torch": "2.11",
                                            "sgd": "fused", "samples_per_step": 1024,
                                            "warmup": 30, "peak_mem_gib": 1.05})
        rc, out = self.report("mlp_gpu", self.work, "3")
        self.assertEqual(rc, 0, out)
        self.assertIn("| 669,281 (662,783-675,908) | 1.530 |", out)  # 1024 / 1.53 ms
        self.assertIn("PyTorch torch.compile", out)
        self.assertIn("max-autotune", out)  # not run: a row that says so
        self.assertIn("not run or failed", out)
        self.assertIn("Against PyTorch's best here (PyTorch torch.compile): 1.31x (1.29-1.32)", out)
        self.assertIn("tessera: device cuda:0", out)
        self.assertIn("## Environment", out)

    def test_mlp_gpu_refuses_a_short_window(self):
        for r in (1, 2, 3):
            write_metrics(os.path.join(self.work, f"tessera-r{r}", "metrics.jsonl"),
                          steps(0.0015, 1000, every=50),  # 1.35 s after the warm-up
                          summary={"samples": 1024000, "steps": 1000, "peak_memory_bytes": 1})
        rc, out = self.report("mlp_gpu", self.work, "3")
        self.assertEqual(rc, 1)
        self.assertIn("refused", out)
        self.assertIn("shorter than 5 s", out)
        self.assertNotIn("| tessera (data loader, bf16 compute, fused SGD) | 6", out)

    def test_gpt2_gpu(self):
        for r in (1, 2, 3):  # 40 ms a step of 16 x 1024 tokens: ~410K tokens/s
            write_metrics(os.path.join(self.work, f"tessera-r{r}", "metrics.jsonl"),
                          steps(0.040, 190), summary={"samples": 190 * 16, "steps": 190,
                                                      "peak_memory_bytes": 8 * 2**30})
        # PyTorch slows down in its last third: a noisy figure.
        write_metrics(os.path.join(self.work, "torch", "metrics.jsonl"),
                      steps(0.035, 8 + 600, slow_from=400, slow=1.3))
        self.put("torch.json", {"torch": "2.11", "warmup": 8, "tokens_per_step": 16384,
                                "peak_mem_gib": 8.45})
        rc, out = self.report("gpt2_gpu", self.work, "3")
        self.assertEqual(rc, 0, out)
        self.assertIn("| tessera (configs/gpt2-124m.toml) | 409,600 (409,600-409,600) |", out)
        self.assertIn("noisy", out)
        self.assertIn("below", out)  # 0.88x: said so
        self.assertIn("8.00 GiB", out)
        # 409,600 tokens/s x (6 x 124,475,904 + 6 x 12 x 768 x 1024) FLOPs / 989e12
        self.assertIn("| 33.3% |", out)
        rc, out = self.report("gpt2_gpu", self.work, "3", "1.5b", "48", "25", "1600", "4")
        self.assertIn("GPT-2 1.5b (48 layers, 25 heads, width 1600", out)
        self.assertIn("1558M parameters", out)
        self.assertIn("| tessera (configs/gpt2-1.5b.toml) |", out)

    def test_llama_gpu(self):
        """bench/llama_gpu: tessera's windows against the anchor's one line,
        MFU from the shape, the A/B row (qwen0.5b without its biases)."""
        for r in (1, 2, 3):  # 200 ms a step of 4 x 2048 tokens: 40,960 tokens/s
            write_metrics(os.path.join(self.work, f"tessera-r{r}", "metrics.jsonl"),
                          steps(0.200, 60), summary={"samples": 60 * 4, "steps": 60,
                                                     "peak_memory_bytes": 30 * 2**30})
        self.put("torch.json", {"impl": "torch-2.11-compile", "tokens_per_s": 32768,
                                "peak_gpu_GiB": 31.5})
        rc, out = self.report("llama_gpu", self.work, "3", "1b", "4", "2048")
        self.assertEqual(rc, 0, out)
        self.assertIn("1.24B parameters", out)
        self.assertIn("| tessera (1b) | 40,960 (40,960-40,960) | 1.25x (1.25-1.25) |", out)
        # 40,960 x (6 x 1,235,814,400 + 6 x 16 x 32 x 64 x 2048) / 989e12
        self.assertIn("| 32.4% |", out)
        self.assertIn("| PyTorch torch-2.11-compile (torch_llama.py) | 32,768 |", out)
        os.remove(os.path.join(self.work, "torch.json"))
        with open(os.path.join(self.work, "ab.txt"), "w") as f:
            f.write("--set model.attention_bias=false")
        for r in (1, 2, 3):  # without the biases: 190 ms a step
            write_metrics(os.path.join(self.work, f"tessera-b-r{r}", "metrics.jsonl"),
                          steps(0.190, 60), summary={"samples": 60 * 4, "steps": 60,
                                                     "peak_memory_bytes": 30 * 2**30})
        rc, out = self.report("llama_gpu", self.work, "3", "qwen0.5b", "4", "2048")
        self.assertEqual(rc, 1, out)  # no anchor: refused, said so
        self.assertIn("0.49B parameters", out)
        self.assertIn("not run (no anchor)", out)
        self.assertIn("tessera, `--set model.attention_bias=false`", out)
        self.assertIn("A/B: tessera as configured / with `--set model.attention_bias=false` = "
                      "**0.95x (0.95-0.95) below**", out)

    def test_gpt2_gpu_ab(self):
        """run's AB_SET: the B runs' row, the A/B ratio and the loss curves."""
        for r in (1, 2, 3):  # A: 40 ms a step; B: 44 ms, one loss 1% off
            write_metrics(os.path.join(self.work, f"tessera-r{r}", "metrics.jsonl"),
                          steps(0.040, 190), summary={"samples": 190 * 16, "steps": 190,
                                                      "peak_memory_bytes": 8 * 2**30})
            path = os.path.join(self.work, f"tessera-b-r{r}", "metrics.jsonl")
            write_metrics(path, steps(0.044, 190), summary={"samples": 190 * 16, "steps": 190,
                                                            "peak_memory_bytes": 9 * 2**30})
            with open(path) as f:
                lines = [json.loads(l) for l in f]
            for j in lines:
                j["loss"] = 1.01 if j["step"] == 100 else 1.0
            with open(path, "w") as f:
                f.write("".join(json.dumps(j) + "\n" for j in lines))
        with open(os.path.join(self.work, "ab.txt"), "w") as f:
            f.write("--set model.fused=false\n")
        write_metrics(os.path.join(self.work, "torch", "metrics.jsonl"), steps(0.035, 8 + 600))
        self.put("torch.json", {"torch": "2.11", "warmup": 8, "tokens_per_step": 16384,
                                "peak_mem_gib": 8.45})
        rc, out = self.report("gpt2_gpu", self.work, "3")
        self.assertEqual(rc, 0, out)
        self.assertIn("| tessera (configs/gpt2-124m.toml) | 409,600 (409,600-409,600) |", out)
        # 16 x 1024 tokens / 44 ms
        self.assertIn("| tessera, `--set model.fused=false` | 372,364 (372,364-372,364) | "
                      "**0.80x (0.80-0.80) below** |", out)
        self.assertIn("9.00 GiB", out)
        self.assertIn("- A/B: tessera as configured / tessera with `--set model.fused=false` = "
                      "1.10x (1.10-1.10)", out)
        self.assertIn("190 logged steps 1-190): worst relative difference 9.90e-03 (step 100)",
                      out)
        # Curves logged over different intervals are not compared step by step.
        write_metrics(os.path.join(self.work, "tessera-b-r1", "metrics.jsonl"),
                      steps(0.044, 190, every=2))
        rc, out = self.report("gpt2_gpu", self.work, "3")
        self.assertIn("- A/B loss curves: no step logged by both over the same interval", out)

    def test_attention_gpu(self):
        def sample(impl, p, calls, secs):
            return "sample " + json.dumps({"impl": impl, "pass": p, "calls": calls,
                                           "seconds": secs})
        ok = "16,1024,12,64"
        lines = ["cudnn: cuDNN 9.10.2", "device: NVIDIA H200"]
        for secs in (6.0, 6.06, 5.94):
            lines += [sample("native", "forward", 5000, secs),
                      sample("native", "backward", 2000, 5.5),
                      sample("cudnn", "forward", 6000, 6.0),
                      sample("cudnn", "backward", 2000, 5.5)]
        lines += ["impl fwd ms ...", "cudnn vs native: out rel 2.1e-03, dq/dk/dv rel 4.0e-03"]
        with open(os.path.join(self.work, f"attn-{ok}.log"), "w") as f:
            f.write("\n".join(lines) + "\n")
        # A shape whose windows are too short, and no cuDNN.
        short = "4,1024,25,64"
        with open(os.path.join(self.work, f"attn-{short}.log"), "w") as f:
            f.write("cudnn: not found\ncudnn    (unavailable: libcudnn.so.9 not found)\n" +
                    "\n".join(sample("native", p, 100, 2.0) for p in ("forward", "backward")
                              for _ in range(3)) + "\n")
        for s in (ok, short):
            with open(os.path.join(self.work, f"attn-{s}.rc"), "w") as f:
                f.write("0\n")
        rc, out = self.report("attention_gpu", self.work, "3", "bf16", ok, short)
        self.assertEqual(rc, 1, out)
        # 5000 calls in 6.0 (5.94-6.06) s; 2 x 16 x 12 x 1024^2 x 64 FLOPs a call
        self.assertIn("| tessera native | 1.200 (1.188-1.212) | 2.750 (2.750-2.750) | "
                      "21.5 (21.3-21.7) |", out)
        self.assertIn("| cuDNN | 1.000 (1.000-1.000) |", out)
        self.assertIn("- forward: native / cuDNN = **0.83x (0.83-0.84) below**", out)
        self.assertIn("- backward: native / cuDNN = 1.00x (1.00-1.00)", out)
        self.assertIn("out rel 2.1e-03", out)
        self.assertIn("## B=4, T=1024, H=25, D=64 (bf16)", out)
        self.assertIn("| cuDNN | (unavailable: libcudnn.so.9 not found) |", out)
        self.assertIn("refused: 4,1024,25,64 tessera native forward:", out)
        self.assertIn("a timed window of 2 s", out)
        self.assertIn("## Environment", out)
        # The lines made up here are the ones attention_bench prints.
        with open(os.path.join(ROOT, "bench", "attention_gpu", "attention_bench.cpp")) as f:
            # Adjacent string literals joined, so line breaks and indentation
            # (clang-format's) do not matter.
            src = re.sub(r'"\s*\n\s*"', "", f.read())
        self.assertIn('"sample {\\"impl\\": \\"%s\\", \\"pass\\": \\"%s\\", \\"calls\\": %lld, '
                      '\\"seconds\\": %.6f}\\n"', src)
        self.assertIn('"cudnn vs native: out rel %.3e, dq/dk/dv rel %.3e\\n"', src)
        self.assertIn('"%-8s (unavailable: %s)\\n"', src)
        self.assertIn('"%-8s failed (%s %s)\\n"', src)

    def test_offload_gpu(self):
        for name, step_s in (("none", 0.124), ("cpu", 0.454), ("cpu_auto", 0.124),
                             ("cpu_clip", 0.454), ("cpu_clip_kept", 0.46)):
            n = 4 + int(22 / step_s)
            pts = steps(step_s, n)
            path = os.path.join(self.work, name, "metrics.jsonl")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            offload = {"wait": 0.3, "cpu_step": 0.4, "d2h": 0.06, "h2d": 0.07}
            if name.startswith("cpu_clip"):  # the speculative step
                offload.update({"speculated_steps": 1, "speculation_save": 0.002,
                                "redo": 0.1 if name == "cpu_clip" else 0.0,
                                "held_for_norm": 0.0, "redone_steps": 0})
            with open(path, "w") as f:
                for s, t in pts:
                    if name == "cpu_clip":
                        offload["redone_steps"] = s % 2
                    f.write(json.dumps({"type": "train", "step": s, "loss": 3.0, "elapsed_s": t,
                                        "breakdown": {"steps": 1, "forward": step_s * 0.8,
                                                      "backward": step_s * 0.2,
                                                      "offload": offload}})
                            + "\n")
            self.put(f"{name}/summary.json", {"samples": n * 4, "steps": n, "wall_s": 60.0,
                                              "train_s": 40.0, "peak_memory_bytes": 7 * 2**30})
        write_metrics(os.path.join(self.work, "anchor-fsdp2", "metrics.jsonl"),
                      steps(0.76, 3 + 30))
        self.put("anchor-fsdp2.json", {"impl": "torch FSDP2", "warmup": 3,
                                       "tokens_per_step": 4096, "peak_gpu_GiB": 13.2})
        # DeepSpeed's windows are too short: refused, not a row.
        write_metrics(os.path.join(self.work, "anchor-deepspeed", "metrics.jsonl"),
                      steps(1.0, 3 + 9))
        self.put("anchor-deepspeed.json", {"impl": "DeepSpeed 0.19.8", "warmup": 3,
                                           "tokens_per_step": 4096, "peak_gpu_GiB": 14.9})
        self.put("alone.json", {"step_s": 0.38, "params": 1.56e9, "threads": 16,
                                "kernel": "avx512", "params_per_s": 4.1e9, "GBps": 115})
        rc, out = self.report("offload_gpu", "--work", self.work, "--windows", "3",
                              "--commit", "abc", "none", "cpu", "cpu_auto", "cpu_clip",
                              "cpu_clip_kept")
        self.assertEqual(rc, 1, out)
        self.assertIn("| tessera offload cpu | 9,022 (9,022-9,022) | 1.67x", out)
        self.assertIn("refused: DeepSpeed 0.19.8", out)
        self.assertIn("Offloaded step (offload cpu, ratio 0)", out)
        self.assertIn("step 454", out)
        self.assertIn("Speculation (cpu_clip): 24 of 48 measured steps redone; per step: keeping "
                      "the pre-step state 2.0 ms, redoing 100.0 ms", out)
        self.assertIn("cpu_clip against cpu without clipping: 1.00x", out)
        # Every verdict kept: what speculation costs where nothing clips.
        self.assertIn("Speculation (cpu_clip_kept): 0 of", out)
        self.assertIn("cpu_clip_kept (a max norm no step reaches: every verdict keeps what was "
                      "stepped ahead) against cpu without clipping: **0.99x", out)
        self.assertNotIn("Speculation (cpu):", out)
        self.assertIn("## Environment", out)


    def offload_llama_run(self, step_s, n, batch, loss0=11.8, held=0.0, gpu=None):
        path = os.path.join(self.work, "tessera-r1", "metrics.jsonl")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            for s, t in steps(step_s, n):
                offload = {"wait": 0.2, "cpu_step": 1.5, "d2h": 0.3, "h2d": 0.3,
                           "held_for_norm": held, "speculation_save": 0.01, "redo": 0.0,
                           "redone_steps": 1 if s == 6 else 0}
                if gpu:  # the GPU's own events: (passes, waited) seconds
                    offload.update({"gpu_passes": gpu[0], "gpu_waited": gpu[1]})
                f.write(json.dumps({"type": "train", "step": s, "loss": loss0 - 0.1 * s,
                                    "elapsed_s": t,
                                    "breakdown": {"steps": 1, "forward": 0.6, "backward": 1.2,
                                                  "optimizer": 0.01, "offload": offload}}) + "\n")
        self.put("tessera-r1/summary.json", {"samples": batch * n, "steps": n,
                                             "peak_memory_bytes": 40 * 2**30,
                                             "peak_memory_by_rank": [{"rank": 0,
                                                                      "rss": 90 * 2**30}]})

    def test_offload_llama_gpu(self):
        self.offload_llama_run(1.6, 4 + 16, 2)  # 2 x 2048 tokens a 1.6 s step: 2,560 tokens/s
        self.put("anchor-fsdp2.json", {"impl": "torch-2.9-fsdp2_offload", "tokens_per_s": 1000,
                                       "peak_gpu_GiB": 20.5})
        rc, out = self.report("offload_llama_gpu", self.work, "3b", "2", "3")
        self.assertEqual(rc, 0, out)
        self.assertIn("| tessera offload cpu | 2,560 (2,560-2,560) |", out)
        self.assertIn("| 2.56x (2.56-2.56) | 2x |", out)
        self.assertIn("| DeepSpeed ZeRO-2 + offload_optimizer cpu | not run or failed", out)
        self.assertIn("the CPU's update 1500", out)
        self.assertIn("1 of 16 steps redone", out)
        self.assertIn("the CPU's update 1500 ms of a 1600 ms step: the CPU's update bounds it; "
                      "the update alone would allow 2,731 tokens/s", out)
        self.assertIn("communication wait -, data -", out)
        self.assertIn("host RSS 90.0 GiB", out)
        # 8B: 8 x 2048 tokens a 2 s step, over the 6,000 goal; too short a
        # run is refused.
        shutil.rmtree(os.path.join(self.work, "tessera-r1"))
        self.offload_llama_run(2.0, 4 + 12, 8)
        rc, out = self.report("offload_llama_gpu", self.work, "8b", "8", "3")
        self.assertEqual(rc, 0, out)
        self.assertIn("| 8,192 (8,192-8,192) | 6,000 (met) |", out)
        self.assertIn("Loss over 16 logged steps: 11.700 at step 1", out)
        # Every step clipped, its ranges held for the norm 1.2 s: the step
        # (2 s) is the GPU's part (2 - 1.5 s) plus the update, and the bound
        # without the hold is the update's 1.5 s.
        shutil.rmtree(os.path.join(self.work, "tessera-r1"))
        self.offload_llama_run(2.0, 4 + 12, 8, held=1.2)
        rc, out = self.report("offload_llama_gpu", self.work, "8b", "8", "3")
        self.assertEqual(rc, 0, out)
        self.assertIn("held the CPU's ranges for the norm 1200 ms a step", out)
        self.assertIn("the GPU's own near 500 ms", out)
        self.assertIn("bounds the step at 10,923 tokens/s", out)
        # With the GPU's events: its passes 1.4 s, 0.6 s of them idle at
        # the waits: its own work 800 ms, which the bound takes over the
        # inference (500 ms); the update's 1.5 s still bounds.
        shutil.rmtree(os.path.join(self.work, "tessera-r1"))
        self.offload_llama_run(2.0, 4 + 12, 8, held=1.2, gpu=(1.4, 0.6))
        rc, out = self.report("offload_llama_gpu", self.work, "8b", "8", "3")
        self.assertEqual(rc, 0, out)
        self.assertIn("its passes 1400 ms a step, of which idle at the waits for the CPU's update "
                      "600 ms: its own work 800 ms", out)
        self.assertIn("the GPU's own work, from its events, being 800 ms", out)
        shutil.rmtree(os.path.join(self.work, "tessera-r1"))
        self.offload_llama_run(2.0, 4 + 3, 8)
        rc, out = self.report("offload_llama_gpu", self.work, "8b", "8", "3")
        self.assertEqual(rc, 1, out)
        self.assertIn("refused: tessera", out)

    def test_offload_params_gpu(self):
        runs = ["tessera big 48 3200 25 4", "deepspeed ds_big 48 3200 25 4",
                "tessera small 48 1600 25 4", "deepspeed ds_small 48 1600 25 4",
                "tessera nvme 24 1024 16 4"]
        with open(os.path.join(self.work, "runs.txt"), "w") as f:
            f.write("\n".join(runs) + "\n")
        t0 = 1.8e9
        for name, step_s, n, params in (("big", 1.76, 30, 6.06e9), ("small", 0.5, 70, 1.56e9),
                                        ("nvme", 2.0, 24, 3.5e8)):
            path = os.path.join(self.work, name, "metrics.jsonl")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                for s, t in steps(step_s, n):
                    f.write(json.dumps({"type": "train", "step": s, "elapsed_s": t,
                                        "time": t0 + 10 + t}) + "\n")
            self.put(f"{name}/summary.json", {
                "samples": 4 * n, "steps": n, "parameters": params, "mfu": 0.085,
                "peak_memory_bytes": 17 * 2**30,
                "peak_memory_by_rank": [{"rank": 0, "rss": 113 * 2**30}]})
        # DeepSpeed: the big shape did not fit (an OOM, no JSON line); the
        # small one at 1 s a step.
        self.put("ds_big.json", {})
        with open(os.path.join(self.work, "ds_big.json"), "w") as f:
            f.write("")
        with open(os.path.join(self.work, "ds_big.err"), "w") as f:
            f.write("Traceback...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to "
                    "allocate 2.00 GiB\n")
        with open(os.path.join(self.work, "ds_big.rc"), "w") as f:
            f.write("1\n")
        with open(os.path.join(self.work, "ds_big.mem"), "w") as f:
            f.write("50000000\n1048576\n30000000\n")
        write_metrics(os.path.join(self.work, "ds_small", "metrics.jsonl"), steps(1.0, 3 + 24))
        self.put("ds_small.json", {"impl": "DeepSpeed 0.19.8 ZeRO-3", "warmup": 3,
                                   "tokens_per_step": 4096, "peak_gpu_GiB": 14.6,
                                   "params": 1.56e9})
        # dd: 3.0 GB/s read, 2.0 GB/s write; the run reads 1.5 GB/s, writes 0.8 GB/s.
        with open(os.path.join(self.work, "dd.txt"), "w") as f:
            for _ in range(3):
                f.write("write 8589934592 bytes (8.6 GB, 8.0 GiB) copied, 4.29497 s, 2.0 GB/s\n")
                f.write("read 8589934592 bytes (8.6 GB, 8.0 GiB) copied, 2.86331 s, 3.0 GB/s\n")
        with open(os.path.join(self.work, "nvme-io.jsonl"), "w") as f:
            for i in range(0, 700):
                t = i * 0.1
                f.write(json.dumps({"time": t0 + t, "read_bytes": int(1.5e9 * t),
                                    "write_bytes": int(0.8e9 * t)}) + "\n")
        rc, out = self.report("offload_params_gpu", "--work", self.work, "--commit", "abc")
        self.assertEqual(rc, 0, out)
        # 4 samples / 1.76 s x 1024 tokens
        self.assertIn("| tessera stage 3 + offload cpu, params \"cpu\" | 6.06B parameters, "
                      "48 x 3200, 25 heads, B4 | yes (30 steps) | 2,327 (2,327-2,327) | - |", out)
        self.assertIn("no: exit 1: torch.OutOfMemoryError: CUDA out of memory.", out)
        self.assertIn("| MemAvailable fell to 1.0 GiB |", out)
        # 8,192 tokens/s against 4,096: 2x
        self.assertIn("| 8,192 (8,192-8,192) | 2.00x (2.00-2.00) |", out)
        self.assertIn("tessera / DeepSpeed = 2.00x (2.00-2.00) (target >= 1.5x where both fit): "
                      "met", out)
        self.assertIn("Largest shape tessera trained under 24 GiB here: 6.06B parameters", out)
        self.assertIn("| 3 (3-3) GB/s | 2 (2-2) GB/s |", out)
        self.assertIn("| 1.5 (1.5-1.5) GB/s | 0.8 (0.8-0.8) GB/s |", out)
        self.assertIn("| 50% | 40% |", out)
        # 50% and 40% of dd's rates: each direction is judged, not their sum.
        self.assertIn("(each direction >= 70% of dd's rate): read NOT met, write NOT met", out)
        self.assertIn("summed): 90%.", out)
        # Killed by the OOM killer, then run again unpinned at 1.5 s a step.
        with open(os.path.join(self.work, "ds_big.rc"), "w") as f:
            f.write("137\n")
        with open(os.path.join(self.work, "ds_big.kill"), "w") as f:
            f.write("Out of memory: Killed process 3412 (python3) total-vm:200GB\n")
        with open(os.path.join(self.work, "runs.txt"), "a") as f:
            f.write("deepspeed ds_big_unpinned 48 3200 25 4\n")
        write_metrics(os.path.join(self.work, "ds_big_unpinned", "metrics.jsonl"),
                      steps(4.0, 3 + 12))
        self.put("ds_big_unpinned.json", {"impl": "DeepSpeed unpinned", "warmup": 3,
                                          "tokens_per_step": 4096, "peak_gpu_GiB": 20.0,
                                          "params": 6.06e9})
        rc, out = self.report("offload_params_gpu", "--work", self.work)
        self.assertIn("no: killed by SIGKILL (exit 137): the kernel's out-of-memory killer: Out "
                      "of memory: Killed process 3412", out)
        # 2,327 tokens/s against 1,024
        self.assertIn("| 2,327 (2,327-2,327) | 2.27x (2.27-2.27) |", out)
        self.assertIn("| DeepSpeed unpinned | 6.06B parameters, 48 x 3200, 25 heads, B4 | yes | "
                      "1,024 (1,024-1,024) | 1.00x |", out)
        # A run whose I/O samples stop before its steps: refused, not a row.
        with open(os.path.join(self.work, "nvme-io.jsonl"), "w") as f:
            f.write(json.dumps({"time": t0, "read_bytes": 0, "write_bytes": 0}) + "\n")
        rc, out = self.report("offload_params_gpu", "--work", self.work)
        self.assertEqual(rc, 1, out)
        self.assertIn("refused: tessera nvme: no I/O sample around time", out)

    def test_offload_cpu(self):
        def windows(rate, n=5, secs=5.6):
            return [rate * (1 + 0.01 * i) for i in range(n)], [secs] * n
        o = {"params": 1e8, "threads": 2, "cpus": "0,1", "kernel": "avx2", "ceiling_isa": "avx2",
             "reps": 5, "steps": 26}
        for prefix, rate in (("ours_", 4.5e8), ("ceiling_nt_", 4.8e8), ("ceiling_plain_", 4.6e8)):
            o[prefix + "rates"], o[prefix + "windows_s"] = windows(rate)
        t = {"impl": "torch AdamW fused"}
        t["rates"], t["windows_s"] = windows(4.0e8, secs=1.2)  # windows too short: refused
        self.put("ours.json", o)
        self.put("torch.json", t)
        self.put("ds.json", {"error": "not installed (ModuleNotFoundError)"})
        rc, out = self.report("offload_cpu", self.work, "skipped")
        self.assertEqual(rc, 1, out)
        self.assertIn("| tessera adamw, bf16 grads + bf16 copy (avx2) | 4.59e+08 (4.5e+08-4.68e+08) |",
                      out)
        self.assertIn("- tessera / RMW ceiling (the faster store): 94% (90%-98%; target 90%): met",
                      out)
        self.assertIn("- tessera / torch fused: not measured", out)
        self.assertIn("refused: torch AdamW fused: a timed window of 1.2 s", out)
        self.assertIn("| DeepSpeedCPUAdam | not installed (ModuleNotFoundError) |", out)


class CpuVsTorchReport(unittest.TestCase):
    def test_rows_against_the_best_layout(self):
        sys.path.insert(0, os.path.join(ROOT, "bench", "cpu_vs_torch"))
        import bench
        import report
        f = harness.figure
        figs = {("mlp", "tessera", 1, 2, 0): f([95.0, 97.0, 96.0]),
                ("mlp", "tessera", 2, 1, 0): f([100.0, 120.0, 110.0]),
                ("mlp", "tessera", 2, 1, 2): f([80.0, 82.0, 81.0]),
                ("mlp", "eager", 1, 2, None): f([85.0, 86.0, 84.0]),
                ("mlp", "eager", 2, 1, None): f([26.0, 27.0, 26.5]),
                ("mlp", "compile", 1, 2, None): f([90.0, 91.0, 92.0]),
                ("mlp", "compile", 2, 1, None): f([30.0, 31.0, 32.0]),
                ("mlp", "eager-passive", 1, 2, None): f([70.0, 71.0, 72.0])}
        figs = {k: harness.figure([harness.Sample(r, 6.0, 100) for r in (v.lo, v.median, v.hi)])
                for k, v in figs.items()}
        b = SimpleNamespace(samples={k: [(None, 1.5), (None, 3.2)] for k in figs},
                            shares={}, name=bench.Bench.name)
        a = SimpleNamespace(cores=2, reps=3, seconds=7.0)
        env = machine.snapshot(None, None)
        text = report.markdown(a, b, figs, env, env, bench.WORKLOADS)
        self.assertIn("| stage 0, 1 x 2 | 96.0 (95.0-97.0) | 1.13x (1.10-1.15) against "
                      "PyTorch eager, 1 x 2 | 1.05x (1.03-1.08) against PyTorch torch.compile, "
                      "1 x 2 |", text)
        # Stage 2 is below both: said so, in the row and after the table.
        self.assertIn("| stage 2, 2 x 1 | 81.0 (80.0-82.0) | **0.95x (0.93-0.98) below** against "
                      "PyTorch eager, 1 x 2 | **0.89x (0.87-0.91) below**", text)
        self.assertIn("noisy 18%", text)
        self.assertIn("**Rows below 1.0x**", text)
        self.assertIn("**Rows whose range reaches below 1.0x**", text)
        self.assertIn("stage 2 2 x 1: 0.95x (0.93-0.98) PyTorch eager, 1 x 2; ", text)
        self.assertIn("stage 2 2 x 1: 0.89x (0.87-0.91) PyTorch torch.compile, 1 x 2.", text)
        self.assertIn("mlp-tessera-s0-2x1 (18%)", text)
        self.assertIn("ranged 1.50-3.20 on 2 cores (other work was running", text)
        self.assertIn("| PyTorch torch.compile, 1 x 2 | 91.0 (90.0-92.0) | best of all |", text)
        self.assertIn("| PyTorch eager, 1 x 2, OMP_WAIT_POLICY=PASSIVE | 71.0 (70.0-72.0) |  |", text)
        self.assertIn("## Environment", text)
        # The result file again from the raw samples (bench.py --from-json).
        raw = {"args": {"cores": 2, "reps": 3, "seconds": 7.0},
               "figures": {bench.Bench.name(k): dict(f.as_json(), loads=[1.5, 3.2])
                           for k, f in figs.items()}}
        ra, samples, again, shares = report.from_raw(json.loads(json.dumps(raw)))
        self.assertEqual(set(again), set(figs))
        self.assertEqual(shares, {k: [] for k in figs})
        b2 = SimpleNamespace(samples=samples, shares=shares, name=bench.Bench.name)
        self.assertEqual(report.markdown(ra, b2, again, env, env, bench.WORKLOADS), text)
        # With what else the CPUs did during each run measured, the load
        # average (which holds the bench's own previous run) decides nothing.
        quiet = {"others": 0.01, "steal": 0.002}
        b3 = SimpleNamespace(samples=b.samples, name=bench.Bench.name,
                             shares={k: [quiet, dict(quiet, others=0.03)] for k in figs})
        text3 = report.markdown(a, b3, figs, env, env, bench.WORKLOADS)
        self.assertIn("ranged 1.50-3.20 on 2 cores, which includes the bench's own previous "
                      "run. During the runs, other processes used 2.0% of the machine's CPU "
                      "time (median; at most 3.0%) and the hypervisor took 0.2% (steal; at "
                      "most 0.2%): nothing else of note ran beside them.", text3)
        b3.shares[("mlp", "eager", 1, 2, None)][1] = {"others": 0.02, "steal": 0.25}
        self.assertIn("at most 25.0%): other work was running",
                      report.markdown(a, b3, figs, env, env, bench.WORKLOADS))

    def test_a_range_below_1x_is_said_though_the_median_is_above(self):
        sys.path.insert(0, os.path.join(ROOT, "bench", "cpu_vs_torch"))
        import bench
        import report

        def fig(*rates):
            return harness.figure([harness.Sample(r, 6.0, 100) for r in rates])
        figs = {("mlp", "tessera", 1, 2, 0): fig(88.0, 95.0, 100.0),
                ("mlp", "eager", 1, 2, None): fig(84.0, 85.0, 86.0),
                ("mlp", "compile", 1, 2, None): fig(90.0, 91.0, 92.0)}
        b = SimpleNamespace(samples={k: [(None, 0.5)] for k in figs}, shares={},
                            name=bench.Bench.name)
        notes = os.path.join(tempfile.mkdtemp(prefix="bench-notes-"), "notes.md")
        self.addCleanup(shutil.rmtree, os.path.dirname(notes))
        with open(notes, "w") as f:
            f.write("## Notes from the run\n\nA quiet machine.\n")
        a = SimpleNamespace(cores=2, reps=3, seconds=7.0, notes=notes)
        env = machine.snapshot(None, None)
        text = report.markdown(a, b, figs, env, env, bench.WORKLOADS)
        self.assertIn("Every tessera row is at or above 1.0x against both PyTorch references.",
                      text)
        # 95 / 91 by the medians, but 88 / 92 at the worst: said so.
        self.assertIn("**Rows whose range reaches below 1.0x** (our min over their max under "
                      "1.0x: within the two spreads, tessera may be the slower): ", text)
        self.assertIn("stage 0 1 x 2: 1.04x (0.96-1.11) PyTorch torch.compile, 1 x 2.", text)
        self.assertNotIn("PyTorch eager, 1 x 2.", text.split("reaches below")[1].split("\n")[0])
        # A notes file that has the heading itself: the heading once.
        self.assertEqual(text.count("## Notes from the run"), 1)
        self.assertTrue(text.endswith("## Notes from the run\n\nA quiet machine.\n"), text[-200:])
        figs[("mlp", "tessera", 1, 2, 0)] = fig(93.0, 95.0, 100.0)
        a.notes = None
        self.assertIn("Every tessera row's range is at or above 1.0x too",
                      report.markdown(a, b, figs, env, env, bench.WORKLOADS))

    def test_cpu_share_counts_other_processes_not_the_benchs_own(self):
        t0 = {"busy": 100.0, "steal": 5.0, "own": 10.0, "wall": 1000.0, "cpus": 2}
        # 10 s on 2 CPUs: 20 CPU-seconds; 15 busy, of which 12 were ours.
        t1 = {"busy": 115.0, "steal": 6.0, "own": 22.0, "wall": 1010.0, "cpus": 2}
        self.assertEqual(machine.cpu_share(t0, t1), {"others": 0.15, "steal": 0.05})
        self.assertIsNone(machine.cpu_share(None, t1))
        self.assertIsNone(machine.cpu_share(t0, dict(t0)))
        now = machine.cpu_times()
        if now is not None:  # /proc/stat is Linux's
            self.assertGreater(now["busy"], 0.0)
            self.assertGreaterEqual(now["own"], 0.0)


class CpuLoadedReport(unittest.TestCase):
    """bench/cpu_loaded's result file from made-up figures: each row's
    slowdown (quiet over loaded), those over 3x flagged, PyTorch's best
    layout in each state beside tessera's, and the note when no PyTorch."""

    def test_slowdowns_flagged_and_the_best_pytorch_rows(self):
        sys.path.insert(0, os.path.join(ROOT, "bench", "cpu_loaded"))
        import loaded

        def fig(rate):
            return harness.figure([harness.Sample(rate * x, 6.0, 100) for x in (0.98, 1.0, 1.02)])

        figs = {}
        for state, scale in (("quiet", 1.0), ("loaded", 0.4)):
            figs[(state, ("mlp", "tessera", 1, 2, 0))] = fig(20000 * scale)
            figs[(state, ("mlp", "tessera", 2, 1, 0))] = fig(
                30000 * (0.2 * scale if state == "loaded" else 1))
            figs[(state, ("mlp", "eager", 1, 2, None))] = fig(12000 * scale)
            figs[(state, ("mlp", "eager-passive", 2, 1, None))] = fig(11000 * scale)
        shares = {k: [{"others": 0.02, "steal": 0.0}] for k in figs}
        snap = {"load": {"load1": 0.5, "load5": 0.5, "load15": 0.5}}
        a = SimpleNamespace(hogs=2, cores=2, reps=3, python="python3")
        machine_markdown = machine.markdown
        machine.markdown = lambda before, after=None: ["## Environment"]
        try:
            out = loaded.markdown(a, figs, shares, snap, snap)
            a.python = None
            bare = loaded.markdown(a, {k: v for k, v in figs.items() if k[1][1] == "tessera"},
                                   shares, snap, snap)
        finally:
            machine.markdown = machine_markdown
        self.assertIn("| tessera 1 x 2 | 20,000 (19,600-20,400) | 8,000 (7,840-8,160) | "
                      "2.50x (2.40-2.60) | 1.67x (1.60-1.73) |", out)
        self.assertIn("**12.50x (12.01-13.01) over 3x**", out)
        self.assertIn("**Slowdowns over 3x**: MLP 784-256-128-10 mlp-tessera-s0-2x1: 12.50x.", out)
        self.assertIn("| PyTorch eager, 1 x 2 (best quiet and loaded) |", out)
        self.assertNotIn("No PyTorch", out)
        self.assertIn("**No PyTorch**", bare)
        self.assertNotIn("| PyTorch", bare)


if __name__ == "__main__":
    unittest.main()
