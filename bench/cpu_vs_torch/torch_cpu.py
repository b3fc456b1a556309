"""The PyTorch anchor of bench/cpu_vs_torch, on the CPU.

  python3 torch_cpu.py mlp  --ranks 1 --threads 2 --seconds 7 --metrics M.jsonl
  python3 torch_cpu.py gpt2 --ranks 2 --threads 1 --compile --data 'FORTUNES/fortunes_train_*.bin'
  python3 torch_cpu.py llama --ranks 1 --threads 2 --data 'FORTUNES/fortunes_train_*.bin'

mlp:  784-256-128-10 ReLU, global batch 128 (micro 128 / ranks), AdamW lr 1e-3,
      Fashion-MNIST from /usr/share/datasets (pixels / 255), shuffled.
gpt2: 4 layers, 4 heads, width 128, context 128, vocab 256 (the
      gpt2-tiny-cpu config), micro batch 16 per rank, AdamW (0.9, 0.95,
      weight decay 0.1), random windows of a llm.c token shard.
llama: 2 layers, width 128, 4 query / 2 key-value heads of 32, intermediate
      384, context 128, vocab 256 (configs/llama-tiny-cpu.toml;
      torch_llama.py), otherwise as gpt2.

More than one rank: torch.multiprocessing, DistributedDataParallel over the
gloo backend, each rank with --threads threads. --compile: torch.compile of
the model (of the DDP module at more than one rank; inductor's C++ backend).

Timing (bench/lib/harness.py's run_steady): --warmup steps, --probe steps
to time a step, then enough steps for --seconds (rank 0's count, broadcast
to every rank before the timed steps). Rank 0 keeps each step's timestamp
in memory and writes them to --metrics (the metrics.jsonl format tessera
writes) for the harness to read. Prints one JSON line (the run's
description and its whole-window rate).
"""
import argparse, glob, gzip, json, os, struct, sys, time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

# The GPT-2 of the GPU benchmark's anchor, at gpt2-tiny-cpu's size here.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpt2_gpu"))
from torch_gpt2 import GPT  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_llama import Llama  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402


def read_idx(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def read_shard(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        if header[0] == 20240520:
            dtype = np.uint16
        elif header[0] == 20240801:
            dtype = np.uint32
        else:
            sys.exit(f"{path}: not a llm.c token shard (magic {header[0]})")
        return np.frombuffer(f.read(), dtype=dtype)[: int(header[2])].astype(np.int64)


def make_job(a, rank, world):
    """The model, its optimizer and a batch source for one rank."""
    g = torch.Generator().manual_seed(1000 + rank)
    if a.workload == "mlp":
        x = torch.from_numpy(read_idx(a.images).reshape(-1, 784).astype(np.float32) / 255.0)
        y = torch.from_numpy(read_idx(a.labels).astype(np.int64))
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                              nn.Linear(128, 10))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, fused=True)
        micro = 128 // world
        perm, pos = torch.randperm(len(x), generator=g), 0

        def batch():
            nonlocal perm, pos
            if pos + micro > len(perm):
                perm, pos = torch.randperm(len(x), generator=g), 0
            i = perm[pos:pos + micro]
            pos += micro
            return x[i], y[i]

        return model, opt, batch, micro, 1
    files = sorted(glob.glob(a.data))
    if not files:
        sys.exit(f"no token shards match {a.data} (run tools/prepare-fortunes)")
    tokens = torch.from_numpy(np.concatenate([read_shard(f) for f in files]))
    T, micro = 128, 16
    model = GPT(4, 4, 128, T, 256) if a.workload == "gpt2" else Llama()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)

    def batch():
        start = torch.randint(0, len(tokens) - T - 1, (micro,), generator=g)
        w = torch.stack([tokens[s:s + T + 1] for s in start.tolist()])
        return w[:, :-1], w[:, 1:]

    return model, opt, batch, micro, T


def worker(rank, a, world, port, out):
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    model, opt, batch, micro, T = make_job(a, rank, world)
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    if a.compile:
        net = torch.compile(net)
    if a.workload == "mlp":
        loss_of = lambda b: F.cross_entropy(net(b[0]), b[1])
    else:
        loss_of = lambda b: net(b[0], b[1])

    def step(_):
        loss = loss_of(batch())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()  # logged every step, as a training loop does

    def agree(n):  # rank 0's step count on every rank
        if world == 1:
            return n
        t = torch.tensor([n], dtype=torch.int64)
        dist.broadcast(t, 0)
        return int(t.item())

    clock = harness.StepClock()
    t0 = time.perf_counter()
    loss = harness.run_steady(step, clock, a.warmup, a.seconds, agree, a.probe)
    if world > 1:
        dist.barrier()
    if rank == 0:
        if a.metrics:
            clock.write(a.metrics)
        first = next(p for p in clock.points if p[0] >= a.warmup)
        last = clock.points[-1]
        dt = last[1] - first[1]
        samples = (last[0] - first[0]) * micro * world
        out.put({"impl": "pytorch" + (" torch.compile" if a.compile else ""),
                 "torch": torch.__version__, "workload": a.workload, "ranks": world,
                 "threads_per_rank": a.threads, "steps": last[0], "window_s": dt,
                 "samples_per_s": samples / dt, "samples_per_step": micro * world,
                 "tokens_per_sample": T, "wall_s": time.perf_counter() - t0,
                 "last_loss": loss})
    if world > 1:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workload", choices=["mlp", "gpt2", "llama"])
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="threads per rank")
    p.add_argument("--seconds", type=float, default=7.0, help="the timed window, seconds")
    p.add_argument("--warmup", type=int, default=20, help="steps before the timed window")
    p.add_argument("--probe", type=int, default=10, help="steps that time a step (in the window)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--metrics", default="", help="write the steps' timestamps here (rank 0)")
    p.add_argument("--images", default="/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")
    p.add_argument("--labels", default="/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz")
    p.add_argument("--data", default="data/fortunes/fortunes_train_*.bin")
    p.add_argument("--port", type=int, default=29611)
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    if a.ranks == 1:
        worker(0, a, 1, a.port, out)
    else:
        mp.spawn(worker, args=(a, a.ranks, a.port, out), nprocs=a.ranks, join=True)
    print(json.dumps(out.get()))


if __name__ == "__main__":
    main()
