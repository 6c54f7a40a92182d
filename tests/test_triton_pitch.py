"""Rows stored with a padded pitch (pad-mm's logits) run over the padded extent in Triton kernels
(passes/codegen/triton/pitch.py): results match eager, output pads' padding is written by the
kernel, inputs whose storage ends before the padding run the exact kernel, and on sm_90 the
pitched accesses compile to 16-byte vector instructions. Also: pointwise kernels over long rows
load per-row values once per block.

Kernels run under the Triton interpreter, as in test_triton_backend.py (see its docstring for why
``TRITON_INTERPRET`` is set here, at collection).
"""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pipeline import compilation_of, compile_with_plan  # noqa: E402
from pipeline.numerics import compare  # noqa: E402
from conftest import record_kernels, rerun_with_interpreter  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

PLAN = {"extends": "cpu-inference", "options": {"codegen": {"backend": "triton"}, "capture": {"fullgraph": True}}}
KERNELS: list = []      # the Triton kernels of the last compile


@pytest.fixture(autouse=True)
def _record_kernels(monkeypatch, request):
    from passes.codegen.triton import runtime as triton_runtime
    record_kernels(monkeypatch, request, KERNELS, lambda target: isinstance(target, triton_runtime.TritonKernel))
    yield


def padded(rows: int, cols: int, pitch: int, dtype=torch.float32) -> torch.Tensor:
    """``rows`` x ``cols`` values in rows ``pitch`` apart (a slice of a padded matmul result), the
    padding full of values no kernel may use."""
    base = torch.randn(rows, pitch).to(dtype)
    base[:, cols:] = float("nan")
    return base[:, :cols]


def row_statistics(x):
    """Cross-entropy's forward pieces: the row maximum and the sum of exponentials."""
    m = x.float().amax(-1, keepdim=True)
    return m, (x.float() - m).exp().sum(-1, keepdim=True)


def softmax_gradient_into_padded_rows(x, m, s, g):
    """Cross-entropy's backward: a pointwise function of the logits written into rows padded for
    the next matmul (the pad value is not zero, so a kernel leaving it unwritten would show)."""
    return F.pad(((x.float() - m).exp() / s * g).to(x.dtype), (0, 7), value=1.5)


def run(fn, *args):
    compiled = compile_with_plan(fn, PLAN)
    with torch.no_grad():
        out = compiled(*args)
        problem = compare(fn(*args), out)
    assert problem is None, problem
    return compiled, out


def row_vectors(rows: int) -> tuple:
    return torch.randn(rows, 1), torch.rand(rows, 1) + 1, torch.randn(rows, 1)


def test_a_reduction_over_padded_rows_reads_the_padded_extent():
    run(row_statistics, padded(5, 1030, 1032))
    [kernel] = KERNELS
    assert kernel.covers == ((0, 4 * 1032 + 1032),)
    assert "pmask = rr < 1032" in kernel.source and "rmask = rr < 1030" in kernel.source


def test_a_pointwise_kernel_writes_its_output_pads_padding():
    x = padded(3, 1033, 1040)
    _, out = run(softmax_gradient_into_padded_rows, x, *row_vectors(3))
    [kernel] = KERNELS
    assert kernel.padded_outputs == (0,) and kernel.fills == []
    assert torch.all(out[:, 1033:] == 1.5)
    assert "vmask = i1 < 1033" in kernel.source


def test_an_input_whose_storage_ends_before_its_padding_runs_the_exact_kernel():
    compiled, _ = run(row_statistics, padded(4, 1030, 1032))
    [kernel] = KERNELS
    short = torch.randn(4 * 1032 - 2).as_strided((4, 1030), (1032, 1))   # the last row's padding is missing
    with torch.no_grad():
        assert compare(row_statistics(short), compiled(short)) is None
    assert kernel.exact_calls == 1 and kernel.exact is not None and "pmask" not in kernel.exact.source


def test_contiguous_rows_and_pitch_rows_off_keep_the_exact_kernel():
    run(row_statistics, torch.randn(4, 1030))
    assert not KERNELS[0].covers
    torch._dynamo.reset()
    plan = {**PLAN, "options": {**PLAN["options"], "codegen": {"backend": "triton", "pitch_rows": False}}}
    compiled = compile_with_plan(row_statistics, plan)
    x = padded(4, 1030, 1032)
    with torch.no_grad():
        assert compare(row_statistics(x), compiled(x)) is None
    assert not KERNELS[0].covers and "pmask" not in KERNELS[0].source


