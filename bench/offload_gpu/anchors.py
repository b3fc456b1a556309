"""bench/offload_gpu's anchors: what a PyTorch or DeepSpeed user runs instead
of ZeRO-Offload, on the same GPT-2 1.5B (48 x 1600, 25 heads, context 1024,
vocab 50304; bench/gpt2_gpu/torch_gpt2.py's model), batch 4 x 1024, bf16,
AdamW, one GPU, no gradient clipping (as tessera's runs here).

  python3 anchors.py fsdp2 --seconds S --metrics M.jsonl
      FSDP2 (fully_shard per block and at the root) with CPUOffloadPolicy
      (pinned host memory) and MixedPrecisionPolicy bf16; fused AdamW on
      the CPU.
  python3 anchors.py deepspeed --seconds S --metrics M.jsonl
      DeepSpeed ZeRO-2 with offload_optimizer cpu (DeepSpeedCPUAdam), in the
      settings DeepSpeed's ZeRO-Offload tutorial and config docs give for
      speed: pin_memory, overlap_comm, contiguous_gradients, 5e8 buckets.

Timing (bench/lib/harness.py's run_steady): --warmup steps, a probe of
--probe steps, then steps for --seconds, the loss read every step; each
step's timestamp is kept in memory and written to --metrics. Prints one
JSON line (the configuration, the whole window's tokens/s, the GPU peak).
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "gpt2_gpu"))
import harness  # noqa: E402

B, T = 4, 1024
DS_ZERO = {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
           "overlap_comm": True, "contiguous_gradients": True,
           "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8}


def ds_config():
    return {"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 1,
            "bf16": {"enabled": True}, "gradient_clipping": 0.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}},
            "zero_optimization": DS_ZERO, "steps_per_print": 10**9}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("which", choices=["fsdp2", "deepspeed"])
    p.add_argument("--seconds", type=float, default=21.0)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--probe", type=int, default=2)
    p.add_argument("--metrics", default="")
    a = p.parse_args()
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29557"), ("RANK", "0"),
                 ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(k, v)
    import torch
    import torch.distributed as dist
    from torch_gpt2 import GPT

    torch.manual_seed(0)
    model = GPT(48, 25, 1600, T, 50304)
    idx = torch.randint(0, 50257, (B, T), device="cuda")
    tgt = torch.randint(0, 50257, (B, T), device="cuda")
    if a.which == "fsdp2":
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        dist.init_process_group("nccl", rank=0, world_size=1)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
        off = CPUOffloadPolicy(pin_memory=True)
        for blk in model.h:
            fully_shard(blk, mp_policy=mp, offload_policy=off)
        fully_shard(model, mp_policy=mp, offload_policy=off)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
        impl = f"torch {torch.__version__} FSDP2 + CPUOffloadPolicy(pin_memory), fused CPU AdamW"

        def step(_):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(idx, tgt)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.item()
    else:
        import deepspeed
        eng, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                            config=ds_config())
        impl = (f"DeepSpeed {deepspeed.__version__} ZeRO-2 + offload_optimizer cpu "
                "(DeepSpeedCPUAdam; pin_memory, overlap_comm, contiguous_gradients)")

        def step(_):
            loss = eng(idx, tgt)
            eng.backward(loss)
            eng.step()
            return loss.item()

    clock = harness.StepClock()
    harness.run_steady(step, clock, a.warmup, a.seconds, probe_steps=a.probe)
    if a.metrics:
        clock.write(a.metrics)
    first = next(q for q in clock.points if q[0] >= a.warmup)
    dt = clock.points[-1][1] - first[1]
    print(json.dumps({"impl": impl, "warmup": a.warmup, "tokens_per_step": B * T,
                      "steps": clock.points[-1][0], "window_s": dt,
                      "tokens_per_s": (clock.points[-1][0] - first[0]) * B * T / dt,
                      "peak_gpu_GiB": torch.cuda.max_memory_allocated() / 2**30}), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
