"""Copies that keep their input's layout (``.contiguous()`` of a contiguous tensor, ``.clone()``)
are dropped by ``fuse`` where nothing can tell them apart, and kept where something can: the
input is the caller's, the copy is returned, or the copy changes the layout."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import compilation_of, compile_with_plan
from pipeline.numerics import compare


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield


def _record(fn, *args, plan="cpu-inference"):
    compiled = compile_with_plan(fn, plan)
    with torch.no_grad():
        expected, out = fn(*args), compiled(*args)
    assert compare(expected, out) is None
    return compilation_of(compiled).graphs[0], out


def _dropped(record) -> int:
    notes = [n["message"] for n in record.notes if n["pass"] == "fuse" and "unchanged layout dropped" in n["message"]]
    return int(notes[0].split()[0]) if notes else 0


def _copy_between_matmuls(x, w):
    return (x @ w).view(4, 8, 16).clone().view(32, 16) @ w


def test_a_copy_between_two_matmuls_is_no_kernel():
    """``mm -> view -> clone -> view -> mm`` (Swin's attention output): without the copy the
    second matmul reads the first one's result; with it, a copy kernel runs in between."""
    x, w = torch.randn(32, 16), torch.randn(16, 16)
    record, _ = _record(_copy_between_matmuls, x, w)
    assert _dropped(record) == 1 and record.kernels == 0
    torch._dynamo.reset()
    plan = {"extends": "cpu-inference", "options": {"fuse": {"drop_identity_copies": False}}}
    record, _ = _record(_copy_between_matmuls, x, w, plan=plan)
    assert _dropped(record) == 0 and record.kernels == 1


def test_copies_of_inputs_returned_copies_and_layout_changes_stay():
    def fn(x, w):
        y = x @ w
        a = x.clone() + 1                      # a copy of the caller's tensor
        b = y.clone()                          # returned: the caller owns it
        c = y.t().contiguous() * 2             # a new layout
        return a, b, c, y

    x, w = torch.randn(16, 16), torch.randn(16, 16)
    record, (a, b, c, y) = _record(fn, x, w)
    assert _dropped(record) == 0
    assert b.data_ptr() != y.data_ptr() and c.is_contiguous()


@settings(max_examples=25, deadline=None)
@given(source=st.sampled_from(["input", "input_view", "computed", "computed_view"]),
       returned=st.booleans(), transpose=st.booleans(), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_dropping_copies_preserves_semantics_and_ownership(source, returned, transpose, dtype):
    """Random copies: the compiled function matches eager, returns nothing that aliases its input
    or another output, and writing into a returned copy changes nothing else."""
    torch._dynamo.reset()

    def fn(x, w):
        base = {"input": x, "input_view": x.view(8, 32),
                "computed": torch.tanh(x @ w), "computed_view": torch.tanh(x @ w).view(8, 32)}[source]
        base = base.t() if transpose else base
        copy = base.contiguous() if transpose else base.clone()
        result = copy * 3 + 1
        return (result, copy) if returned else (result,)

    x, w = torch.randn(16, 16, dtype=dtype), torch.randn(16, 16, dtype=dtype)
    record, out = _record(fn, x, w)
    if returned:
        assert out[1].data_ptr() != x.data_ptr() and out[1].data_ptr() != out[0].data_ptr()
        before = x.clone()
        out[1].add_(1)
        assert torch.equal(x, before)
    if source.startswith("input") or returned or transpose:
        assert _dropped(record) == 0
    else:
        assert _dropped(record) == 1
