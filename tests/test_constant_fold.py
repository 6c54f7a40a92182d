"""``constant-fold`` on values larger than ``max_bytes``: folded when only operators that read them
from memory (attention here) consume them, kept as code when a fused kernel could compute them."""
from __future__ import annotations

import re

import torch
import torch.nn.functional as F

from pipeline import compilation_of, compile_with_plan
from pipeline.numerics import compare

PLAN = {"extends": "cpu-inference", "options": {"capture": {"dynamic": False}}}


class MaskedLayers(torch.nn.Module):
    """Three attention layers, each making the same causal mask from positions alone (4 MB of fp32),
    as transformers' per-layer mask code does."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192)

    def forward(self, x):
        b, t, _ = x.shape
        pos = torch.arange(t, device=x.device)
        causal = (pos[None, :] <= pos[:, None]).expand(b, 1, t, t)
        h = x
        for _ in range(3):
            bias = torch.where(causal, 0.0, -1e4)
            q, k, v = self.qkv(h).view(b, t, 3, 4, 16).permute(2, 0, 3, 1, 4)
            h = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(1, 2).reshape(b, t, 64) + h
        return h


def messages(record) -> list[str]:
    return [note["message"] for note in record.notes if note["pass"] == "constant-fold"]


def test_a_mask_only_attention_reads_is_folded_once_for_every_layer():
    model = MaskedLayers().eval()
    compiled = compile_with_plan(model, PLAN)
    x = torch.randn(4, 512, 64)
    with torch.no_grad():
        assert compare(model(x), compiled(x)) is None
    (record,) = compilation_of(compiled).graphs
    assert "folded 3 constant subexpression(s)" in messages(record)
    code = record.final_code
    reads = re.findall(r"= self\.(\w+)", code)
    assert len(reads) == 3 and len(set(reads)) == 1, reads       # one buffer, read by the 3 layers
    assert "arange" not in code and "where" not in code


def test_a_large_constant_a_kernel_would_compute_stays_code():
    def add_ramp(x):
        return x + torch.arange(x.numel(), dtype=x.dtype).view(x.shape)
    compiled = compile_with_plan(add_ramp, PLAN)
    x = torch.randn(1024, 1024)
    assert compare(add_ramp(x), compiled(x)) is None
    (record,) = compilation_of(compiled).graphs
    assert any("> max_bytes 1048576" in message for message in messages(record)), messages(record)
    assert "_folded_" not in record.final_code
