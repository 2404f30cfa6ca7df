"""A GPT in the shape nanoGPT gives one: (logits, loss) outputs, the last position's logits
without targets, fused attention (F.scaled_dot_product_attention) or, with attention="manual",
the two products and a masked softmax written out. Written for gpubench's tests."""
import math

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, width, heads, attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.attention == "manual":
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            y = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab, context, width, layers, heads, attention):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, attention) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx, targets=None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        if targets is None:
            return self.head(x[:, [-1], :]), None
        logits = self.head(x)
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def gpt(vocab=256, context=64, width=64, layers=2, heads=4, attention="sdpa"):
    return TinyGPT(vocab, context, width, layers, heads, attention)
