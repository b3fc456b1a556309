"""The PyTorch anchor of bench/gpt2_gpu: GPT-2 (default 124M: 12 layers, 12
heads, width 768; context 1024, vocab 50304), batch 16, bf16 autocast, SDPA
flash attention, fused AdamW, torch.compile, gradient clipping 1.0.

  python3 torch_gpt2.py --seconds S --metrics M.jsonl [--layers L --heads H --width C --batch B]

Timing (bench/lib/harness.py's run_steady): --warmup steps (compilation
included), a probe of --probe steps, then steps for --seconds, the loss
read every step; each step's timestamp is kept in memory and written to
--metrics. Prints one JSON line (tokens/s over the whole window, the peak
memory). The GPT class is also bench/cpu_vs_torch's model.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402

class Block(nn.Module):
    def __init__(s, C, H):
        super().__init__()
        s.H = H
        s.ln_1, s.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        s.c_attn, s.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        s.c_fc, s.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.c_attn(s.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.H, C // s.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + s.mlp_proj(F.gelu(s.c_fc(s.ln_2(x)), approximate="tanh"))

class GPT(nn.Module):
    def __init__(s, L=12, H=12, C=768, T=1024, V=50304):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        s.h = nn.ModuleList(Block(C, H) for _ in range(L))
        s.ln_f = nn.LayerNorm(C)

    def forward(s, idx, targets):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in s.h:
            x = b(x)
        logits = F.linear(s.ln_f(x), s.wte.weight)  # tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=21.0, help="the timed steady state")
    p.add_argument("--warmup", type=int, default=8, help="steps before it (compilation)")
    p.add_argument("--probe", type=int, default=10, help="steps that time a step")
    p.add_argument("--metrics", default="", help="write each step's timestamp here")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--batch", type=int, default=16)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    model = GPT(L=a.layers, H=a.heads, C=a.width).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    cmodel = torch.compile(model)
    B, T = a.batch, 1024
    data = torch.randint(0, 50257, (8, B, T + 1), device="cuda")

    def step(i):
        d = data[i % 8]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = cmodel(d[:, :-1], d[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    clock = harness.StepClock()
    harness.run_steady(step, clock, a.warmup, a.seconds, probe_steps=a.probe)
    if a.metrics:
        clock.write(a.metrics)
    first = next(q for q in clock.points if q[0] >= a.warmup)
    dt = clock.points[-1][1] - first[1]
    print(json.dumps({"impl": "pytorch-compile", "torch": torch.__version__, "warmup": a.warmup,
                      "tokens_per_step": B * T, "steps": clock.points[-1][0], "window_s": dt,
                      "tokens_per_s": (clock.points[-1][0] - first[0]) * B * T / dt,
                      "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}))


if __name__ == "__main__":
    main()
