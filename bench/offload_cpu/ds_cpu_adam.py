"""bench/offload_cpu: DeepSpeedCPUAdam (adamw_mode=True), the anchor that
DeepSpeed's optimizer offload runs on the host. One flat fp32 parameter of N
elements with an fp32 gradient (28 bytes per parameter per step), THREADS
OpenMP threads (pinned through OMP_PLACES / OMP_PROC_BIND by the run
script); the median over REPS windows of STEPS steps each (STEPS 0, the
default: as many as fill WINDOW_S seconds, default 5.5) after a warm-up
step (the first step also builds DeepSpeed's extension, about a minute).
Prints one JSON line, with each window's rate and length; {"error": ...}
when deepspeed cannot be imported.
  python3 ds_cpu_adam.py N THREADS [REPS] [STEPS] [WINDOW_S]"""
import json
import os
import statistics
import sys

n = int(float(sys.argv[1]))
threads = int(sys.argv[2])
reps = max(3, int(sys.argv[3])) if len(sys.argv) > 3 else 5
steps = max(0, int(sys.argv[4])) if len(sys.argv) > 4 else 0
window_s = float(sys.argv[5]) if len(sys.argv) > 5 else 5.5
os.environ.setdefault("OMP_NUM_THREADS", str(threads))  # before the extension loads
try:
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam
except Exception as e:  # ImportError, or deepspeed failing its own imports
    print(json.dumps({"error": f"not installed ({e.__class__.__name__})"}))
    sys.exit(0)

torch.set_num_threads(threads)
p = torch.nn.Parameter(torch.zeros(n))
p.grad = (torch.arange(n) % 2001 - 1000).float() * 1e-3
opt = DeepSpeedCPUAdam([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                       adamw_mode=True)
opt.step()


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402

windows = harness.repeat_windows(opt.step, reps, steps, window_s, n)
step_s = statistics.median(w.seconds / w.steps for w in windows)
import deepspeed  # noqa: E402  (imported above through deepspeed.ops)

print(json.dumps({"impl": f"DeepSpeedCPUAdam {deepspeed.__version__}", "params": n,
                  "threads": threads, "reps": reps, "steps": windows[0].steps, "step_s": step_s,
                  "params_per_s": n / step_s, "GBps": n * 28 / step_s / 1e9,
                  "rates": [w.rate for w in windows], "windows_s": [w.seconds for w in windows]}))
