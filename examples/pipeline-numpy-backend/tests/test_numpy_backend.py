"""Tests of ``numpy-backend`` written with the public testing helpers (``pipeline.testing``):
random graphs are fused by the registered ``fuse`` pass and their groups run through numpy."""
from __future__ import annotations

import pytest
import torch
import torch.fx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeline
import passes.kernel_ir.groups
from pipeline.testing import FLOAT_DTYPES, assert_preserves_semantics, graphs, prelude_for, run_passes
from numpy_backend import RULES, NumpyBackend, NumpyBackendOptions, NumpyKernel

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = FLOAT_DTYPES + (torch.int32,)

options = st.builds(NumpyBackendOptions, compute_dtype=st.sampled_from(["float64", "float32"]))


def before_fuse(gm: torch.fx.GraphModule, inputs: list) -> torch.fx.GraphModule:
    """``gm`` after the default plan's passes up to ``fuse``: softmax, log_softmax and layer norm
    are decomposed there, so fused groups hold the amax/sum reductions they become."""
    registry = pipeline.get_registry()
    specs = pipeline.load_plan("default").passes[1:]
    names = [spec.name for spec in specs]
    passes = [registry.passes[spec.name].cls(spec.options) for spec in specs[:names.index("fuse")]]
    return run_passes(passes, gm, inputs)


def fused_and_backend(case, opts: NumpyBackendOptions) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """The graph as ``numpy-backend`` receives it (after the passes it requires) and leaves it."""
    inputs = case.make_inputs(0)
    tags: set = {"captured"}
    fused = run_passes(prelude_for(NumpyBackend), case.gm, inputs, tags=tags)
    return fused, run_passes([NumpyBackend(opts)], fused, inputs, tags=tags)


def targets(gm: torch.fx.GraphModule, kind: type) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, kind)]


def test_every_op_the_fuser_can_group_has_a_numpy_rule():
    fusable = (passes.kernel_ir.groups.POINTWISE | passes.kernel_ir.groups.REDUCTIONS | passes.kernel_ir.groups.UNIT_RESHAPES
               | passes.kernel_ir.groups.SOURCES)
    assert sorted(fusable - set(RULES)) == []


@SETTINGS
@given(graphs(max_ops=8, dtypes=DTYPES, input_mutation=True), options)
def test_numpy_kernels_compute_what_the_fused_groups_compute(case, opts):
    inputs = case.make_inputs(0)
    assert_preserves_semantics(NumpyBackend(opts), before_fuse(case.gm, inputs), inputs)


@SETTINGS
@given(graphs(max_ops=8, dtypes=DTYPES), st.sets(st.sampled_from(["pointwise", "reduction"])))
def test_exactly_the_groups_of_the_chosen_kinds_become_numpy_kernels(case, kinds):
    fused, after = fused_and_backend(case, NumpyBackendOptions(kinds=sorted(kinds)))
    groups = targets(fused, passes.kernel_ir.groups.FusedGroup)
    assert [k.group for k in targets(after, NumpyKernel)] == [g for g in groups if g.kind in kinds]
    assert targets(after, passes.kernel_ir.groups.FusedGroup) == [g for g in groups if g.kind not in kinds]


def test_generated_source_is_one_numpy_line_per_op():
    def layer_norm_gelu(x, w, b):
        return torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (16,), w, b))

    inputs = [torch.randn(4, 16), torch.randn(16), torch.randn(16)]
    case_gm = torch.fx.symbolic_trace(layer_norm_gelu)
    tags: set = {"captured"}
    fused = run_passes(prelude_for(NumpyBackend), case_gm, inputs, tags=tags)
    after = run_passes([NumpyBackend()], fused, inputs, tags=tags)
    (kernel,) = targets(after, NumpyKernel)
    ops = [n for n in kernel.group.subgraph.graph.nodes if n.op == "call_function"]
    body = [line for line in kernel.source.splitlines() if line.startswith("    v")]
    assert len(body) == len(ops)
    assert all(" = cast(" in line for line in body)
    torch.testing.assert_close(after(*inputs), layer_norm_gelu(*inputs))


class Block(torch.nn.Module):
    """Linear, then a residual softmax and a layer norm: one extern matmul and fused groups."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(32, 32)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        return self.norm(torch.softmax(h, dim=-1) + x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_numpy_reference_plan_runs_and_verifies_a_model(dtype):
    model = Block().to(dtype)
    x = torch.randn(8, 32, dtype=dtype)
    compiled = pipeline.compile_with_plan(model, "numpy-reference")
    with torch.no_grad():
        assert pipeline.testing.compare(model(x), compiled(x)) is None
    record = pipeline.compilation_of(compiled).graphs[0]
    assert record.verified.startswith("passed")
    assert record.kernels >= 1
    assert any(n["pass"] == "numpy-backend" and n["message"].startswith(f"{record.kernels} numpy kernel(s)")
               for n in record.notes)


def test_an_expanded_output_is_written_once_per_broadcast_line():
    """A group whose output is an ``expand`` (stride 0): the kernel writes the one element each
    broadcast line holds, as the layout eager gives it has room for no more."""
    def scaled_and_expanded(x):
        return (torch.mul(x, -1.5).expand(3),)

    inputs = [torch.randn(1)]
    assert_preserves_semantics(NumpyBackend(NumpyBackendOptions()),
                               before_fuse(torch.fx.symbolic_trace(scaled_and_expanded), inputs), inputs)
