"""Split reductions (passes/codegen/triton/split.py): a strided-axis reduction that would launch few
programs runs as a partial and a combine kernel, matching eager (sums, max, min, NaN, half types,
epilogues), staying one kernel where it should, and coming back from the compile cache.

Kernels run under the Triton interpreter, as in test_triton_backend.py (see its docstring for why
``TRITON_INTERPRET`` is set here, at collection).
"""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pipeline import compilation_of, compile_with_plan  # noqa: E402
from pipeline.numerics import compare  # noqa: E402
from conftest import record_kernels, rerun_with_interpreter  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

PLAN = {"extends": "cpu-inference", "options": {"codegen": {"backend": "triton"}, "capture": {"fullgraph": True}}}
KERNELS: list = []      # what the last compile's codegen put in place of its groups


@pytest.fixture(autouse=True)
def _record_kernels(monkeypatch, request):
    record_kernels(monkeypatch, request, KERNELS, lambda target: hasattr(target, "group"))
    yield


def bias_gradients(g, h, w):
    """A backward's column sums: a bias gradient, a norm weight's gradient (with a prologue) and
    an epilogue on one of them."""
    return g.sum(0), (g * h * w).sum(0) * 0.5, h.amax(0)


def run(fn, *args, plan=PLAN):
    compiled = compile_with_plan(fn, plan)
    with torch.no_grad():
        out = compiled(*args)
        problem = compare(fn(*args), out)
    assert problem is None, problem
    return compiled


def split_kernels() -> list:
    from passes.codegen.triton.split import SplitKernel
    return [k for k in KERNELS if isinstance(k, SplitKernel)]


def test_column_sums_over_many_rows_run_as_partial_and_combine_kernels():
    g, h = torch.randn(2048, 40), torch.randn(2048, 40)
    h[7, 3] = float("nan")          # amax's NaN survives the split
    run(bias_gradients, g, h, torch.randn(40))
    [kernel] = split_kernels()
    assert "partials over" in kernel.partial.source and "combining" in kernel.combine.source


def test_wide_column_sums_split_rather_than_narrow_their_programs():
    """3072 columns would give one kernel enough programs only with 8 columns each."""
    run(lambda t: t.sum(0), torch.rand(1024, 3072))
    [kernel] = split_kernels()
    assert "'XBLOCK': 64" in kernel.partial.source


def test_a_split_kernel_called_with_other_strides_runs_its_group_eagerly():
    g, h, w = torch.randn(2048, 40), torch.randn(2048, 40), torch.randn(40)
    run(bias_gradients, g, h, w)
    [kernel] = split_kernels()
    transposed = torch.randn(40, 2048).t()          # the same shape, other strides
    with torch.no_grad():
        assert compare(bias_gradients(transposed, h, w), kernel(transposed, h, w)) is None


def test_half_precision_columns_round_like_eager():
    g = torch.randn(1536, 24).to(torch.float16)
    run(lambda t: (t.sum(0), t.float().sum(0) * 3), g)
    assert split_kernels()


@pytest.mark.parametrize("shape", [(64, 40), (2048, 1)], ids=["few-rows", "one-column"])
def test_short_columns_and_contiguous_rows_stay_one_kernel(shape):
    run(lambda t: t.sum(0), torch.randn(*shape))
    torch._dynamo.reset()
    run(lambda t: t.sum(-1), torch.randn(40, 2048))
    assert not split_kernels()


def norm_weight_gradient(h0, d1, d2, g, rstd, w):
    """An RMS norm's backward over a recomputed residual stream, as partition leaves llama's last
    layer: a column sum (the weight's gradient) beside full-size outputs, reading a per-row scale
    (``rstd``, ``[rows, 1]``)."""
    a1 = h0 + d1
    a2 = a1 + d2
    normed = a2 * rstd
    return (normed * g).sum(0), a1 * 2, a2 * 2, normed * w


def test_a_per_row_scale_does_not_make_a_column_sum_read_one_column_per_program():
    """The scale walks the rows with stride 1, but the matrices walk the columns so: programs take
    64 columns each (coalesced), not one column of rows 2048 elements apart."""
    from passes.codegen.triton.blocks import choose_blocks, reduces_contiguous_axis
    from passes.kernel_ir.loops import analyze
    from pipeline.testing import run_passes
    args = [torch.randn(1024, 512) for _ in range(4)] + [torch.rand(1024, 1) + 0.5, torch.randn(512)]
    graph = run_passes(["functionalize", "decompose", "fuse"], torch.fx.symbolic_trace(norm_weight_gradient), args)
    [group] = [n.target for n in graph.graph.nodes if type(n.target).__name__ == "FusedGroup"]
    nest = analyze(group)
    assert not reduces_contiguous_axis(nest) and choose_blocks(nest).xblock > 1
    run(norm_weight_gradient, *args)


def test_split_reductions_off_keeps_one_kernel():
    plan = {**PLAN, "options": {**PLAN["options"], "codegen": {"backend": "triton", "split_reductions": False}}}
    run(bias_gradients, torch.randn(2048, 40), torch.randn(2048, 40), torch.randn(40), plan=plan)
    assert KERNELS and not split_kernels()


def test_a_split_kernel_comes_back_from_the_compile_cache(tmp_path, monkeypatch):
    from passes.codegen.triton.split import SplitKernel
    monkeypatch.delenv("PIPELINE_CACHE_GRAPHS", raising=False)
    revived: list = []
    original = SplitKernel.from_data.__func__
    monkeypatch.setattr(SplitKernel, "from_data",
                        classmethod(lambda cls, data, codec: revived.append(original(cls, data, codec)) or revived[-1]))
    args = (torch.randn(2048, 40), torch.randn(2048, 40), torch.randn(40))
    for _ in range(2):
        torch._dynamo.reset()
        compiled = compile_with_plan(bias_gradients, PLAN, cache={"dir": str(tmp_path)})
        with torch.no_grad():
            assert compare(bias_gradients(*args), compiled(*args)) is None
    assert compilation_of(compiled).graphs[0].cache["status"] == "hit" and len(revived) == 1


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(rows=st.integers(1024, 1500), columns=st.integers(2, 70), keep=st.booleans(),
       which=st.sampled_from(["sum", "amax", "amin", "sum-epilogue"]))
def test_split_reductions_match_eager(rows, columns, keep, which):
    """Random row counts (chunks that do not divide them), column counts and reductions. (One
    column is a contiguous row, never split.)"""
    torch._dynamo.reset()
    x, y = torch.randn(rows, columns), torch.randn(rows, columns)

    def f(a, b):
        if which == "sum-epilogue":
            return ((a * b).sum(0, keepdim=keep) + 1).sigmoid()
        return getattr(torch, which)(a.exp() - b, 0, keepdim=keep)

    run(f, x, y)
    assert split_kernels()


def test_module_in_a_fresh_process():
    """Only when something imported triton before this module could set TRITON_INTERPRET."""
    rerun_with_interpreter(__file__)
