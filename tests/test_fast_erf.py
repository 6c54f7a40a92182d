"""The Triton backend's branch-free fp32 erf (``pp_erf``) and exact GELU (``pp_gelu``), constants
from ``benchmarks/probes/fit_erf.py``, run on CPU through the Triton interpreter.

As in ``test_triton_backend.py``, ``TRITON_INTERPRET=1`` is set at collection, before anything
imports triton; should triton have been imported earlier without it, these tests skip (that
module's ``test_module_in_a_fresh_process`` covers the same situation for the backend).
"""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pipeline import compile_with_plan  # noqa: E402

HAS_TRITON = importlib.util.find_spec("triton") is not None
pytestmark = [pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install -e '.[gpu]')"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]   # x * x of huge x

PLAN = {"extends": "cpu-inference", "options": {"codegen": {"backend": "triton"}}}
ABS_ERROR = 2e-7          # erf's largest absolute error, fp32 (fit_erf.py measures 1e-7)
REL_ERROR = 5e-7          # erf's relative error below |x| = 0.5 (fit_erf.py measures 2e-7)
TINY = 2.0**-126          # smallest normal fp32: below it fp32 itself holds few digits
COMPILED: dict = {}       # fn -> its compiled form, for this test (one backend, no recompiles)


@pytest.fixture(autouse=True)
def _interpreter():
    torch._dynamo.reset()
    COMPILED.clear()
    from passes.codegen.triton import runtime as triton_runtime
    if not triton_runtime.interpreting() or triton_runtime.interpreter_problem():
        pytest.skip("needs triton imported with TRITON_INTERPRET=1 (see test_triton_backend.py)")


def erf(x):
    return torch.erf(x)


def gelu(x):
    return torch.nn.functional.gelu(x)


def run_triton(fn, x: torch.Tensor) -> torch.Tensor:
    if fn not in COMPILED:
        COMPILED[fn] = compile_with_plan(fn, PLAN)
    with torch.no_grad():
        return COMPILED[fn](x)


def grid() -> torch.Tensor:
    """Dense over [-5, 5] (erf is +-1 in fp32 beyond 3.92), log-spaced from the smallest
    subnormal to 1e30, both signs, and the special values."""
    dense = torch.linspace(-5.0, 5.0, 200_001)
    logs = torch.logspace(-45, 30, 20_001).float()
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 0.45, -0.45,
                             3.96875, torch.finfo(torch.float32).max, torch.finfo(torch.float32).tiny])
    return torch.cat([dense, logs, -logs, specials])


