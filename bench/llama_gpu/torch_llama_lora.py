"""The LoRA anchor of bench/llama_gpu: the Llama model of the PyTorch anchor
(torch_llama.py, imported from ANCHOR_DIR, not copied) fine-tuned as PEFT
users do it: every base weight frozen, LoRA adapters (A [r, in] kaiming-
uniform, B [out, r] zero, scaled by alpha / r, dropout on their input) on
q, k, v, o, gate, up and down, fused AdamW over the adapters, clipping 1.0,
bf16 autocast, torch.compile. With PACK=1 every row packs random-length
examples end to end, positions restarting in each, and attention stays
inside each example through FlexAttention's document mask (what
torchtitan and HF's packed training do), so it does what tessera does with
data.train.pack = true.

    torch_llama_lora.py ANCHOR_DIR SHAPE B T MODE STEPS RANK [ALPHA DROPOUT PACK MIN MAX]

SHAPE, B, T, MODE (eager | compile) and STEPS as torch_llama.py; RANK the
LoRA rank; ALPHA (default 2 * RANK) and DROPOUT (0.05); PACK 1 packs
examples of MIN..MAX tokens (default 1, 64..1024). Prints one JSON line:
tokens/s over STEPS timed steps (the loss read once at the end), the
trainable parameters, peak GPU memory. Without CUDA it runs on the CPU
(a smoke test of the script, not a figure)."""
import json, math, os, random, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F


class LoraLinear(nn.Module):
    """base(x) + s * B(A(dropout(x))), the base frozen."""

    def __init__(self, base, rank, alpha, dropout):
        super().__init__()
        self.base = base
        self.A = nn.Parameter(torch.empty(rank, base.in_features, device=base.weight.device))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
        self.B = nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device))
        self.scale = alpha / rank
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.base(x) + F.linear(F.linear(self.drop(x), self.A), self.B) * self.scale


class PackedAttention:
    """Stands in for torch.nn.functional inside the anchor's module: its
    scaled_dot_product_attention becomes FlexAttention with the batch's
    document mask; everything else is torch's own."""

    def __init__(self):
        from torch.nn.attention.flex_attention import flex_attention
        self.flex = flex_attention
        self.mask = None

    def __getattr__(self, name):
        return getattr(F, name)

    def scaled_dot_product_attention(self, q, k, v, is_causal=True, enable_gqa=False):
        if q.device.type == "cpu":  # FlexAttention has no CPU backward: a dense mask
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask,
                                                  enable_gqa=enable_gqa)
        return self.flex(q, k, v, block_mask=self.mask, enable_gqa=enable_gqa)


def packed_rows(B, T, lo, hi, rng):
    """Document ids and positions [B, T]: examples of lo..hi tokens end to end."""
    doc = torch.empty(B, T, dtype=torch.int32)
    pos = torch.empty(B, T, dtype=torch.long)
    for b in range(B):
        t, d = 0, 0
        while t < T:
            n = min(rng.randint(lo, hi), T - t)
            doc[b, t:t + n] = d
            pos[b, t:t + n] = torch.arange(n)
            t, d = t + n, d + 1
    return doc, pos


def main():
    if len(sys.argv) < 8 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help") else 2)
    anchors, shape, B, T, mode, steps, rank = (sys.argv[1], sys.argv[2], int(sys.argv[3]),
                                               int(sys.argv[4]), sys.argv[5], int(sys.argv[6]),
                                               int(sys.argv[7]))
    alpha = float(sys.argv[8]) if len(sys.argv) > 8 else 2.0 * rank
    dropout = float(sys.argv[9]) if len(sys.argv) > 9 else 0.05
    pack = (sys.argv[10] if len(sys.argv) > 10 else "1") == "1"
    lo = int(sys.argv[11]) if len(sys.argv) > 11 else 64
    hi = int(sys.argv[12]) if len(sys.argv) > 12 else 1024
    sys.path.insert(0, anchors)
    import torch_llama as anchor
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if shape in anchor.SHAPES:
        L, C, H, KV, I, V, tied = anchor.SHAPES[shape]
    else:
        L, C, H, KV, I, V = (int(x) for x in shape.split(","))
        tied = False
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    m = anchor.Llama(L, C, H, KV, I, V, tied, T).to(dev)
    for p in m.parameters():
        p.requires_grad_(False)
    for blk in m.blocks:
        for name in ("q", "k", "v", "o", "g", "u", "d"):
            setattr(blk, name, LoraLinear(getattr(blk, name), rank, alpha, dropout))
    trainable = [p for p in m.parameters() if p.requires_grad]
    attn = PackedAttention() if pack else None
    if attn is not None:
        anchor.F = attn  # the anchor's blocks call F.scaled_dot_product_attention

    def forward(idx, tgt, pos):
        # The anchor's forward, with each token's own position for RoPE.
        x = m.emb(idx)
        cos, sin = m.cos[pos].unsqueeze(1).to(x.dtype), m.sin[pos].unsqueeze(1).to(x.dtype)
        for blk in m.blocks:
            x = blk(x, cos, sin)
        x = m.norm(x)
        logits = F.linear(x, m.emb.weight if m.head is None else m.head.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.reshape(-1))

    f = torch.compile(forward) if mode == "compile" else forward
    opt = torch.optim.AdamW(trainable, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=dev == "cuda")
    rng = random.Random(0)
    data = []
    for _ in range(4):
        x = torch.randint(0, V, (B, T), device=dev)
        y = torch.randint(0, V, (B, T), device=dev)
        if pack:
            from torch.nn.attention.flex_attention import create_block_mask
            doc, pos = packed_rows(B, T, lo, hi, rng)
            doc, pos = doc.to(dev), pos.to(dev)

            def same_doc(b, h, q, kv, doc=doc):
                return (doc[b, q] == doc[b, kv]) & (q >= kv)

            if dev == "cpu":
                t = torch.arange(T)
                mask = ((doc[:, :, None] == doc[:, None, :]) & (t[:, None] >= t[None, :]))[:, None]
            else:
                mask = create_block_mask(same_doc, B, None, T, T, device=dev)
        else:
            pos, mask = torch.arange(T, device=dev).expand(B, T), None
        data.append((x, y, pos, mask))
    dtype = torch.bfloat16

    def step(i):
        x, y, pos, mask = data[i % 4]
        if attn is not None:
            attn.mask = mask
        with torch.autocast(dev, dtype=dtype):
            loss = f(x, y, pos)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for i in range(3):
        step(i).item()
    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for i in range(steps):
        loss = step(i)
    loss.item()
    if dev == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else 0.0
    print(json.dumps({"impl": f"torch-{torch.__version__}-{mode}-lora{'-packed' if pack else ''}",
                      "shape": shape, "rank": rank, "alpha": alpha, "dropout": dropout,
                      "trainable": sum(p.numel() for p in trainable), "B": B, "T": T,
                      "tokens_per_s": round(B * T * steps / dt), "step_s": dt / steps,
                      "peak_gpu_GiB": round(peak, 2), "device": dev}), flush=True)


if __name__ == "__main__":
    main()
