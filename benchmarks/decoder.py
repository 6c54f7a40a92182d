"""A small decoder-only language model with a static KV cache, for the serving benchmarks and tests.

The cache of every layer lives in one buffer ``kv`` of shape (layers, 2, batch, heads, max_len,
head_dim); each decode step writes the new key and value of each layer into its slice with
``index_copy_`` at position ``pos`` (a 1-element int64 tensor, so a new position is not a new
graph) and attends over the whole cache with a mask hiding positions after ``pos``."""
from __future__ import annotations

import torch
import torch.nn.functional as F


class DecoderLayer(torch.nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor, cache: torch.Tensor, pos: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        cache[0].index_copy_(2, pos, k)
        cache[1].index_copy_(2, pos, v)
        att = F.scaled_dot_product_attention(q, cache[0], cache[1], attn_mask=mask)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Decoder(torch.nn.Module):
    """``forward(ids, pos)``: logits of the tokens ``ids`` (batch, 1) at position ``pos``."""

    def __init__(self, vocab: int = 50257, d: int = 768, heads: int = 12, layers: int = 12,
                 batch: int = 8, max_len: int = 2048):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.pos_embed = torch.nn.Embedding(max_len, d)
        self.layers = torch.nn.ModuleList([DecoderLayer(d, heads) for _ in range(layers)])
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.register_buffer("kv", torch.zeros(layers, 2, batch, heads, max_len, d // heads))
        self.register_buffer("positions", torch.arange(max_len))

    def forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.pos_embed(pos)
        mask = (self.positions <= pos).view(1, 1, 1, -1)
        for index, layer in enumerate(self.layers):
            x = layer(x, self.kv[index], pos, mask)
        return self.head(self.ln(x))
