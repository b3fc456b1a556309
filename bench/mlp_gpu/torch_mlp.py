"""The PyTorch anchor of bench/mlp_gpu: the same MLP (4 x Linear(4096, 4096)
+ ReLU, then Linear(4096, 10)), batch 1024, autocast bf16, SGD with
momentum 0.9 (fused where this torch has it, else foreach), a pool of
batches on the GPU (the anchor measures compute, not loading).

  python3 torch_mlp.py --mode eager|compile|max-autotune --seconds S --metrics M.jsonl

--mode compile: torch.compile of the model (inductor, default mode);
max-autotune: mode="max-autotune" (autotuned GEMMs and CUDA graphs).
Timing (bench/lib/harness.py's run_steady): --warmup steps (compilation
included), a probe of --probe steps, then steps for --seconds; the loss is
read every step, as a training loop that logs it does, and each step's
timestamp is kept in memory and written to --metrics. Prints one JSON line.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["eager", "compile", "max-autotune"], default="eager")
    p.add_argument("--seconds", type=float, default=21.0)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--probe", type=int, default=50)
    p.add_argument("--metrics", default="")
    a = p.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(4096, 4096), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(4096, 10))
    model = torch.nn.Sequential(*layers).to(dev)
    try:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=True)
        sgd = "fused"
    except (TypeError, RuntimeError):
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=True)
        sgd = "foreach"
    xs = [torch.rand(1024, 4096, device=dev) * 2 - 1 for _ in range(4)]
    ys = [torch.randint(0, 10, (1024,), device=dev) for _ in range(4)]
    loss_fn = torch.nn.CrossEntropyLoss()
    net = model
    if a.mode == "compile":
        net = torch.compile(model)
    elif a.mode == "max-autotune":
        net = torch.compile(model, mode="max-autotune")

    def step(i):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(net(xs[i % 4]), ys[i % 4])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    clock = harness.StepClock()
    harness.run_steady(step, clock, a.warmup, a.seconds, probe_steps=a.probe)
    if a.metrics:
        clock.write(a.metrics)
    first = next(q for q in clock.points if q[0] >= a.warmup)
    dt = clock.points[-1][1] - first[1]
    print(json.dumps({"impl": f"pytorch {a.mode}", "torch": torch.__version__, "sgd": sgd,
                      "warmup": a.warmup,
                      "samples_per_step": 1024, "steps": clock.points[-1][0], "window_s": dt,
                      "samples_per_s": (clock.points[-1][0] - first[0]) * 1024 / dt,
                      "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}))


if __name__ == "__main__":
    main()
