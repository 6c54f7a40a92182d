"""Graphs with symbolic sizes in the compile cache and in portable artifacts.

What is stored is each symbolic group with its size-class kernels (their facts and layouts as
expressions of the size arguments) and the codegen settings; a graph rebuilt from the entry calls
those kernels at every size of their classes without generating anything, and generates a new
class, in the shapes of the compile it was rebuilt in, for a size outside them."""
from __future__ import annotations

import pytest
import torch

import pipeline
from pipeline import compilation_of, compile_with_plan
from pipeline.numerics import compare
from test_dynamic_kernels import Block, dynamic_graph, padding_mask

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.fixture(autouse=True)
def _cache_graphs(monkeypatch):
    monkeypatch.delenv("PIPELINE_CACHE_GRAPHS", raising=False)


def run(model, plan, lengths, seed=0):
    compiled = compile_with_plan(model, plan)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for s in lengths:
            x, mask = torch.randn(2, s, 32, generator=generator), padding_mask(2, s, generator)
            problem = compare(model(x, mask), compiled(x, mask), what=f"length {s}")
            assert problem is None, problem
    return compiled


def test_a_dynamic_graph_is_stored_and_its_kernels_serve_every_size_of_their_classes(tmp_path):
    model, plan = Block().eval(), {"extends": "default", "cache": {"dir": str(tmp_path)}}
    cold = dynamic_graph(run(model, plan, [8, 12, 20]))
    assert cold.cache["status"] == "miss" and cold.cache["stored"], cold.cache
    torch._dynamo.reset()
    warm = dynamic_graph(run(model, plan, [8, 12, 20, 33, 57]))
    assert warm.cache["status"] == "hit" and warm.passes == []
    seen = warm.metrics["size_specializations"]
    assert seen["builds"] == 0 and seen["classes"] == cold.metrics["size_specializations"]["classes"] > 0
    assert warm.kernels == cold.kernels


def test_a_size_outside_the_stored_classes_generates_a_new_class_after_a_cache_hit(tmp_path):
    """2 x 4096 x 32 elements cross the C++ kernels' parallel threshold: a new class, generated from
    the rebuilt groups' placeholders described in the entry."""
    model, plan = Block().eval(), {"extends": "default", "cache": {"dir": str(tmp_path)}}
    run(model, plan, [8, 12])
    torch._dynamo.reset()
    warm = dynamic_graph(run(model, plan, [8, 12, 4096, 16]))
    seen = warm.metrics["size_specializations"]
    assert warm.cache["status"] == "hit" and seen["builds"] == 1 and seen["kernels"] > 0
    assert not [n for n in warm.notes if "runs eagerly" in n["message"]], warm.notes


def test_a_dynamic_graph_travels_in_portable_artifacts(tmp_path):
    model = Block().eval()
    first = run(model, {"extends": "default", "cache": {"dir": str(tmp_path / "cache")}}, [8, 12])
    pipeline.save_artifacts(first, tmp_path / "bundle")
    assert pipeline.load_artifacts(tmp_path / "bundle", cache_dir=tmp_path / "replica")["entries"] == 2
    torch._dynamo.reset()
    replica = dynamic_graph(run(model, {"extends": "default", "cache": {"dir": str(tmp_path / "replica")}}, [8, 12, 24]))
    assert replica.cache["status"] == "hit" and replica.metrics["size_specializations"]["builds"] == 0


def test_per_size_cuda_graph_runners_of_a_dynamic_graph_are_stored(tmp_path, monkeypatch):
    """A reduce-overhead-style plan on a graph with symbolic sizes: the per-size runners' graph and
    policy are stored (on CPU the runner runs its graph instead of recording it; the recording
    itself is tested on the GPU)."""
    import passes.cudagraphs as cudagraphs
    monkeypatch.setattr(cudagraphs, "static_skip_reason", lambda graph, context, roles: None)
    monkeypatch.setattr(cudagraphs.CudaGraphRunner, "_record", lambda self, args: self.graph(*args))
    model = Block().eval()
    plan = {"extends": "reduce-overhead", "target": "cpu", "cache": {"dir": str(tmp_path)},
            "options": {"capture": {"dynamic": None}}}
    cold = dynamic_graph(run(model, plan, [8, 12, 20]))
    assert cold.cache["stored"] and "cudagraph_replay_per_size" in cold.final_code, cold.cache
    torch._dynamo.reset()
    warm = dynamic_graph(run(model, plan, [8, 12, 20, 28]))
    assert warm.cache["status"] == "hit" and "cudagraph_replay_per_size" in warm.final_code
    assert warm.metrics["size_specializations"]["builds"] == 0
