"""C++ reduction kernels keep a row buffer in the output's row when they can (softmax's
exponentials, scaled in place by the last pass), on the stack otherwise, and match eager either
way, also when buffers of dead tensors are reused for outputs."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import compile_report, compile_with_plan
from pipeline.numerics import compare


def compiled_kernels(fn, *args, plan="cpu-inference") -> list[str]:
    torch._dynamo.reset()
    compiled = compile_with_plan(fn, plan, report=True)
    with torch.no_grad():
        problem = compare(fn(*args), compiled(*args))
    assert problem is None, problem
    return [k["source"] for g in compile_report(compiled)["graphs"] for k in g["kernels"]]


def softmax_of_matmul(a, b):
    """The matmul's result is dead after the softmax: with buffer reuse on, the kernel's output
    may take a dead buffer."""
    return torch.mm(a, b).softmax(-1), torch.mm(a, b * 2).softmax(-1)


def exp_ratio_plus_input(x):
    """The last pass loads x again: the exponentials stay in a stack buffer."""
    e = x.exp()
    return e / e.sum(-1, keepdim=True) + x


def test_softmax_keeps_its_exponentials_in_the_output_row():
    (source,) = compiled_kernels(lambda x: torch.softmax(x, -1), torch.randn(16, 300))
    assert "float* const row_" in source and "float row_" not in source


def test_a_row_along_a_strided_axis_stays_on_the_stack():
    (source,) = compiled_kernels(lambda x: torch.softmax(x, 0), torch.randn(40, 16))
    assert "float row_" in source and "float* const row_" not in source


def test_a_last_pass_that_loads_an_input_keeps_the_stack_buffer():
    (source,) = compiled_kernels(exp_ratio_plus_input, torch.randn(16, 300))
    assert "float row_" in source and "float* const row_" not in source


@pytest.mark.parametrize("reuse", [[], ["cpu"]])
def test_kernels_fed_by_dead_matmul_results_match_eager(reuse):
    plan = {"extends": "cpu-inference", "options": {"codegen": {"reuse_buffers": reuse}}}
    sources = compiled_kernels(softmax_of_matmul, torch.randn(24, 40), torch.randn(40, 300), plan=plan)
    assert any("float* const row_" in s for s in sources)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(st.integers(1, 70), min_size=1, max_size=3), dim=st.integers(-3, 2),
       log=st.booleans(), dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
def test_property_softmax_like_kernels_match_eager(shape, dim, log, dtype):
    dim = dim % len(shape)
    x = (torch.randn(shape) * 3).to(dtype)

    def fn(x):
        y = torch.log_softmax(x, dim) if log else torch.softmax(x, dim)
        return y * 2, (x.float().exp() * 0.5).sum(dim)

    compiled_kernels(fn, x)


@pytest.mark.parametrize("rows", [1, 3])
def test_outputs_sharing_the_cached_value_are_both_right(rows):
    def two_outputs(x):
        e = (x - x.amax(-1, keepdim=True)).exp()
        return e / e.sum(-1, keepdim=True), e * 3
    compiled_kernels(two_outputs, torch.randn(rows, 500))


def test_a_reduction_over_axes_around_a_kept_one_loops_over_each_axis():
    """A batch norm's statistics reduce (N, H, W) around the channels: one loop per reduced axis,
    so no element's indices cost a division, and the innermost loop walks H*W contiguously."""
    def channel_stats(x):
        mean = x.mean((0, 2, 3), keepdim=True)
        return ((x - mean) ** 2).mean((0, 2, 3)), mean
    (source,) = compiled_kernels(channel_stats, torch.randn(3, 5, 4, 6))
    assert "for (int64_t i0 = 0; i0 < INT64_C(3); ++i0)" in source, source
    assert "for (int64_t i2 = 0; i2 < INT64_C(24); ++i2)" in source, source
    assert " / INT64_C(" not in source and " % INT64_C(" not in source, source


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(st.integers(1, 5), min_size=3, max_size=4), data=st.data())
def test_property_reductions_over_unmergeable_axes_match_eager(shape, data):
    axes = sorted(data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=2, max_size=len(shape) - 1,
                                     unique=True)))
    operation = data.draw(st.sampled_from(["sum", "amax", "centered"]))

    def reduce(x):
        if operation == "sum":
            return (x * 2).sum(axes)
        if operation == "amax":
            return x.exp().amax(axes)
        return (x - x.amin(axes, keepdim=True)).sum(axes)
    compiled_kernels(reduce, torch.randn(shape))


def test_a_batch_norms_running_statistics_join_its_statistics_kernel():
    """In training mode the running mean and variance (scaled per channel) are computed in the
    kernel that computes the batch statistics: one kernel per batch norm, besides the count of
    batches tracked."""
    torch.manual_seed(0)
    norm = torch.nn.BatchNorm2d(6).train()
    compiled = compile_with_plan(norm, "default")
    x = torch.randn(4, 6, 5, 5)
    reference = torch.nn.BatchNorm2d(6).train()
    with torch.no_grad():
        expected, got = reference(x), compiled(x)
    assert compare(expected, got) is None
    torch.testing.assert_close(norm.running_mean, reference.running_mean)
    torch.testing.assert_close(norm.running_var, reference.running_var)
    from pipeline import compilation_of
    record = compilation_of(compiled).graphs[0]
    per_channel = [k for k in record.contents["kernels"] if "reduction" in k["kind"]]
    assert len(per_channel) == 1 and record.kernels <= 2, record.contents["kernels"]
