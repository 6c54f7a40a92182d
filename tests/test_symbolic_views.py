"""Views of one symbolic size (a decoder's ``[s, 64] -> [1, s, 64]`` after a matmul) are written
with -1 and join the kernel reading them, as static views do, instead of staying host views; a view
whose kernel could not read its symbols' values from its inputs (``[4, s, 16]`` of ``[4 * s, 16]``
read alone) stays a host view."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import compilation_of, compile_with_plan
from pipeline.numerics import compare

DYNAMIC = {"extends": "cpu-inference", "options": {"capture": {"dynamic": True}}}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield


def _calls(compiled, fn, sizes, make):
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n in sizes:
            args = make(n, generator)
            problem = compare(fn(*args), compiled(*args), what=f"size {n}")
            assert problem is None, problem
    return compilation_of(compiled).graphs[-1]


def test_a_matmul_result_viewed_with_a_leading_unit_axis_is_read_by_its_kernel():
    def fn(x, w):
        n = x.shape[0]
        return torch.nn.functional.layer_norm((x @ w).view(1, n, 16), (16,)) * 2

    w = torch.randn(16, 16)
    record = _calls(compile_with_plan(fn, DYNAMIC), fn, (5, 9, 12),
                    lambda n, g: (torch.randn(n, 16, generator=g), w))
    assert record.kernels == 1
    assert "aten_view(" not in record.final_code and "reinterpret_tensor" not in record.final_code, record.final_code
    assert any("written with -1 instead of a size computed" in n["message"] for n in record.notes)


@settings(max_examples=20, deadline=None)
@given(lead=st.integers(0, 2), middle=st.booleans(), squeeze=st.booleans(), reduce=st.booleans())
def test_unit_views_of_symbolic_sizes_preserve_semantics(lead, middle, squeeze, reduce):
    """Random insertions and removals of size-1 axes around a symbolic and a static dim, read by a
    pointwise or a reduction kernel, match eager at several sizes."""
    torch._dynamo.reset()

    def fn(x, w):
        y = x @ w                                            # [n, 1, 8] when squeeze, else [n, 8]
        n = x.shape[0]
        shape = [1] * lead + [n] + ([1] if middle else []) + [8]
        v = y.reshape(shape)
        return v.sum(-1) if reduce else torch.sigmoid(v) + 1

    w = torch.randn(8, 8)

    def make(n, g):
        x = torch.randn(n, 8, generator=g)
        return (x.unsqueeze(1) if squeeze else x), w
    _calls(compile_with_plan(fn, DYNAMIC), fn, (3, 6, 11), make)


def test_a_view_splitting_a_multiple_of_the_symbol_stays_a_host_view_for_a_kernel_reading_it_alone():
    """``[4 * s, 16] -> [4, s, 16]`` read by a kernel with no other input: absorbed, the kernel's
    only input would have size ``4 * s`` and no size to read ``s`` from, so it would run eagerly."""
    def fn(x, w):
        s = x.shape[1]
        return torch.sigmoid((x.reshape(-1, 16) @ w).view(4, s, 16))

    w = torch.randn(16, 16)
    record = _calls(compile_with_plan(fn, DYNAMIC), fn, (5, 9, 12),
                    lambda n, g: (torch.randn(4, n, 16, generator=g), w))
    assert record.kernels == 1 and "runs eagerly" not in " ".join(n["message"] for n in record.notes)
