"""Calls eager PyTorch rejects get eager's error from the compiled model too, without compiling a
graph and without using up the recompile limit: a NumPy array where a tensor belongs, inputs of
a dtype the weights do not have."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline import compilation_of, compile_with_plan
from pipeline.numerics import compare


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _error(fn, *args) -> tuple[type, str]:
    with pytest.raises(Exception) as info:
        fn(*args)
    return type(info.value), str(info.value)


BAD_INPUTS = {
    "numpy": lambda: np.random.randn(2, 8).astype(np.float32),
    "float64": lambda: torch.randn(2, 8, dtype=torch.float64),
    "int64": lambda: torch.randint(0, 3, (2, 8)),
}


@pytest.mark.parametrize("kind", sorted(BAD_INPUTS))
def test_an_input_eager_rejects_gets_eagers_error_without_a_compile(kind):
    model = torch.nn.Linear(8, 8)
    compiled = compile_with_plan(model, "default", options={"capture": {"on_recompile_limit": "error"}})
    with torch.no_grad():
        compiled(torch.randn(2, 8))
        bad = BAD_INPUTS[kind]()
        assert _error(compiled, bad) == _error(model, bad)
    record = compilation_of(compiled)
    assert len(record.graphs) == 1 and record.recompiles == []


def test_rejected_calls_do_not_use_up_the_recompile_limit():
    """Inputs of the wrong dtype never become variants. (A NumPy input is one variant, whose
    call Dynamo leaves to eager after a graph break: it compiles nothing.)"""
    model = torch.nn.Linear(8, 8)
    compiled = compile_with_plan(model, "default", options={"capture": {
        "on_recompile_limit": "error", "recompile_limit": 2, "dynamic": False}})
    with torch.no_grad():
        compiled(torch.randn(2, 8))
        for _ in range(4):
            for kind in ("float64", "int64"):
                with pytest.raises(RuntimeError, match="must have the same dtype"):
                    compiled(BAD_INPUTS[kind]())
        x = torch.randn(5, 8)                      # a legitimate new shape: the second variant
        assert compare(model(x), compiled(x)) is None


def test_numpy_code_inside_a_compiled_function_still_runs():
    def scaled(a: np.ndarray) -> np.ndarray:
        return np.sin(a) * 2

    compiled = compile_with_plan(scaled, "default")
    a = np.random.randn(5)
    np.testing.assert_allclose(compiled(a), scaled(a))


def test_mixed_dtypes_eager_accepts_still_compile():
    def f(x, y):
        return x @ y.to(x.dtype)

    compiled = compile_with_plan(f, "default")
    x, y = torch.randn(3, 4), torch.randn(4, 2, dtype=torch.float64)
    assert compare(f(x, y), compiled(x, y)) is None
    assert len(compilation_of(compiled).graphs) == 1