@pytest.mark.parametrize("rows,length", [(5, 4096), (3, 5003), (4, 8200)])
def test_long_rows_read_each_rows_values_once_per_block(rows, length):
    """Rows at least a block long: a block spans two rows at most, so per-row values are two
    scalar loads and a select, and the row index needs no division (pitched or not)."""
    x, (m, s, g) = torch.randn(rows, length), row_vectors(rows)
    run(lambda t, a, b, c: ((t - a).exp() / b * c, t * 2 + a.sin()), x, m, s, g)
    assert KERNELS and all("rend = (r0 + 1) * " in k.source and "x //" not in k.source for k in KERNELS)


def test_a_pitched_kernel_and_its_exact_twin_come_back_from_the_compile_cache(tmp_path, monkeypatch):
    from passes.codegen.triton.runtime import TritonKernel
    monkeypatch.delenv("PIPELINE_CACHE_GRAPHS", raising=False)
    revived: list = []
    original = TritonKernel.from_data.__func__

    def recording(cls, data, codec):
        revived.append(original(cls, data, codec))
        return revived[-1]

    monkeypatch.setattr(TritonKernel, "from_data", classmethod(recording))
    x = padded(4, 1030, 1032)
    for _ in range(2):
        torch._dynamo.reset()
        compiled = compile_with_plan(row_statistics, PLAN, cache={"dir": str(tmp_path)})
        with torch.no_grad():
            compiled(x)
    assert compilation_of(compiled).graphs[0].cache["status"] == "hit"
    [kernel] = [k for k in revived if k.covers]
    assert kernel.exact is not None and "pmask" in kernel.source
    short = torch.randn(4 * 1032 - 2).as_strided((4, 1030), (1032, 1))
    with torch.no_grad():
        assert compare(row_statistics(short), compiled(short)) is None
    assert kernel.exact_calls == 1


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(rows=st.integers(2, 4), cols=st.integers(9, 300), extra=st.integers(1, 24),
       which=st.sampled_from(["statistics", "softmax", "gradient"]))
def test_padded_rows_match_eager(rows, cols, extra, which):
    """Random row lengths and pitches (a multiple of 8 past the row's end), each kind of nest."""
    pitch = -(-(cols + extra) // 8) * 8
    if cols % 8 == 0:
        cols -= 1
    x = padded(rows, cols, pitch)
    torch._dynamo.reset()
    if which == "statistics":
        run(row_statistics, x)
    elif which == "softmax":
        run(lambda t: torch.softmax(t * 2, -1), x)
    else:
        run(lambda t, m, s, g: F.pad((t - m).exp() / s * g, (0, pitch - cols)), x, *row_vectors(rows))
    assert KERNELS and KERNELS[0].covers


def test_pitched_accesses_compile_to_vector_instructions_for_sm90():
    """bf16 rows of 50257 in rows 50264 apart (GPT-2's logits): every global access of both
    cross-entropy kernels is a 16-byte vector, except the backward's per-row loads (4-byte values
    read per element). Compiled in a fresh process (this one interprets kernels)."""
    x = padded(2, 50257, 50264, torch.bfloat16)
    run(row_statistics, x)
    forward = KERNELS[0].path
    torch._dynamo.reset()
    run(softmax_gradient_into_padded_rows, x, *row_vectors(2))
    backward = KERNELS[0].path
    script = Path(__file__).parents[1] / "benchmarks" / "probes" / "ptx_vectors.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(script), str(forward), str(backward)], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = [dict(item.rsplit(" ", 1) for item in line.split(": ", 1)[1].split(", "))
              for line in done.stdout.strip().splitlines()]
    assert "ld.b16" not in counts[0] and int(counts[0]["ld.v4"]) > 0
    assert "ld.b16" not in counts[1] and "st.b16" not in counts[1] and int(counts[1]["st.v4"]) > 0


def test_module_in_a_fresh_process():
    """Only when something imported triton before this module could set TRITON_INTERPRET."""
    rerun_with_interpreter(__file__)
