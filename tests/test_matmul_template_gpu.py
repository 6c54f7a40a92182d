"""The ``matmul-template`` pass on a CUDA GPU: compiled (not interpreted) template kernels against
eager, every candidate configuration, and the autotune decision with its cache.

Skipped without a CUDA device, and in a process that interprets Triton kernels
(``TRITON_INTERPRET=1``, which test_matmul_template.py sets for the CPU tests: run this file in
its own pytest process on the GPU machine).
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from pipeline import compilation_of, compile_with_plan
from pipeline.numerics import compare

INTERPRETING = os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on", "y")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETING,
                                reason="needs a CUDA GPU and a process without TRITON_INTERPRET")

FORCED = {"extends": "max-autotune-no-cudagraphs",
          "options": {"matmul-template": {"choose": "always", "min_flops": 0}}}


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    torch._dynamo.reset()
    monkeypatch.setenv("PIPELINE_CACHE_GRAPHS", "0")


def gelu_epilogue(x, w, b, s):
    return F.gelu(x @ w + b) * s


def linear_residual(x, w, b, r):
    return torch.relu(F.linear(x, w, b)) + r


def inputs(m: int, n: int, k: int, dtype: torch.dtype, *, linear: bool = False) -> tuple:
    """Operands of ``gelu_epilogue`` (or ``linear_residual``). Shapes here keep K and N multiples
    of 8, so ``pad-mm`` leaves the matmul as it is; M, N and K are ragged for every tile size."""
    def r(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype)
    w = r(n, k) if linear else r(k, n)
    return (r(m, k), w * 0.05, r(n), r(m, n) if linear else r(n))


def run(fn, args, plan) -> tuple:
    """Compile, call twice (first launch, then the direct-launch path), compare both with eager."""
    compiled = compile_with_plan(fn, plan)
    expected = fn(*args)
    with torch.no_grad():
        for _ in range(2):
            problem = compare(expected, compiled(*args))
            assert problem is None, problem
    record = compilation_of(compiled).graphs[0]
    notes = [n["message"] for n in record.notes if n["pass"] == "matmul-template"]
    templates = [k for k in record.contents["kernels"] if "matmul template" in k["source"]]
    return record, notes, templates


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(1000, 1200, 296), (1024, 1024, 1024)], ids=str)
def test_forced_template_matches_eager(dtype, shape):
    _, notes, templates = run(gelu_epilogue, inputs(*shape, dtype), FORCED)
    assert len(templates) == 1, notes
    _, notes, templates = run(linear_residual, inputs(*shape, dtype, linear=True), FORCED)
    assert len(templates) == 1, notes


def test_every_candidate_configuration_matches_eager(monkeypatch):
    import passes.matmul_template as matmul_template
    from passes.matmul_template.source import candidate_configs
    m, n, k = 1000, 1200, 296
    for dtype in (torch.bfloat16, torch.float32):
        for config in candidate_configs(m, n, k, dtype, limit=20):
            monkeypatch.setattr(matmul_template, "candidate_configs", lambda *a, config=config: [config])
            torch._dynamo.reset()
            _, notes, templates = run(gelu_epilogue, inputs(m, n, k, dtype), FORCED)
            assert len(templates) == 1 and config.describe() in " ".join(notes), notes


def test_autotune_records_both_times_and_caches_the_decision(tmp_path):
    plan = {"extends": "max-autotune-no-cudagraphs", "cache": {"dir": str(tmp_path)},
            "options": {"matmul-template": {"min_flops": 0}}}
    args = inputs(2048, 1024, 1024, torch.bfloat16)
    _, (note,), _ = run(gelu_epilogue, args, plan)
    assert " ms" in note and "extern" in note and ("matmul template" in note or "extern kept" in note), note
    assert list(tmp_path.rglob("mmtemplate_*.json"))
    torch._dynamo.reset()
    _, (again,), _ = run(gelu_epilogue, args, plan)
    assert "cached decision" in again and ("matmul template" in note) == ("matmul template" in again), again
