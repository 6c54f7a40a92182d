"""Set-up shared by the modules that check a fusion in the C++ backend and in Triton kernels run
under the interpreter (test_cats, test_gathers, test_pools). Each such module sets
``TRITON_INTERPRET`` before importing this (the interpreter must be chosen before triton is
imported), then takes its autouse fixture from :func:`kernels_fixture`."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from conftest import record_kernels
from pipeline import compilation_of, compile_with_plan
from pipeline.numerics import compare

CPP = {"extends": "cpu-inference", "options": {"capture": {"fullgraph": True}}}
TRITON = {"extends": "cpu-inference", "options": {"codegen": {"backend": "triton"}, "capture": {"fullgraph": True}}}
HAS_TRITON = importlib.util.find_spec("triton") is not None
BACKENDS = [pytest.param(CPP, id="cpp"),
            pytest.param(TRITON, id="triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="no triton"))]


def kernels_fixture(kernels: list):
    """An autouse fixture for a module: a fresh Dynamo and seed for every test and, where the
    interpreter is usable, ``kernels`` refilled with the Triton kernels of each compile."""
    @pytest.fixture(autouse=True)
    def _record_kernels(monkeypatch, request):
        if HAS_TRITON:
            from passes.codegen.triton import runtime as triton_runtime
            record_kernels(monkeypatch, request, kernels,
                           lambda target: isinstance(target, triton_runtime.TritonKernel))
        else:
            torch._dynamo.reset()
        yield
    return _record_kernels


def compiled_record(fn, *args, plan=CPP):
    """Compile ``fn`` with ``plan``, check one call against eager, return the graph's record."""
    torch._dynamo.reset()
    compiled = compile_with_plan(fn, plan)
    with torch.no_grad():
        problem = compare(fn(*args), compiled(*args))
    assert problem is None, problem
    return compilation_of(compiled).graphs[0]


def with_fuse(plan: dict, **options) -> dict:
    """``plan`` with these ``fuse`` options."""
    return {**plan, "options": {**plan["options"], "fuse": options}}
