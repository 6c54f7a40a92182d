"""Generated kernels for graphs with symbolic sizes on the Triton backend, under the Triton
interpreter (``TRITON_INTERPRET=1``, set at collection as in test_triton_backend.py)."""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from pipeline import compilation_of  # noqa: E402
from conftest import rerun_with_interpreter, triton_interpreter_ready  # noqa: E402
from test_dynamic_kernels import MLP, Block, check_sizes, dynamic_graph, padding_mask  # noqa: E402

HAS_TRITON = importlib.util.find_spec("triton") is not None
pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install -e '.[gpu]')")
PLAN = {"extends": "cpu-inference", "options": {"codegen": {"backend": "triton"}}}


@pytest.fixture(autouse=True)
def _interpreter(request):
    torch._dynamo.reset()
    if request.node.name != "test_module_in_a_fresh_process" and not triton_interpreter_ready(request):
        pytest.skip("the Triton interpreter is not usable in this process")
    yield
    torch._dynamo.reset()


def test_mlp_batch_sizes_run_one_triton_kernel_per_group_for_every_size():
    compiled = check_sizes(MLP().eval(), lambda n, g: (torch.randn(n, 32, generator=g),), [2, 3, 7, 3, 100], PLAN)
    assert len(compilation_of(compiled).graphs) == 2
    record = dynamic_graph(compiled)
    backends = {k["backend"] for k in record.metrics["contents"]["kernels"]}
    assert backends == {"triton"} and record.metrics["kernels"] >= 2
    seen = record.metrics["size_specializations"]
    assert len(seen["sizes"]) == 3 and seen["builds"] == 1 and seen["kernels"] == seen["groups"]


def test_block_with_padding_mask_over_sequence_lengths_on_triton():
    compiled = check_sizes(Block().eval(), lambda s, g: (torch.randn(2, s, 32, generator=g), padding_mask(2, s, g)),
                           [8, 12, 20, 33], PLAN)
    record = dynamic_graph(compiled)
    assert record.metrics["kernels"] >= 3
    seen = record.metrics["size_specializations"]
    assert len(seen["sizes"]) == 3 and seen["builds"] == 1


def test_size_class_kernels_take_their_sizes_as_arguments_and_compile_for_sm90():
    """The generated module of a size-class kernel names its size arguments and its grid as a
    function of them, and Triton compiles it for the H200 (sm_90)."""
    from passes.codegen.triton.runtime import compile_all_for_sm90
    compiled = check_sizes(Block().eval(), lambda s, g: (torch.randn(2, s, 32, generator=g), padding_mask(2, s, g)),
                           [8, 12], PLAN)
    kernels = dynamic_graph(compiled).metrics["contents"]["kernels"]
    sources = [k["source"] for k in kernels]
    assert all("SIZES = ('ks" in s and "GRID = lambda ks" in s for s in sources), sources
    results = compile_all_for_sm90(sources)
    assert all(r["cubin_bytes"] > 0 for r in results)


def test_size_class_triton_kernels_are_stored_in_the_compile_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPELINE_CACHE_GRAPHS", raising=False)
    plan = {**PLAN, "cache": {"dir": str(tmp_path)}}
    inputs = lambda s, g: (torch.randn(2, s, 32, generator=g), padding_mask(2, s, g))     # noqa: E731
    cold = dynamic_graph(check_sizes(Block().eval(), inputs, [8, 12, 20], plan))
    torch._dynamo.reset()
    warm = dynamic_graph(check_sizes(Block().eval(), inputs, [8, 12, 20, 33], plan))
    assert cold.cache["stored"] and warm.cache["status"] == "hit"
    assert warm.metrics["size_specializations"]["builds"] == 0 and warm.kernels == cold.kernels


def test_module_in_a_fresh_process():
    """Only when something imported triton before this module could set TRITON_INTERPRET (the
    interpreter needs it at import time): run this file again in a new process."""
    rerun_with_interpreter(__file__)
