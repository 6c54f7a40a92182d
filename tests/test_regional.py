"""Regional compilation (``capture: {regions: [...]}``): a block class repeated N times is compiled
once, reused by every instance, and the model still computes what eager computes."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from pipeline import PipelineError, compilation_of, compile_with_plan

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from workloads import Block  # noqa: E402


class Stack(torch.nn.Module):
    """N identical transformer blocks between an input projection and a head (run eagerly)."""

    def __init__(self, blocks: int = 4, d: int = 64):
        super().__init__()
        self.embed = torch.nn.Linear(16, d)
        self.blocks = torch.nn.ModuleList([Block(d, heads=4) for _ in range(blocks)])
        self.head = torch.nn.Linear(d, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@pytest.fixture(autouse=True)
def no_graph_cache(monkeypatch):
    monkeypatch.setenv("PIPELINE_CACHE_GRAPHS", "0")   # count real compiles


def compiled_stack(regions: list[str], blocks: int = 4):
    torch.manual_seed(0)
    model = Stack(blocks).eval()
    return model, compile_with_plan(model, "default", options={"capture": {"regions": regions}})


@pytest.mark.parametrize("name", ["Block", "workloads.Block"])
def test_n_identical_blocks_compile_the_block_graph_once_and_match_eager(name):
    model, compiled = compiled_stack([name], blocks=4)
    x = torch.randn(2, 16, 16)
    with torch.no_grad():
        out = compiled(x)
        again = compiled(x)
        expected = model(x)
    records = compilation_of(compiled).graphs
    assert len(records) == 1
    assert records[0].kernels > 0
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(again, expected, rtol=1e-4, atol=1e-5)


def test_without_regions_the_whole_model_is_one_graph_n_blocks_long():
    _, whole = compiled_stack([], blocks=4)
    _, regional = compiled_stack(["Block"], blocks=4)
    x = torch.randn(2, 16, 16)
    with torch.no_grad():
        whole(x)
        regional(x)
    whole_nodes = compilation_of(whole).graphs[0].nodes_in
    block_nodes = compilation_of(regional).graphs[0].nodes_in
    assert whole_nodes > 3 * block_nodes


def test_blocks_run_eagerly_again_outside_the_compiled_model():
    model, compiled = compiled_stack(["Block"], blocks=2)
    with torch.no_grad():
        compiled(torch.randn(2, 16, 16))
    assert all(block._compiled_call_impl is None for block in model.blocks)


def test_a_new_input_shape_recompiles_the_block_for_all_instances_not_per_instance():
    model, compiled = compiled_stack(["Block"], blocks=6)
    x = torch.randn(2, 8, 16)
    with torch.no_grad():
        compiled(torch.randn(2, 16, 16))
        out = compiled(x)
        expected = model(x)
    compilation = compilation_of(compiled)
    # Dynamo generalizes the changed size to a symbolic one; the blocks share those variants (one
    # for the first block, whose input comes from eager code, one for the blocks fed by a block).
    assert len(compilation.graphs) <= 3
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


def test_a_class_the_model_does_not_have_is_an_error_naming_its_classes():
    with pytest.raises(PipelineError, match=r"capture.regions names 'Blok'.*did you mean 'Block'.*Linear"):
        compiled_stack(["Blok"], blocks=2)


def test_regions_with_the_export_frontend_are_refused():
    with pytest.raises(PipelineError, match="frontend: dynamo only"):
        compile_with_plan(Stack(2).eval(), "default",
                          options={"capture": {"regions": ["Block"], "frontend": "export"}})


@torch._dynamo.disable
def _untraceable_hook_work(calls: list) -> None:
    calls.append(1)   # stands for FSDP2's all-gather: Dynamo does not trace it


def test_region_hooks_eager_runs_the_hooks_outside_and_compiles_only_the_forward():
    """A block whose forward pre-hook Dynamo cannot trace (as FSDP2's, docs/distributed.md): with
    ``region_hooks: compiled`` the traced call breaks at the hook; with ``eager`` the hook runs in
    ``nn.Module.__call__`` and each block's forward is one graph shared by every instance, and the
    blocks leave the compiled model with their own ``forward`` back."""
    results = {}
    for mode in ("compiled", "eager"):
        torch.manual_seed(0)
        model = Stack(blocks=3).eval()
        calls: list = []
        for block in model.blocks:
            block.register_forward_pre_hook(lambda module, args: _untraceable_hook_work(calls))
        compiled = compile_with_plan(model, "default",
                                     options={"capture": {"regions": ["Block"], "region_hooks": mode}})
        x = torch.randn(2, 16, 16)
        with torch.no_grad():
            out, expected = compiled(x), model(x)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
        assert len(calls) == 6, "the hook ran once per block per call, compiled or not"
        assert all("forward" not in vars(block) for block in model.blocks)
        results[mode] = compilation_of(compiled).summary()
    assert results["eager"]["graph_breaks"] == []
    assert results["eager"]["graph_count"] == 1
    assert results["compiled"]["graph_breaks"], "a traced hook that Dynamo skips breaks the graph"
