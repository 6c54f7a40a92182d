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


DYNAMIC = {"extends": "cpu-inference", "options": {"capture": {"dynamic": True}}}


def test_a_mask_made_from_symbolic_sizes_is_computed_once_per_size():
    """With the sequence length symbolic the mask depends on an input (the size): it is computed
    by one per-size call, once for each length seen, and every call still matches eager. The
    three layers' masks are equal computations: one value, read by every layer."""
    model = MaskedLayers().eval()
    compiled = compile_with_plan(model, DYNAMIC)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for t in (24, 40, 24, 33, 40):
            x = torch.randn(2, t, 64, generator=generator)
            problem = compare(model(x), compiled(x), what=f"length {t}")
            assert problem is None, problem
    (record,) = compilation_of(compiled).graphs
    assert any(m.startswith("folded per size: 1 value(s)") for m in messages(record)), messages(record)
    assert "arange" not in record.final_code and "per_size_" in record.final_code
    masks = set(re.findall(r"per_size_mask_\w+\(\w+, \w+, \w+, (\w+)\)", record.final_code))
    assert len(masks) == 1, masks       # the layers' equal masks are one value, made once per size


def test_a_size_determined_value_that_is_an_output_stays_fresh_per_call():
    """A value made from sizes alone that the graph returns is not shared between calls: the caller
    may write into it."""
    def ramp_and_scale(x):
        ramp = torch.arange(x.shape[0], dtype=x.dtype).mul(2.0).add(1.0)
        return ramp, x * ramp[:, None]
    compiled = compile_with_plan(ramp_and_scale, DYNAMIC)
    for n in (5, 7, 7):
        x = torch.randn(n, 3)
        ramp, scaled = compiled(x)
        expected_ramp, expected_scaled = ramp_and_scale(x)
        assert compare((expected_ramp, expected_scaled), (ramp, scaled)) is None
        ramp.zero_()      # must not reach the next call's result


def test_per_size_values_are_made_once_per_size_and_the_oldest_size_is_dropped():
    from passes.constant_fold import PerSizeValues
    runs = []

    def make(n):
        runs.append(n)
        return (torch.arange(n) * 2,)
    values = PerSizeValues(make, entries=2, name="per_size_test")
    first = values(3)
    assert values(3)[0] is first[0] and runs == [3]
    values(4)
    values(5)                       # 3 is dropped: two sizes kept
    assert sorted(values.values) == [(4,), (5,)]
    assert torch.equal(values(3)[0], torch.arange(3) * 2) and runs == [3, 4, 5, 3]
