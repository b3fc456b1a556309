"""The PyTorch anchor of bench/gpt2_gpu: GPT-2 (default 124M: 12 layers, 12
heads, width 768; context 1024, vocab 50304), batch 16, bf16 autocast, SDPA
flash attention, fused AdamW, torch.compile. Prints one JSON line: tokens/s
over the timed steps and the peak memory.
  torch_gpt2.py [STEPS [LAYERS HEADS WIDTH BATCH]]
"""
import json, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F

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
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    L, H, C, B = (int(x) for x in sys.argv[2:6]) if len(sys.argv) > 5 else (12, 12, 768, 16)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    model = GPT(L=L, H=H, C=C).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    cmodel = torch.compile(model)
    T = 1024
    data = torch.randint(0, 50257, (8, B, T + 1), device="cuda")

    def step(i):
        d = data[i % 8]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = cmodel(d[:, :-1], d[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for i in range(8):
        step(i).item()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for i in range(steps):
        step(i).item()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(json.dumps({"impl": "pytorch-compile", "torch": torch.__version__,
                      "tokens_per_s": steps * B * T / dt, "ms_per_step": dt / steps * 1e3,
                      "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}))

if __name__ == "__main__":
    main()
