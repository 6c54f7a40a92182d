"""Attention reading a mask that a dynamic graph computes once per size: the mask's form is found
once per mask, a causal one runs as ``is_causal=True`` and one that hides nothing runs without
it, any other mask is passed as it is; every call matches eager, and the graph is stored in the
compile cache with the calls in it."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pipeline import compilation_of, compile_with_plan
from pipeline.numerics import compare
from passes.per_size_attention import PerSizeMaskAttention
from passes.kernel_ir.extern_layouts import aligned, aligned_copy

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

DYNAMIC = {"extends": "cpu-inference", "options": {"capture": {"dynamic": True}}}


def causal(pos):
    return pos[None, :] <= pos[:, None]


def banded(pos):
    return (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - 4)


def additive_causal(pos):
    return torch.where(causal(pos), 0.0, float("-inf"))


def penalty_causal(pos):
    return torch.where(causal(pos), 0.0, -1e4)      # a finite penalty: not an exclusion


class Layers(torch.nn.Module):
    """Two attention layers reading one mask made from positions alone."""

    def __init__(self, make_mask):
        super().__init__()
        self.make_mask = make_mask
        self.qkv = torch.nn.Linear(32, 96)

    def forward(self, x):
        b, t, _ = x.shape
        mask = self.make_mask(torch.arange(t, device=x.device)).expand(b, 1, t, t)
        h = x
        for _ in range(2):
            q, k, v = self.qkv(h).view(b, t, 3, 2, 16).permute(2, 0, 3, 1, 4)
            h = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, t, 32) + h
        return h


@pytest.fixture
def seen(monkeypatch):
    """The forms found and whether each call ran causal, recorded from every PerSizeMaskAttention."""
    found = {"forms": [], "causal_calls": 0, "calls": 0}
    classify, init = PerSizeMaskAttention._classify, PerSizeMaskAttention.__init__

    def recording_classify(self, query, key, mask):
        made = classify(self, query, key, mask)
        found["forms"].append(made[0])
        return made

    def recording_init(self, op, mask_name, options):
        init(self, op, mask_name, options)

        class Counted:      # the operator, as every call reaches it (named as it, for the cache)
            def __call__(self, query, key, value, **kwargs):
                if not any(getattr(t, "fake_mode", None) for t in (query, key, value)):
                    found["calls"] += 1
                    found["causal_calls"] += bool(kwargs.get("is_causal"))
                return op(query, key, value, **kwargs)

            def __str__(self):
                return str(op)
        self.op = Counted()
    monkeypatch.setattr(PerSizeMaskAttention, "_classify", recording_classify)
    monkeypatch.setattr(PerSizeMaskAttention, "__init__", recording_init)
    return found


def run(model, plan, lengths):
    compiled = compile_with_plan(model, plan)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for t in lengths:
            x = torch.randn(2, t, 32, generator=generator)
            problem = compare(model(x), compiled(x), what=f"length {t}")
            assert problem is None, problem
    return compilation_of(compiled).graphs


@pytest.mark.parametrize("make_mask, form", [(causal, "causal"), (additive_causal, "causal"),
                                             (banded, "mask"), (penalty_causal, "mask")])
def test_a_per_size_mask_is_classified_once_per_size_and_every_call_matches_eager(seen, make_mask, form):
    lengths = [12, 20, 12, 33, 20]
    records = run(Layers(make_mask).eval(), DYNAMIC, lengths)
    assert "per_size_mask_" in records[-1].final_code, records[-1].final_code
    assert seen["forms"] == [form] * len(set(lengths)), seen      # dynamic from the first call
    runs = 2 * len(lengths)                     # two layers per call
    assert seen["calls"] == runs and seen["causal_calls"] == (runs if form == "causal" else 0), seen


def test_the_option_off_leaves_the_mask_in_the_call(seen):
    plan = {"extends": "cpu-inference", "options": {"capture": {"dynamic": True},
                                                    "constant-fold": {"per_size_mask_forms": False}}}
    records = run(Layers(causal).eval(), plan, [12, 20, 33])
    assert "per_size_mask_" not in records[-1].final_code and "attn_mask=" in records[-1].final_code
    assert seen["forms"] == []


def test_a_graph_with_per_size_mask_calls_is_stored_and_loaded(tmp_path, seen, monkeypatch):
    monkeypatch.delenv("PIPELINE_CACHE_GRAPHS", raising=False)
    plan = {**DYNAMIC, "cache": {"dir": str(tmp_path)}}
    cold = run(Layers(causal).eval(), plan, [12, 20, 33])[-1]
    assert cold.cache["status"] == "miss" and cold.cache["stored"], cold.cache
    torch._dynamo.reset()
    warm = run(Layers(causal).eval(), plan, [12, 20, 33, 41])[-1]
    assert warm.cache["status"] == "hit" and "per_size_mask_" in warm.final_code
    assert seen["forms"] and set(seen["forms"]) == {"causal"}


@pytest.mark.parametrize("shape, expand", [((1, 1, 5, 5), None), ((2, 1, 7, 7), (2, 4, 7, 7)),
                                           ((1, 1, 1, 3), None), ((1, 1, 9, 16), None)])
def test_the_aligned_copy_of_a_mask_has_its_values_and_a_layout_the_fused_kernels_take(shape, expand):
    mask = torch.randn(shape)
    if expand is not None:
        mask = mask.expand(expand)
    made = aligned_copy(mask)
    assert aligned(made) and made.shape == mask.shape and torch.equal(made, mask)
