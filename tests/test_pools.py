"""Pools computed inside kernels (passes/fuse/pools.py): max and average pools as elementwise work
on strided slices, and slices of pads moved onto the padded tensor, in the C++ backend and in
Triton kernels (run under the interpreter; ``TRITON_INTERPRET`` is set here, at collection).
"""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import rerun_with_interpreter  # noqa: E402
from kernel_backends import (BACKENDS, CPP, HAS_TRITON, TRITON, compiled_record, kernels_fixture,  # noqa: E402
                             with_fuse)

KERNELS: list = []      # the Triton kernels of the last Triton compile
_record_kernels = kernels_fixture(KERNELS)


def pools_left(record) -> int:
    return sum(n for name, n in record.contents["extern_calls"].items() if "pool" in name)


def stem(x, scale):
    """A ResNet stem's tail: scale, ReLU, 3x3 max pool of stride 2 with padding."""
    return F.max_pool2d(torch.relu(x * scale), 3, 2, 1)


def transition(x):
    """A DenseNet transition's tail: ReLU, 2x2 average pool."""
    return F.avg_pool2d(torch.relu(x), 2) * 2


@pytest.mark.parametrize("plan", BACKENDS)
def test_a_max_pool_is_read_by_a_kernel_with_masked_strided_loads(plan):
    x = torch.randn(2, 4, 11, 9)
    x[0, 1, 0, 0] = float("nan")
    record = compiled_record(stem, x, torch.randn(4, 1, 1), plan=plan)
    assert pools_left(record) == 0 and "aten_constant_pad_nd" not in record.final_code
    assert any("pool(s) computed elementwise" in n["message"] for n in record.notes)


@pytest.mark.parametrize("plan", BACKENDS)
def test_an_average_pool_joins_the_kernel_that_reads_it(plan):
    record = compiled_record(transition, torch.randn(2, 3, 8, 6), plan=plan)
    assert pools_left(record) == 0 and record.kernels <= 2


def test_max_pool_indices_that_are_read_keep_atens_pool():
    def with_indices(x):
        values, indices = F.max_pool2d(x, 2, return_indices=True)
        return values, indices
    record = compiled_record(with_indices, torch.randn(1, 2, 6, 6))
    assert pools_left(record) == 1


def test_windows_of_differing_sizes_keep_atens_average():
    record = compiled_record(lambda x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False),
                             torch.randn(1, 2, 5, 5))
    assert pools_left(record) == 1


def test_the_window_limit_keeps_large_pools_atens():
    record = compiled_record(lambda x: F.max_pool2d(x, 3), torch.randn(1, 2, 9, 9), plan=with_fuse(CPP, window_pools=4))
    assert pools_left(record) == 1


@pytest.mark.skipif(not HAS_TRITON, reason="no triton")
def test_pool_kernels_compile_for_sm90():
    from passes.codegen.triton.runtime import compile_all_for_sm90
    compiled_record(stem, torch.randn(2, 4, 12, 12, dtype=torch.bfloat16),
                    torch.randn(4, 1, 1, dtype=torch.bfloat16), plan=TRITON)
    made = list(KERNELS)
    results = compile_all_for_sm90(made)
    assert results and all(r["ptx_bytes"] > 0 and r["cubin_bytes"] > 0 for r in results)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(["max", "avg"]), kernel=st.tuples(st.integers(1, 4), st.integers(1, 4)),
       stride=st.tuples(st.integers(1, 3), st.integers(1, 3)), padded=st.booleans(), dilated=st.booleans(),
       ceil_mode=st.booleans(), count_include_pad=st.booleans(), size=st.tuples(st.integers(4, 13), st.integers(4, 13)),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 2 ** 16))
def test_random_pools_match_eager(kind, kernel, stride, padded, dilated, ceil_mode, count_include_pad, size, dtype,
                                  seed):
    """Random max and average pools (padding, dilation, ceil mode, NaN inputs) after elementwise
    work, compiled with the C++ backend, against eager."""
    generator = torch.Generator().manual_seed(seed)
    padding = (kernel[0] // 2, kernel[1] // 2) if padded else (0, 0)
    x = torch.randn(2, 3, *size, generator=generator).to(dtype)
    x[1, 2, 0, 1] = float("nan")
    if kind == "max":
        dilation = 2 if dilated else 1
        if any((k - 1) * dilation + 1 > s + 2 * p for k, s, p in zip(kernel, size, padding)):
            return
        def fn(v):
            return F.max_pool2d(v.exp(), kernel, stride, padding, dilation, ceil_mode) - 1
    else:
        if any(k > s + 2 * p for k, s, p in zip(kernel, size, padding)):
            return
        def fn(v):
            return F.avg_pool2d(v.tanh(), kernel, stride, padding, ceil_mode, count_include_pad) + 1
    compiled_record(fn, x)


def test_module_in_a_fresh_process():
    rerun_with_interpreter(__file__)
