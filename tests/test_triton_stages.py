"""Staged reductions (passes/codegen/triton/stages.py): a group whose reductions would launch few
programs and that needs several passes or writes full-level outputs (a training batch norm, a
softmax or normalization over long rows) runs as one group per pass (split when it has few
programs) plus a pointwise group, matching eager; long contiguous rows of a one-pass reduction
split (passes/codegen/triton/split.py). Staged kernels come back from the compile cache.

Kernels run under the Triton interpreter, as in test_triton_backend.py (see its docstring for why
``TRITON_INTERPRET`` is set here, at collection).
"""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import copy  # noqa: E402
import importlib.util  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pipeline import compilation_of, compile_with_plan  # noqa: E402
from pipeline.numerics import compare  # noqa: E402
from pipeline.testing import tolerance  # noqa: E402
from conftest import record_kernels, rerun_with_interpreter  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

PLAN = {"extends": "cpu-inference", "options": {"codegen": {"backend": "triton"}, "capture": {"fullgraph": True}}}
# Training with batch norm decomposed on every device (keep_on keeps ATen's on CUDA by default).
TRAINING = {"extends": "training", "options": {"codegen": {"backend": "triton"}, "decompose": {"keep_on": {}},
                                               "capture": {"fullgraph": True}}}
KERNELS: list = []      # what the last compile's codegen put in place of its groups (forward, then backward)


@pytest.fixture(autouse=True)
def _record_kernels(monkeypatch, request):
    seen: list = []
    record_kernels(monkeypatch, request, seen, lambda target: hasattr(target, "group"))
    KERNELS.clear()
    import passes.codegen.triton.generate as generate
    original = generate.generate

    def keep_all(graph, context, **options):
        out = original(graph, context, **options)
        KERNELS.extend(n.target for n in out.graph.nodes if hasattr(n.target, "group"))
        return out
    monkeypatch.setattr(generate, "generate", keep_all)
    yield


def staged() -> list:
    from passes.codegen.triton.stages import StagedKernel
    return [k for k in KERNELS if isinstance(k, StagedKernel)]


def stage_kinds(kernel) -> list[str]:
    return [type(k).__name__ for k in kernel.kernels]


def run(fn, *args, plan=PLAN):
    compiled = compile_with_plan(fn, plan)
    with torch.no_grad():
        problem = compare(fn(*args), compiled(*args))
    assert problem is None, problem
    return compiled


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last], ids=["nchw", "channels-last"])
def test_training_batch_norm_runs_staged_and_matches_eager(monkeypatch, layout):
    """Forward: mean, variance, then the normalized ReLU output (two split stages and a pointwise
    one); backward: the two per-channel sums, then the input gradient; each channel's elements
    contiguous (NCHW: chunks of its rows) or strided (channels-last, as the zoo's CUDA convnets).
    Outputs, gradients and running statistics match eager. (The convolution has no bias, as
    before a batch norm: its gradient would be a sum of values that cancel to zero, noise in any
    summation order.)"""
    monkeypatch.setenv("PIPELINE_CACHE_GRAPHS", "0")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    model = model.to(memory_format=layout)
    reference = copy.deepcopy(model)
    compiled = compile_with_plan(model, TRAINING)
    x = torch.randn(16, 3, 32, 32).contiguous(memory_format=layout)
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = compiled(ours)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected = reference(theirs)
    expected.backward(grad)
    assert compare(expected, out) is None
    assert compare(theirs.grad, ours.grad, what="input gradient") is None
    rtol, atol = tolerance(torch.float32)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):    # sums of 16384 products
        torch.testing.assert_close(p.grad, q.grad, rtol=8 * rtol, atol=8 * atol, msg=name)
    for name in ("running_mean", "running_var"):
        assert compare(getattr(reference[1], name), getattr(model[1], name), what=name) is None
    forward, backward = staged()
    assert stage_kinds(forward) == ["SplitKernel", "SplitKernel", "TritonKernel"]
    assert stage_kinds(backward) == ["SplitKernel", "TritonKernel"]
    columns = "'XBLOCK': 1" if layout == torch.contiguous_format else "'XBLOCK': 8"
    assert columns in forward.kernels[0].partial.source


def test_softmax_over_few_long_rows_runs_staged():
    x = torch.randn(3, 20000) * 4
    x[1, 7] = float("inf")          # that row is NaN in eager too
    run(lambda t: torch.softmax(t, -1), x)
    [kernel] = staged()
    assert stage_kinds(kernel) == ["SplitKernel", "SplitKernel", "TritonKernel"]


def test_a_full_level_output_that_a_reduction_reads_is_recomputed_by_its_stage():
    """A residual block's batch norm backward: the ReLU-masked sum of two gradients is an output
    (it flows on to the shortcut) and what the per-channel sums reduce."""
    def backward(g1, g2, x, mean, w):
        g = torch.where(x > 0, g1 + g2, 0.0)
        return g, g.sum(0), ((x - mean) * g).sum(0) * w, g * w - (x - mean) * g.sum(0) / x.shape[0]

    args = [torch.randn(2048, 24) for _ in range(3)] + [torch.randn(24), torch.randn(24)]
    run(backward, *args)
    [kernel] = staged()
    assert stage_kinds(kernel) == ["SplitKernel", "TritonKernel"]


