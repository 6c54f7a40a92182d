"""A sample third-party plugin for plan-pipeline.

It is what a plugin author writes: a module declared in the ``pipeline.plugins`` entry-point group
(see ``pyproject.toml``) whose ``@pipeline.hookimpl`` functions register passes and plans.

- ``strength-reduce`` rewrites ops into cheaper ones that compute bit-identical results:
  ``aten.pow.Tensor_Scalar(x, 2)`` becomes ``aten.mul.Tensor(x, x)`` and ``aten.mul.Tensor(x, 2)``
  becomes ``aten.add.Tensor(x, x)``. Division is deliberately left alone: ``x / c`` and
  ``x * (1 / c)`` round differently for most ``c``.
- ``always-fails`` raises in ``run`` (the test suite uses it to check that errors name the plugin).
- the plan ``sample-strength`` (``plans/sample-strength.yaml``): the default plan with
  ``strength-reduce`` after ``functionalize``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import attrs
import torch
import torch.fx

import pipeline
from pipeline import Pass, PassContext, option

aten = torch.ops.aten

PLANS_DIR = Path(__file__).parent / "plans"

Rewrite = Literal["pow", "mul"]


@attrs.frozen
class StrengthReduceOptions:
    enabled_ops: list[Rewrite] = option(
        ["pow", "mul"], "Rewrites to apply: pow (pow(x, 2) -> x * x), mul (x * 2 -> x + x).")


def _is_two(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value == 2


def _keeps_dtype(node: torch.fx.Node, scalar: object) -> bool:
    """True when replacing ``op(x, scalar)`` by ``op2(x, x)`` cannot change the result's dtype:
    ``x`` is a real floating-point tensor, or an integer (not bool) tensor and the scalar is an
    integer (a float scalar promotes an integer ``x`` to floating point; bool promotes to int64)."""
    x = node.args[0]
    value = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor):
        return False
    if value.dtype.is_floating_point:
        return True
    integer = not value.dtype.is_complex and value.dtype != torch.bool
    return integer and isinstance(scalar, int)


class StrengthReduce(Pass):
    """Replace ops with cheaper ones that give bit-identical results (pow(x, 2) -> x * x, x * 2 -> x + x)."""

    name = "strength-reduce"
    Options = StrengthReduceOptions
    version = "1"
    requires = frozenset({"functional"})

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        rules = {}
        if "pow" in self.options.enabled_ops:
            rules[aten.pow.Tensor_Scalar] = ("pow", aten.mul.Tensor)
        if "mul" in self.options.enabled_ops:
            rules[aten.mul.Scalar] = ("mul", aten.add.Tensor)
            rules[aten.mul.Tensor] = ("mul", aten.add.Tensor)
        counts: dict[str, int] = {}
        for node in list(graph.graph.nodes):
            if node.op != "call_function" or node.target not in rules or node.kwargs or len(node.args) != 2:
                continue
            x, scalar = node.args
            if not isinstance(x, torch.fx.Node) or not _is_two(scalar) or not _keeps_dtype(node, scalar):
                continue
            rule, replacement = rules[node.target]
            with graph.graph.inserting_before(node):
                new = graph.graph.call_function(replacement, (x, x))
            new.meta = dict(node.meta)
            node.replace_all_uses_with(new)
            graph.graph.erase_node(node)
            counts[rule] = counts.get(rule, 0) + 1
        for rule, count in sorted(counts.items()):
            context.note(f"strength-reduce: rewrote {count} {rule} node(s)")
        graph.graph.lint()
        graph.recompile()
        return graph


class AlwaysFails(Pass):
    """A pass that always raises (to check that failures name the pass and its plugin)."""

    name = "always-fails"
    version = "1"

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        raise RuntimeError("boom")


@pipeline.hookimpl
def pipeline_register_passes() -> list[type]:
    return [StrengthReduce, AlwaysFails]


@pipeline.hookimpl
def pipeline_register_plans() -> list[str]:
    return [str(PLANS_DIR)]
