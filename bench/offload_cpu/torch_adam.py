"""bench/offload_cpu: torch.optim.AdamW(fused=True) on the CPU, the anchor
for offload cpu's step. One flat parameter of N fp32 elements with a
gradient, THREADS intra-op threads; the best of STEPS steps after a warm-up
step. Prints one JSON line.
  python3 torch_adam.py N THREADS [STEPS]"""
import json
import sys
import time

import torch

n = int(float(sys.argv[1]))
threads = int(sys.argv[2])
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
torch.set_num_threads(threads)
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
best = float("inf")
for _ in range(steps):
    t0 = time.perf_counter()
    opt.step()
    best = min(best, time.perf_counter() - t0)
print(json.dumps({"torch": torch.__version__, "kind": kind, "params": n, "threads": threads,
                  "step_s": best, "params_per_s": n / best, "adam_GBps": n * 28 / best / 1e9}))
