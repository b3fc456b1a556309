"""The Llama of bench/cpu_vs_torch's llama workload in PyTorch, written with
Hugging Face's conventions (what transformers' LlamaForCausalLM computes):
RMSNorm (statistics in fp32), RoPE rotating halves (rotate_half), causal
attention with fewer key/value heads than query heads through
scaled_dot_product_attention (enable_gqa where this torch has it, else
K/V repeated per group), SwiGLU MLP without biases, an untied LM head, the
mean cross entropy. The shape is configs/llama-tiny-cpu.toml's.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Block(nn.Module):
    def __init__(self, C, H, KV, D, inter, eps):
        super().__init__()
        self.H, self.KV, self.D = H, KV, D
        self.input_norm = nn.RMSNorm(C, eps=eps)
        self.q = nn.Linear(C, H * D, bias=False)
        self.k = nn.Linear(C, KV * D, bias=False)
        self.v = nn.Linear(C, KV * D, bias=False)
        self.o = nn.Linear(H * D, C, bias=False)
        self.post_norm = nn.RMSNorm(C, eps=eps)
        self.gate = nn.Linear(C, inter, bias=False)
        self.up = nn.Linear(C, inter, bias=False)
        self.down = nn.Linear(inter, C, bias=False)

    def attend(self, q, k, v):
        try:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        except TypeError:  # torch < 2.5: no enable_gqa
            g = self.H // self.KV
            return F.scaled_dot_product_attention(
                q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=True)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h = self.input_norm(x)
        q = self.q(h).view(B, T, self.H, self.D).transpose(1, 2)
        k = self.k(h).view(B, T, self.KV, self.D).transpose(1, 2)
        v = self.v(h).view(B, T, self.KV, self.D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        a = self.attend(q, k, v).transpose(1, 2).reshape(B, T, self.H * self.D)
        x = x + self.o(a)
        h = self.post_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, L=2, C=128, H=4, KV=2, D=32, inter=384, V=256, T=128, theta=10000.0,
                 eps=1e-5):
        super().__init__()
        self.embed = nn.Embedding(V, C)
        self.layers = nn.ModuleList(Block(C, H, KV, D, inter, eps) for _ in range(L))
        self.norm = nn.RMSNorm(C, eps=eps)
        self.head = nn.Linear(C, V, bias=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
        inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
        f = torch.outer(torch.arange(T, dtype=torch.float32), inv)
        emb = torch.cat([f, f], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x, y):
        T = x.shape[1]
        h = self.embed(x)
        cos, sin = self.cos[:T], self.sin[:T]
        for b in self.layers:
            h = b(h, cos, sin)
        logits = self.head(self.norm(h))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
