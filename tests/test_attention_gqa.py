"""Grouped-query attention takes the unrepeated key and value heads (capture's ``gqa_attention``,
passes/attention_gqa.py): transformers' ``repeat_kv`` copies disappear and the attention call gets
``enable_gqa=True`` on the devices the option names (the CPU by default)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pipeline import compilation_of, compile_with_plan
from pipeline.numerics import compare


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield


def repeat_kv(x: torch.Tensor, rep: int) -> torch.Tensor:
    """transformers' repeat_kv: each key/value head once per query head of its group."""
    b, kv, s, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, rep, s, d).reshape(b, kv * rep, s, d)


def grouped_attention(q, k, v, mask):
    rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, repeat_kv(k, rep), repeat_kv(v, rep), attn_mask=mask) * 2.0


def inputs(heads: int = 8, kv_heads: int = 2, length: int = 12):
    q = torch.randn(2, heads, length, 16)
    k, v = torch.randn(2, kv_heads, length, 16), torch.randn(2, kv_heads, length, 16)
    mask = torch.ones(length, length, dtype=torch.bool).tril()[None, None].expand(2, 1, length, length)
    return q, k, v, mask.contiguous()


def compiled_record(fn, args, plan="default"):
    compiled = compile_with_plan(fn, plan)
    assert compare(fn(*args), compiled(*args)) is None
    return compilation_of(compiled).graphs[0]


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 1), (6, 3)])
def test_repeated_key_value_heads_are_not_copied(heads, kv_heads):
    record = compiled_record(grouped_attention, inputs(heads, kv_heads))
    assert "attention_for_cpu_default(arg0_1, arg1_1, arg2_1," in record.final_code, record.final_code
    assert record.kernels == 2, record.final_code      # the mask's conversion and the scaling: no copies


def test_gqa_attention_off_keeps_the_copies():
    plan = {"extends": "default", "options": {"capture": {"gqa_attention": []}}}
    record = compiled_record(grouped_attention, inputs(), plan)
    assert record.kernels == 4, record.final_code      # key and value copies, the mask, the scaling


def test_key_and_value_repeated_differently_are_left_alone():
    def mixed(q, k, v, mask):
        return F.scaled_dot_product_attention(q, repeat_kv(k, 4), repeat_kv(v.repeat(1, 2, 1, 1), 2),
                                              attn_mask=mask)

    record = compiled_record(mixed, inputs())
    assert record.kernels >= 2, record.final_code


def test_attention_whose_inputs_require_gradients_keeps_the_repeats():
    """Training graphs keep repeat_kv (the fused kernels' backward with grouped heads is unchecked):
    the forward graph is the same with the option on and off, and gradients match eager."""
    kernels = []
    for devices in (["cpu"], []):
        torch._dynamo.reset()
        q, k, v, mask = inputs()
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        plan = {"extends": "training", "options": {"capture": {"gqa_attention": devices}}}
        compiled = compile_with_plan(grouped_attention, plan)
        compiled(q, k, v, mask).sum().backward()
        got = [t.grad.clone() for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        grouped_attention(q, k, v, mask).sum().backward()
        assert all(compare(t.grad, g) is None for t, g in zip((q, k, v), got))
        kernels.append(compilation_of(compiled).graphs[0].kernels)
    assert kernels[0] == kernels[1]