def erf_errors(x: torch.Tensor, got: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(absolute, relative) error of ``got`` against float64 erf."""
    want = torch.erf(x.double())
    err = (got.double() - want).abs()
    return err, err / want.abs().clamp_min(TINY)


def assert_erf_accurate(x: torch.Tensor, got: torch.Tensor) -> None:
    finite = ~x.isnan()
    assert got[x.isnan()].isnan().all()
    err, rel = erf_errors(x[finite], got[finite])
    assert err.max() <= ABS_ERROR, f"abs error {err.max():.3g} at x = {x[finite][err.argmax()].item()!r}"
    small = x[finite].abs() < 0.5
    worst = rel[small].max()
    assert worst <= REL_ERROR, f"relative error {worst:.3g} at x = {x[finite][small][rel[small].argmax()].item()!r}"


def test_erf_is_within_2e_7_of_float64_erf_and_accurate_relative_to_small_x():
    x = grid()
    assert_erf_accurate(x, run_triton(erf, x))


def test_erf_matches_eager_fp32_erf():
    x = grid()
    torch.testing.assert_close(run_triton(erf, x), torch.erf(x), atol=2.5e-7, rtol=5e-7, equal_nan=True)


def test_erf_of_special_values():
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1e-20, -1e-20, 1e-45, 3.96875, 10.0])
    got = run_triton(erf, x)
    assert got[:2].tolist() == [1.0, -1.0] and got[2].isnan()
    assert got[3] == 0.0 and not got[3].signbit() and got[4] == 0.0 and got[4].signbit()
    torch.testing.assert_close(got[5:7], torch.tensor([1.1283791e-20, -1.1283791e-20]), rtol=3e-7, atol=0)
    assert got[7] > 0 and got[8:].tolist() == [1.0, 1.0]


SEARCH = settings(max_examples=25, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))


@SEARCH
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=64, max_size=64))
def test_erf_of_any_fp32_values_is_accurate(values):
    x = torch.tensor(values, dtype=torch.float32)
    assert_erf_accurate(x, run_triton(erf, x))


def test_exact_gelu_matches_float64_gelu():
    """Within 1e-7 * |x| + 3e-7 * |gelu(x)| (fit_erf.py --gelu measures 0.45 of that); gelu(-inf)
    is NaN, as eager's 0.5 * x * (1 + erf(x / sqrt 2)) gives."""
    x = grid()
    got = run_triton(gelu, x)
    want = gelu(x.double())
    assert got.isnan().equal(want.isnan() | (x == -float("inf")))
    ok = want.isfinite()
    assert got[x == float("inf")].tolist() == [float("inf")]
    bound = 1e-7 * x[ok].double().abs() + 3e-7 * want[ok].abs() + 1e-45
    err = (got[ok].double() - want[ok]).abs()
    assert (err <= bound).all(), f"gelu error {err.max():.3g} at x = {x[ok][(err - bound).argmax()].item()!r}"


def test_exact_gelu_matches_eager_fp32_gelu():
    """Up to both erfs' errors times 0.5 * |x| (1 + erf cancels for negative x in either). The
    reference is gelu in float64: eager's fp32 CPU gelu depends on the machine's vector ISA
    (with AVX-512 kernels it gives NaN for +inf, and a different tail)."""
    x = grid()
    got, want = run_triton(gelu, x), gelu(x.double()).float()
    assert got.isnan().equal(want.isnan())
    ok = x.isfinite()
    assert got[~ok].equal(want[~ok]) or got[~ok].isnan().equal(want[~ok].isnan())
    bound = 0.5 * (ABS_ERROR + 1.2e-7) * x[ok].abs() + 5e-7 * want[ok].abs()
    err = (got[ok] - want[ok]).abs()
    assert (err <= bound).all(), f"gelu differs by {err.max():.3g} at x = {x[ok][(err - bound).argmax()].item()!r}"


def test_bf16_exact_gelu_matches_eager():
    """Within bf16's rounding, except below x = -5.6, where eager's 1 + erf(x / sqrt 2) cancels to
    0 and pp_gelu keeps x * erfc(|x| / sqrt 2) / 2, under 2e-7 in size. Against gelu in float64
    rounded to bf16: eager's own bf16 CPU gelu has a machine-dependent tail."""
    x = torch.linspace(-6, 6, 4001, dtype=torch.bfloat16)
    torch.testing.assert_close(run_triton(gelu, x), gelu(x.double()).to(torch.bfloat16), atol=2e-7, rtol=8e-3)


def test_float64_erf_keeps_libdevice_accuracy():
    x = torch.linspace(-6, 6, 4001, dtype=torch.float64)
    torch.testing.assert_close(run_triton(erf, x), torch.erf(x), atol=1e-15, rtol=1e-14)


def generated_sources(fn, x: torch.Tensor, monkeypatch) -> str:
    """The source of every Triton kernel compiling ``fn`` for ``x`` generates."""
    from passes.codegen.triton import generate as triton_generate
    from passes.codegen.triton import runtime as triton_runtime
    sources = []
    original = triton_generate.generate

    def recording(graph, context, **kwargs):
        out = original(graph, context, **kwargs)
        sources.extend(n.target.source for n in out.graph.nodes if isinstance(n.target, triton_runtime.TritonKernel))
        return out

    monkeypatch.setattr(triton_generate, "generate", recording)
    run_triton(fn, x)
    assert sources, "no Triton kernel was generated"
    return "\n".join(sources)


@pytest.mark.parametrize("fn, helper", [(erf, "pp_erf("), (gelu, "pp_gelu(")])
def test_fp32_kernels_use_the_written_out_helpers_not_libdevice(fn, helper, monkeypatch):
    source = generated_sources(fn, torch.randn(64), monkeypatch)
    assert helper in source and "tl.math.erf" not in source


def test_fp64_kernels_keep_libdevice_erf(monkeypatch):
    source = generated_sources(erf, torch.randn(64, dtype=torch.float64), monkeypatch)
    assert "tl.math.erf" in source and "pp_erf" not in source


def test_tanh_gelu_keeps_its_tanh_form(monkeypatch):
    source = generated_sources(lambda x: torch.nn.functional.gelu(x, approximate="tanh"), torch.randn(64), monkeypatch)
    assert "pp_tanh(" in source and "pp_erf" not in source and "pp_gelu" not in source


@SEARCH
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=64, max_size=64))
def test_exact_gelu_of_any_fp32_values_is_accurate(values):
    x = torch.tensor(values, dtype=torch.float32)
    got, want = run_triton(gelu, x), gelu(x.double())
    assert got.isnan().equal(want.isnan() | (x == -float("inf")))
    ok = want.isfinite()
    err = (got[ok].double() - want[ok]).abs()
    assert (err <= 1e-7 * x[ok].double().abs() + 3e-7 * want[ok].abs() + 1e-45).all()
