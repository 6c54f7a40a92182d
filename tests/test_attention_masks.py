"""Attention masks broadcast along the key axis are made dense before tracing (capture's
``dense_attention_masks``), so tracing keeps the fused attention kernel instead of the float32 math
path. On the CPU host the rewrite is exercised with ``dense_attention_masks: [cpu]``; which kernel
CUDA then picks is checked on the GPU (benchmarks/probes/sdpa_mask.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pipeline import compile_with_plan
from pipeline.numerics import compare
from passes.attention_masks import dense_attention_masks

PLAN = {"extends": "default", "options": {"capture": {"dense_attention_masks": ["cpu"]}}}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield


def encoder_attention(q, k, v, rows):
    """Two attention calls reading one mask indexed by query row and broadcast along the key axis
    (stride 0 there, as transformers' encoder masks under tracing: ViT's is all True)."""
    mask = rows[:, None, :, None].expand(q.shape[0], 1, q.shape[2], k.shape[2])
    hidden = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F.scaled_dot_product_attention(hidden, k, v, mask)


def inputs(batch: int, length: int, grad: bool = False):
    q, k, v = (torch.randn(batch, 3, length, 8, requires_grad=grad) for _ in range(3))
    return q, k, v, torch.rand(batch, length) > 0.0       # every row kept (no row masked whole)


def test_a_broadcast_mask_is_made_dense_once_for_every_attention_call_that_reads_it():
    seen = []

    def backend(gm, example_inputs):
        seen.append(dense_attention_masks(gm, ["cpu"]))
        seen.append(gm.code)
        return gm.forward

    compiled = torch.compile(encoder_attention, backend=backend)
    args = inputs(2, 7)
    assert compare(encoder_attention(*args), compiled(*args)) is None
    made, code = seen
    assert made == 1 and code.count(".contiguous()") == 1


def test_a_mask_with_a_unit_stride_key_axis_and_masks_on_other_devices_are_left_alone():
    counts = []

    def backend(gm, example_inputs):
        counts.append(dense_attention_masks(gm, ["cuda"]))       # a CPU mask, CUDA only
        counts.append(dense_attention_masks(gm, ["cpu"]))
        return gm.forward

    def padding_mask(q, k, v, keep):      # broadcast along the query axis only
        mask = keep[:, None, None, :].expand(q.shape[0], 1, q.shape[2], k.shape[2])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, k, v, _ = inputs(2, 5)
    keep = torch.rand(2, 5) > 0.3
    keep[:, 0] = True
    compiled = torch.compile(padding_mask, backend=backend)
    assert compare(padding_mask(q, k, v, keep), compiled(q, k, v, keep)) is None
    assert counts == [0, 0]


@pytest.mark.parametrize("batch,length", [(2, 7), (3, 16), (1, 33)])
def test_compiled_attention_with_dense_masks_matches_eager(batch, length):
    compiled = compile_with_plan(encoder_attention, PLAN)
    args = inputs(batch, length)
    with torch.no_grad():
        assert compare(encoder_attention(*args), compiled(*args)) is None


def test_gradients_through_a_dense_mask_match_eager():
    compiled = compile_with_plan(encoder_attention, {"extends": "training",
                                                     "options": {"capture": {"dense_attention_masks": ["cpu"]}}})
    eager_args = inputs(2, 9, grad=True)
    ours_args = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in eager_args)
    encoder_attention(*eager_args).square().sum().backward()
    compiled(*ours_args).square().sum().backward()
    for want, got in zip(eager_args[:3], ours_args[:3]):
        assert compare(want.grad, got.grad) is None
