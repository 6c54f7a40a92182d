"""A deliberately broken plugin for plan-pipeline's test suite.

- ``div-to-mul`` rewrites ``aten.div.Tensor(x, c)`` with a number ``c`` into ``aten.mul.Tensor(x, c)``:
  wrong for every ``c`` except 1 and -1. It asks for fuel before each rewrite (``uses_fuel``), so
  ``pipeline bisect`` can name the first rewrite that changes a result.
- ``reject-div`` raises ``ValueError`` on any graph that divides (a pass that crashes on some graphs).
- the plan ``miscompile-div``: the default pipeline with ``div-to-mul`` after ``decompose``.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.fx

import pipeline
from pipeline import Pass, PassContext

aten = torch.ops.aten

PLANS_DIR = Path(__file__).parent / "plans"


def _divides_by_number(node: torch.fx.Node) -> bool:
    return (node.op == "call_function" and node.target is aten.div.Tensor and len(node.args) == 2
            and not node.kwargs and isinstance(node.args[1], (int, float))
            and not isinstance(node.args[1], bool))


class DivToMul(Pass):
    """Rewrite x / c into x * c (deliberately wrong: it should multiply by 1 / c)."""

    name = "div-to-mul"
    version = "1"
    requires = frozenset({"functional"})
    uses_fuel = True

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        rewritten = 0
        for node in list(graph.graph.nodes):
            if not _divides_by_number(node):
                continue
            if not context.use_fuel(f"{node.name}: {node.args[0]} / {node.args[1]!r} -> * {node.args[1]!r}"):
                break
            node.target = aten.mul.Tensor
            rewritten += 1
        if rewritten:
            context.note(f"div-to-mul: rewrote {rewritten} division(s)")
        graph.recompile()
        return graph


class RejectDiv(Pass):
    """Raise ValueError on any graph with a division (a pass that crashes on some inputs)."""

    name = "reject-div"
    version = "1"

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        for node in graph.graph.nodes:
            if node.op == "call_function" and node.target is aten.div.Tensor:
                raise ValueError(f"reject-div cannot handle {node.name}")
        return graph


@pipeline.hookimpl
def pipeline_register_passes() -> list[type]:
    return [DivToMul, RejectDiv]


@pipeline.hookimpl
def pipeline_register_plans() -> list[str]:
    return [str(PLANS_DIR)]
