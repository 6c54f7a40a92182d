"""Benchmark workloads: each returns (name, model or function, example inputs, dtype tolerance key)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class MLP(torch.nn.Module):
    def __init__(self, width: int = 256, depth: int = 8):
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)])

    def forward(self, x):
        return self.layers(x).relu()


def elementwise_chain(x, y):
    a = torch.sigmoid(x) * torch.tanh(y)
    b = torch.sqrt(torch.abs(x) + 1.0)
    return torch.where(x > 0, a, b) * torch.exp(-y.abs())


def layer_norm_gelu_residual(x, w, b):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b)) + x


def softmax(x):
    return torch.softmax(x, dim=-1)


class Block(torch.nn.Module):
    """Pre-norm transformer block: attention through scaled_dot_product_attention, GELU MLP."""

    def __init__(self, d: int = 256, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TwoBlocks(torch.nn.Module):
    def __init__(self, d: int = 256, heads: int = 4):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(d, heads) for _ in range(2)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def cpu_workloads(seed: int = 0) -> list[tuple[str, object, tuple]]:
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g)

    torch.manual_seed(seed)
    return [
        ("mlp 8xLinear(256) b128", MLP().eval(), (rnd(128, 256),)),
        ("elementwise chain 2048x2048", elementwise_chain, (rnd(2048, 2048), rnd(2048, 2048))),
        ("layer norm+GELU+residual 2048x1024", layer_norm_gelu_residual,
         (rnd(2048, 1024), rnd(1024), rnd(1024))),
        ("softmax 2048x2048", softmax, (rnd(2048, 2048),)),
        ("2 transformer blocks d256 h4 b4 t128", TwoBlocks().eval(), (rnd(4, 128, 256),)),
    ]


__all__ = ["cpu_workloads", "LogitsOf", "MLP", "TwoBlocks", "math"]


class LogitsOf(torch.nn.Module):
    """A transformers causal language model's prefill returning its logits (no KV cache)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits
