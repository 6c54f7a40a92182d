"""OpInfo conformance in CI: a fixed subset of torch's OpInfo database through the default plan.

Each op's first samples (float32, plus one float16 and one bfloat16 sample) are compiled with
``compile_with_plan`` and compared with eager PyTorch by ``benchmarks/opinfo_sweep.py``'s
:func:`sweep_op`, the code the full sweep runs (``.venv/bin/python benchmarks/opinfo_sweep.py``;
its table is ``benchmarks/results/opinfo-cpu.md``). No op may mismatch or crash, and each op here
must land in the class written next to it: its kernels are generated, or its graph is compiled
to ATen calls (extern), or it runs eagerly for a recorded reason.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from opinfo_sweep import SampleResult, classify, load_op_db, op_key, summarize, sweep_op  # noqa: E402

# op -> the class it must get. Chosen to cover pointwise chains, reductions and their rewrites
# (mean, var, logsumexp), normalizations (softmax, layer/RMS/batch/instance norm, with running
# statistics written back into inputs), views and layout ops, extern matmuls and convolutions,
# indexing, complex results, random ops, graph breaks, and ops that once crashed or mismatched in
# the full sweep (clamp's samples have tensor bounds, which stay an ATen call).
SUBSET = {
    "add": "generated", "mul": "generated", "sub": "generated", "div.no_rounding_mode": "generated",
    "neg": "generated", "abs": "generated", "exp": "generated", "log1p": "generated",
    "sigmoid": "generated", "tanh": "generated", "rsqrt": "generated", "pow": "generated",
    "nn.functional.relu": "generated", "nn.functional.gelu": "generated", "nn.functional.silu": "generated",
    "nn.functional.hardtanh": "generated", "clamp": "extern", "where": "generated", "maximum": "generated", "lt": "generated",
    "logical_and": "generated", "bitwise_and": "generated", "bitwise_xor": "generated",
    "bitwise_not": "generated", "sign": "generated", "sum": "generated", "mean": "generated",
    "amax": "generated", "argmax": "generated", "var": "generated", "logsumexp": "generated",
    "softmax": "generated", "log_softmax": "generated", "nn.functional.layer_norm": "generated",
    "nn.functional.rms_norm": "generated", "_native_batch_norm_legit": "generated",
    "nn.functional.instance_norm": "generated", "sum_to_size": "generated",
    "mm": "extern", "addmm": "extern", "bmm": "extern", "nn.functional.conv2d": "extern",
    "cat": "extern", "permute": "extern", "narrow": "extern", "index_select": "extern",
    "gather": "generated", "flip": "extern", "fft.ifft": "extern", "nn.functional.pad.circular": "extern",
    "view_as_real": "extern", "nn.functional.cross_entropy": "generated",
    "bernoulli": "generated",
    # data-dependent output shapes (capture.data_dependent), an effect token (linalg error checks),
    # and an op whose data-dependent tracing fails inside Dynamo (captured again with a break)
    "masked_select": "extern", "nonzero": "extern", "equal": "eager", "linalg.cholesky": "extern",
    "combinations": "extern",
}


@pytest.fixture(scope="module")
def op_db() -> dict:
    return {op_key(op): op for op in load_op_db()}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", sorted(SUBSET))
def test_op_matches_eager_in_its_class(op_db, name):
    result = sweep_op(op_db[name], max_samples=2, low_precision_samples=1)
    ran = [s for s in result.samples if s["status"] != "skipped"]
    assert ran, f"{name}: no sample ran: {result.samples}"
    assert result.status not in ("mismatch", "crash"), f"{name}: {result.status}: {result.reason}"
    assert result.status == SUBSET[name], f"{name}: expected {SUBSET[name]}, got {result.status}: {result.reason}"
    if result.status == "eager":    # Dynamo's recorded reason, not a pass failing under on_error: eager
        assert result.reason.startswith("graph break:"), result.reason


def test_every_subset_op_is_in_the_op_database(op_db):
    assert not set(SUBSET) - set(op_db)


def sample(status: str, detail: str = "") -> SampleResult:
    return SampleResult("float32", status, detail)


def test_the_worst_sample_decides_an_ops_class():
    assert classify([sample("generated"), sample("mismatch", "off by one")]) == ("mismatch", "float32: off by one")
    assert classify([sample("mismatch", "m"), sample("crash", "boom")]) == ("crash", "float32: boom")
    assert classify([sample("extern", "aten"), sample("generated", "1 kernel(s)")])[0] == "generated"
    assert classify([sample("eager", "graph break: x"), sample("extern", "aten")])[0] == "extern"
    assert classify([sample("skipped", "eager raised")])[0] == "excluded"
    fallback = sample("eager", "on_error: eager fallback: pass 'fuse' failed")
    assert classify([sample("generated", "1 kernel(s)"), fallback])[0] == "eager"


def test_summary_counts_clean_ops_against_those_in_scope():
    results = [{"status": s} for s in ["generated", "extern", "eager", "mismatch", "excluded"]]
    summary = summarize(results)
    assert summary["in_scope"] == 4 and summary["clean_percent_of_in_scope"] == 75.0
