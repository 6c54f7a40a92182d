"""Tests of ``fusable-reductions`` written with the public testing helpers (``pipeline.testing``).

Random graphs come from ``pipeline.testing.graphs``; each test plants the patterns this pass
rewrites (``max``/``min`` over one dimension, ``vector_norm``) on one of the graph's outputs, with
and without a pointwise epilogue, including variants the pass must leave alone (indices that are
used, norms other than the 2-norm).
"""
from __future__ import annotations

import math
import operator

import pytest
import torch
import torch.fx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeline
from pipeline.testing import GraphCase, assert_preserves_semantics, graphs, prelude_for, run_passes
from reduction_rewrites import ALL_RULES, FusableReductions, FusableReductionsOptions

aten = torch.ops.aten
SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def graphs_with_reductions(draw) -> GraphCase:
    """A random graph from ``pipeline.testing.graphs`` with max/min/vector_norm planted on a
    floating-point output of rank >= 1."""
    case = draw(graphs(max_ops=5, dtypes=(torch.float32, torch.float16, torch.bfloat16)))
    gm, graph = case.gm, case.gm.graph
    values = gm(*case.make_inputs(0))
    output = next(n for n in graph.nodes if n.op == "output")
    results = list(output.args[0])
    candidates = [i for i, v in enumerate(values) if v.dtype.is_floating_point and v.dim() >= 1]
    if not candidates:
        return case
    index = draw(st.sampled_from(candidates))
    source, rank = results[index], values[index].dim()
    planted = []
    with graph.inserting_before(output):
        for _ in range(draw(st.integers(1, 3))):
            dim = draw(st.integers(-rank, rank - 1))
            keepdim = draw(st.booleans())
            kind = draw(st.sampled_from(["max", "min", "max-with-indices", "norm"]))
            if kind == "norm":
                order = draw(st.sampled_from([2, 2.0, 1, math.inf]))
                value = graph.call_function(torch.linalg.vector_norm, (source, order, [dim], keepdim))
            else:
                pair = graph.call_function(torch.min if kind == "min" else torch.max, (source, dim, keepdim))
                value = graph.call_function(operator.getitem, (pair, 0))
                if kind == "max-with-indices":
                    indices = graph.call_function(operator.getitem, (pair, 1))
                    planted.append(indices)
            if keepdim and draw(st.booleans()):  # a pointwise epilogue reading the reduced value
                value = graph.call_function(torch.sub, (source, value))
            planted.append(value)
    output.args = (tuple(results + planted),)
    gm.recompile()
    return case


def rewritable(node: torch.fx.Node) -> bool:
    """What the pass promises to rewrite, stated independently of its code."""
    if node.op != "call_function":
        return False
    if node.target in (aten.max.dim, aten.min.dim):
        return all(u.args[1] == 0 or not u.users for u in node.users)
    if node.target is aten.linalg_vector_norm.default:
        return node.args[1] == 2 and node.args[0].meta["val"].dtype.is_floating_point
    return False


RULE_TARGETS = {"max-values": aten.max.dim, "min-values": aten.min.dim,
                "vector-norm": aten.linalg_vector_norm.default}


def count(gm: torch.fx.GraphModule, target) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is target)


def after_pass(case: GraphCase, options: FusableReductionsOptions | None = None
               ) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """The graph as the pass receives it (after the passes it requires) and as it leaves it."""
    inputs = case.make_inputs(0)
    tags: set = {"captured"}
    before = run_passes(prelude_for(FusableReductions), case.gm, inputs, tags=tags)
    return before, run_passes([FusableReductions(options)], before, inputs, tags=tags)


@SETTINGS
@given(graphs_with_reductions())
def test_rewrite_preserves_semantics(case):
    assert_preserves_semantics(FusableReductions, case)


@SETTINGS
@given(graphs_with_reductions(), st.sets(st.sampled_from(ALL_RULES)))
def test_the_enabled_rules_rewrite_every_match_and_the_others_none(case, rules):
    before, after = after_pass(case, FusableReductionsOptions(rules=sorted(rules)))
    for rule, target in RULE_TARGETS.items():
        if rule in rules:
            left = [n.name for n in after.graph.nodes if n.target is target and rewritable(n)]
            assert not left, f"rule {rule} is on but left {left}\n{after.code}"
        else:
            assert count(after, target) == count(before, target), f"rule {rule} is off but changed {target}"


def test_used_indices_keep_max_dim():
    def argmax_and_max(x):
        values, indices = x.max(dim=-1)
        return values * 2, indices

    gm = torch.fx.symbolic_trace(argmax_and_max)
    _, after = after_pass(GraphCase(gm=gm, inputs=[pipeline.testing.TensorSpec((4, 8), torch.float32)]))
    assert any(n.target is aten.max.dim for n in after.graph.nodes if n.op == "call_function")


class RMSNorm(torch.nn.Module):
    """RMS norm written with the 2-norm, after a residual add (the pre-norm transformer block)."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = x + residual
        rms = h.norm(dim=-1, keepdim=True) * h.shape[-1] ** -0.5
        return h / (rms + 1e-6) * self.weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plan_fuses_norm_based_rms_norm_into_one_kernel(dtype):
    model = RMSNorm(64).to(dtype)
    x, residual = torch.randn(4, 64, dtype=dtype), torch.randn(4, 64, dtype=dtype)
    compiled = pipeline.compile_with_plan(model, "fusable-reductions")
    with torch.no_grad():
        assert pipeline.testing.compare(model(x, residual), compiled(x, residual)) is None
    record = pipeline.compilation_of(compiled).graphs[0]
    assert [n["message"] for n in record.notes if n["pass"] == "fusable-reductions"] == [
        "vector-norm: rewrote 1 node(s)"]
    assert record.kernels == 1
    assert "linalg_vector_norm" not in record.final_code