def test_a_long_row_sum_splits_into_chunks_of_the_row():
    from passes.codegen.triton.split import SplitKernel
    run(lambda t: (t * 2).sum(-1), torch.randn(5, 17000))
    [kernel] = [k for k in KERNELS if isinstance(k, SplitKernel)]
    assert "'XBLOCK': 1" in kernel.partial.source and not staged()


def test_short_rows_and_split_reductions_off_stay_one_kernel():
    run(lambda t: torch.softmax(t, -1), torch.randn(3, 8000))       # a program per row is enough
    assert KERNELS and not staged()
    torch._dynamo.reset()
    KERNELS.clear()
    plan = {**PLAN, "options": {**PLAN["options"], "codegen": {"backend": "triton", "split_reductions": False}}}
    run(lambda t: torch.softmax(t, -1), torch.randn(3, 20000), plan=plan)
    assert KERNELS and not staged()


def test_staged_kernels_compile_for_sm90():
    """Each stage of a channels-last batch norm's forward (partial and combine kernels of both
    statistics, the pointwise output) compiles to PTX and a cubin for the H200, no GPU needed."""
    from passes.codegen.triton.runtime import compile_all_for_sm90

    def batch_norm(t, w, b):
        mean = t.mean((0, 2, 3), keepdim=True)
        var = ((t - mean) ** 2).mean((0, 2, 3), keepdim=True)
        return torch.relu((t - mean) * torch.rsqrt(var + 1e-5) * w + b)

    x = torch.randn(16, 8, 32, 32).contiguous(memory_format=torch.channels_last)
    run(batch_norm, x, torch.randn(8, 1, 1), torch.randn(8, 1, 1))
    [kernel] = staged()
    stages = [k for stage in kernel.kernels for k in ((stage.partial, stage.combine) if hasattr(stage, "partial")
                                                      else (stage,))]
    results = compile_all_for_sm90(stages)
    assert len(results) == 5 and all(r["ptx_bytes"] > 0 and r["cubin_bytes"] > 0 for r in results)


def test_a_staged_kernel_comes_back_from_the_compile_cache(tmp_path, monkeypatch):
    from passes.codegen.triton.stages import StagedKernel
    monkeypatch.delenv("PIPELINE_CACHE_GRAPHS", raising=False)
    revived: list = []
    original = StagedKernel.from_data.__func__
    monkeypatch.setattr(StagedKernel, "from_data",
                        classmethod(lambda cls, data, codec: revived.append(original(cls, data, codec)) or revived[-1]))

    def norm(t, w):
        return (t - t.mean(0)) * torch.rsqrt(t.var(0, correction=0) + 1e-5) * w

    args = (torch.randn(2048, 24), torch.randn(24))
    for _ in range(2):
        torch._dynamo.reset()
        compiled = compile_with_plan(norm, PLAN, cache={"dir": str(tmp_path)})
        with torch.no_grad():
            assert compare(norm(*args), compiled(*args)) is None
    assert compilation_of(compiled).graphs[0].cache["status"] == "hit" and len(revived) == 1


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(contiguous=st.booleans(), length=st.integers(0, 600), width=st.integers(2, 40),
       which=st.sampled_from(["norm", "softmax", "center", "range", "shared"]), scale=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float16]))
def test_staged_reductions_match_eager(contiguous, length, width, which, scale, dtype):
    """Random multi-pass reductions with full-level outputs over few long contiguous rows or
    many rows of a few strided columns, with or without a broadcast weight after them, in
    float32 or float16 (the outer values between stages are stored in the graph's dtype; not
    bfloat16: the interpreter's conversions to it do not round to nearest)."""
    torch._dynamo.reset()
    KERNELS.clear()
    dim = -1 if contiguous else 0
    shape = (width % 5 + 1, 16384 + length * 7) if contiguous else (1024 + length, width)
    x = torch.randn(*shape).to(dtype)
    w = (torch.randn(shape[0], 1) if contiguous else torch.randn(width)).to(dtype)

    def f(t, weight):
        if which == "norm":
            out = (t - t.mean(dim, keepdim=True)) * torch.rsqrt(t.var(dim, keepdim=True, correction=0) + 1e-5)
        elif which == "softmax":
            out = torch.softmax(t, dim)
        elif which == "center":
            out = t - t.sum(dim, keepdim=True) / t.shape[dim]
        elif which == "shared":         # a full-level output that the reduction reads too
            shared = torch.relu(t) * 2
            return shared, shared - shared.mean(dim, keepdim=True) * weight
        else:
            low, high = t.amin(dim, keepdim=True), t.amax(dim, keepdim=True)
            out = (t - low) / (high - low)
        return out * weight if scale else out

    run(f, x, w)
    assert staged()


def test_module_in_a_fresh_process():
    """Only when something imported triton before this module could set TRITON_INTERPRET."""
    rerun_with_interpreter(__file__)
