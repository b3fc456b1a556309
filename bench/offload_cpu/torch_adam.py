"""bench/offload_cpu: torch.optim.AdamW(fused=True) on the CPU, the anchor
for tessera's CPU step. One flat fp32 parameter of N elements with an fp32
gradient (28 bytes per parameter per step, as tessera's bf16 step moves),
THREADS intra-op threads (pin them with OMP_PLACES / OMP_PROC_BIND, as the
run script does); the median over REPS windows of STEPS steps each (STEPS 0, the
default: as many as fill WINDOW_S seconds, default 5.5) after a warm-up
step (bench/lib/harness.py's repeat_windows). Prints one JSON line, with
each window's rate and length.
  python3 torch_adam.py N THREADS [REPS] [STEPS] [WINDOW_S]"""
import json
import os
import statistics
import sys

import torch

n = int(float(sys.argv[1]))
threads = int(sys.argv[2])
reps = max(3, int(sys.argv[3])) if len(sys.argv) > 3 else 5
steps = max(0, int(sys.argv[4])) if len(sys.argv) > 4 else 0
window_s = float(sys.argv[5]) if len(sys.argv) > 5 else 5.5
torch.set_num_threads(threads)
# zeros and the gradient are written by the intra-op threads (parallel
# fill), so their pages are first touched by the threads that step them.
p = torch.nn.Parameter(torch.zeros(n))
p.grad = (torch.arange(n) % 2001 - 1000).float() * 1e-3
kind = "fused"
try:
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, fused=True)
    opt.step()
except (RuntimeError, TypeError) as e:  # torch < 2.4: no fused CPU Adam
    kind = f"foreach ({e.__class__.__name__}: fused unavailable)"
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, foreach=True)
    opt.step()


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402

windows = harness.repeat_windows(opt.step, reps, steps, window_s, n)
step_s = statistics.median(w.seconds / w.steps for w in windows)
print(json.dumps({"impl": f"torch {torch.__version__} AdamW {kind}", "params": n,
                  "threads": threads, "reps": reps, "steps": windows[0].steps, "step_s": step_s,
                  "params_per_s": n / step_s, "GBps": n * 28 / step_s / 1e9,
                  "rates": [w.rate for w in windows], "windows_s": [w.seconds for w in windows]}))
