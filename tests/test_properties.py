"""Every built-in pass preserves semantics on random graphs (hypothesis, against eager PyTorch)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.testing import FLOAT_DTYPES, assert_preserves_semantics, graphs

FAST = settings(max_examples=25, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))
MIXED = FLOAT_DTYPES + (torch.int32,)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield


@FAST
@given(graphs(dtypes=MIXED, mutation=True, input_mutation=True, max_ops=10))
def test_functionalize_preserves_semantics_with_in_place_updates(case):
    assert_preserves_semantics("functionalize", case)


@FAST
@given(graphs(dtypes=MIXED, max_ops=10))
def test_decompose_preserves_semantics(case):
    assert_preserves_semantics("decompose", case)


@FAST
@given(graphs(dtypes=MIXED, mutation=True, max_ops=10))
def test_dce_preserves_semantics(case):
    assert_preserves_semantics("dce", case)


@FAST
@given(graphs(dtypes=MIXED, max_ops=10))
def test_cse_preserves_semantics(case):
    assert_preserves_semantics("cse", case)


@FAST
@given(graphs(dtypes=MIXED, constants=True, max_ops=10))
def test_constant_fold_preserves_semantics(case):
    assert_preserves_semantics("constant-fold", case)


@FAST
@given(graphs(dtypes=MIXED, max_ops=12))
def test_fuse_preserves_semantics(case):
    assert_preserves_semantics("fuse", case)


@settings(FAST, max_examples=40)
@given(graphs(dtypes=MIXED, max_ops=12, max_dim=9))
def test_cpp_codegen_preserves_semantics(case):
    assert_preserves_semantics("codegen", case)


@settings(FAST, max_examples=15)
@given(graphs(dtypes=(torch.float32,), mutation=True, input_mutation=True, max_ops=8))
def test_capture_with_the_debug_plan_preserves_semantics(case):
    assert_preserves_semantics("debug", case)


@settings(FAST, max_examples=15)
@given(graphs(dtypes=(torch.float32, torch.bfloat16), max_ops=10))
def test_default_plan_preserves_semantics(case):
    assert_preserves_semantics("default", case)


matmul_shapes = st.fixed_dictionaries({
    "m": st.integers(1, 9), "k": st.integers(1, 20), "n": st.integers(1, 20),
    "bias": st.sampled_from(["none", "row", "full"]), "transposed": st.booleans(),
})


@settings(FAST, max_examples=30)
@given(matmul_shapes)
def test_pad_mm_preserves_semantics(shape):
    from passes.pad_mm import PadMatmul, PadMmOptions

    m, k, n = shape["m"], shape["k"], shape["n"]
    weight = torch.randn(n, k) if shape["transposed"] else torch.randn(k, n)

    def matmul(x, w, b):
        product = x @ (w.t() if shape["transposed"] else w)
        return product if shape["bias"] == "none" else product + b

    bias = torch.randn(n) if shape["bias"] == "row" else torch.randn(m, n)
    pass_ = PadMatmul(PadMmOptions(multiple=8, min_size=1, devices=["cpu"]))
    assert_preserves_semantics(pass_, torch.fx.symbolic_trace(matmul), [torch.randn(m, k), weight, bias])
