"""bench/offload_gpu's and bench/offload_params_gpu's anchors: what a PyTorch
or DeepSpeed user runs instead of ZeRO-Offload, on the same GPT-2 (default
1.5B: 48 x 1600, 25 heads; --shape L C H B picks another; context 1024,
vocab 50304; bench/gpt2_gpu/torch_gpt2.py's model), batch 4 x 1024, bf16,
AdamW, one GPU; --clip MAX clips the global gradient norm as tessera's
run.gradient_clipping does (default 0: none).

  python3 anchors.py fsdp2 --seconds S --metrics M.jsonl
      FSDP2 (fully_shard per block and at the root) with CPUOffloadPolicy
      (pinned host memory) and MixedPrecisionPolicy bf16; fused AdamW on
      the CPU.
  python3 anchors.py deepspeed --seconds S --metrics M.jsonl
      DeepSpeed ZeRO-2 with offload_optimizer cpu (DeepSpeedCPUAdam), in the
      settings DeepSpeed's ZeRO-Offload tutorial and config docs give for
      speed: pin_memory, overlap_comm, contiguous_gradients, 5e8 buckets.
  python3 anchors.py deepspeed3 --shape L C H B --recompute --gpu-cap-gib 24 ...
      DeepSpeed ZeRO-3 with offload_param and offload_optimizer cpu
      (ZeRO-Infinity in host memory): the model built inside
      deepspeed.zero.Init, pin_memory, overlap_comm, contiguous_gradients,
      and the ZeRO-3 sizes Hugging Face's DeepSpeed integration derives from
      the width (reduce_bucket_size C^2, stage3_prefetch_bucket_size 0.9 C^2,
      stage3_param_persistence_threshold 10 C).

--no-pin turns DeepSpeed's pin_memory off (what a user tries when pinned
host memory does not fit). --recompute checkpoints each block's activations (torch.utils.checkpoint,
non-reentrant), as tessera's model.recompute; --gpu-cap-gib caps this
process's GPU memory (torch.cuda.set_per_process_memory_fraction), as
tessera's run.max_gpu_memory.

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

T = 1024


def ds_zero(which, width, pin=True):
    pinned_cpu = {"device": "cpu", "pin_memory": pin}
    if which == "deepspeed":
        return {"stage": 2, "offload_optimizer": pinned_cpu, "overlap_comm": True,
                "contiguous_gradients": True, "reduce_bucket_size": 5e8,
                "allgather_bucket_size": 5e8}
    return {"stage": 3, "offload_optimizer": pinned_cpu, "offload_param": pinned_cpu,
            "overlap_comm": True, "contiguous_gradients": True,
            "reduce_bucket_size": width * width,
            "stage3_prefetch_bucket_size": int(0.9 * width * width),
            "stage3_param_persistence_threshold": 10 * width}


def ds_config(which, batch, width, pin=True, clip=0.0):
    return {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1,
            "bf16": {"enabled": True}, "gradient_clipping": clip,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}},
            "zero_optimization": ds_zero(which, width, pin), "steps_per_print": 10**9}


def recompute_blocks(model):
    """Each block's forward under torch.utils.checkpoint: its activations are
    recomputed in backward instead of kept."""
    import torch.utils.checkpoint as ckpt
    for blk in model.h:
        inner = blk.forward
        blk.forward = lambda x, f=inner: ckpt.checkpoint(f, x, use_reentrant=False)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("which", choices=["fsdp2", "deepspeed", "deepspeed3"])
    p.add_argument("--shape", nargs=4, type=int, default=[48, 1600, 25, 4],
                   metavar=("L", "C", "H", "B"), help="layers, width, heads, micro-batch")
    p.add_argument("--recompute", action="store_true")
    p.add_argument("--gpu-cap-gib", type=float, default=0.0)
    p.add_argument("--no-pin", action="store_true",
                   help="DeepSpeed: pin_memory false (pageable host memory: slower copies, "
                        "but less locked memory)")
    p.add_argument("--clip", type=float, default=0.0,
                   help="max global gradient norm (0: no clipping)")
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

    L, C, H, B = a.shape
    if a.gpu_cap_gib > 0:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, a.gpu_cap_gib * 2**30 / total))
    torch.manual_seed(0)
    if a.which == "deepspeed3":
        import deepspeed
        cfg = ds_config(a.which, B, C, not a.no_pin, a.clip)
        # Built partitioned and on the host, as DeepSpeed's docs say for
        # models that do not fit one device.
        with deepspeed.zero.Init(config_dict_or_path=cfg, remote_device="cpu",
                                 pin_memory=not a.no_pin):
            model = GPT(L, H, C, T, 50304)
    else:
        model = GPT(L, H, C, T, 50304)
    if a.recompute:
        recompute_blocks(model)
    idx = torch.randint(0, 50257, (B, T), device="cuda")
    tgt = torch.randint(0, 50257, (B, T), device="cuda")
    shape = f"{L} x {C}, {H} heads, B{B}{', recompute' if a.recompute else ''}"
    if a.gpu_cap_gib > 0:
        shape += f", GPU capped at {a.gpu_cap_gib:g} GiB"
    shape += f", clipping {a.clip:g}" if a.clip > 0 else ", no clipping"
    if a.which == "fsdp2":
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        dist.init_process_group("nccl", rank=0, world_size=1)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
        off = CPUOffloadPolicy(pin_memory=True)
        for blk in model.h:
            fully_shard(blk, mp_policy=mp, offload_policy=off)
        fully_shard(model, mp_policy=mp, offload_policy=off)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
        impl = (f"torch {torch.__version__} FSDP2 + CPUOffloadPolicy(pin_memory), fused CPU "
                f"AdamW ({shape})")

        def step(_):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(idx, tgt)
            loss.backward()
            if a.clip > 0:  # what FSDP2's users call: the norm over every shard
                torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.item()
    else:
        import deepspeed
        eng, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                            config=ds_config(a.which, B, C, not a.no_pin, a.clip))
        what = ("ZeRO-2 + offload_optimizer cpu" if a.which == "deepspeed" else
                "ZeRO-3 + offload_param cpu + offload_optimizer cpu")
        pin = "pageable host memory" if a.no_pin else "pin_memory"
        impl = (f"DeepSpeed {deepspeed.__version__} {what} (DeepSpeedCPUAdam; {pin}, "
                f"overlap_comm, contiguous_gradients; {shape})")

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
                      "params": sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel()
                                    for p in model.parameters()),
                      "steps": clock.points[-1][0], "window_s": dt,
                      "tokens_per_s": (clock.points[-1][0] - first[0]) * B * T / dt,
                      "peak_gpu_GiB": torch.cuda.max_memory_allocated() / 2**30}), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
