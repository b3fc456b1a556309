"""The PyTorch anchor of bench/mlp_gpu: the same MLP (4 x Linear(4096, 4096)
+ ReLU, then Linear(4096, 10)), batch 1024, autocast bf16, SGD with
momentum 0.9 (foreach). Prints one JSON line with the median step time.
"""
import json, sys, time
import torch

def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    torch.manual_seed(0)
    dev = torch.device("cuda")
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(4096, 4096), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(4096, 10))
    model = torch.nn.Sequential(*layers).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=True)
    # A pool of batches on the GPU: the anchor measures compute, not loading.
    xs = [torch.rand(1024, 4096, device=dev) * 2 - 1 for _ in range(4)]
    ys = [torch.randint(0, 10, (1024,), device=dev) for _ in range(4)]
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(i):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(xs[i % 4]), ys[i % 4])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    for i in range(30):
        step(i)
    torch.cuda.synchronize()
    times = []
    for i in range(steps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        loss = step(i)
        b.record()
        # Read the loss each step, as a training loop that logs it does.
        loss.item()
        times.append(a.elapsed_time(b))
    t0 = time.perf_counter()
    for i in range(steps):
        step(i).item()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / steps * 1e3
    times.sort()
    print(json.dumps({"impl": "pytorch", "torch": torch.__version__,
                      "median_ms": times[len(times) // 2], "wall_ms_per_step": wall,
                      "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}))

if __name__ == "__main__":
    main()
