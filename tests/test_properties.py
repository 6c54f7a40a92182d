"""Every built-in pass preserves semantics on random graphs (hypothesis, against eager PyTorch)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings

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
