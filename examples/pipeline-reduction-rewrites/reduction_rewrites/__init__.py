"""``fusable-reductions``: a third-party pattern-rewrite pass for plan-pipeline.

Hand-written models often compute a reduction through an operator the fuser treats as an opaque
extern call, which splits the kernel around it:

- ``x.max(dim, keepdim=True).values`` (``aten.max.dim``, used by hand-written stable softmax and
  log-sum-exp) returns values *and* indices, so it is not one tensor-valued reduction;
- ``x.norm(dim=-1, keepdim=True)`` (``aten.linalg_vector_norm``, used by RMS norm written as
  ``x / (x.norm(dim=-1, keepdim=True) * d ** -0.5 + eps)``) was not a reduction the fuser knew
  (since ``fuse`` 18 it reduces vector norms itself; the rule rewrites them the same way).

This pass rewrites them into the reductions the fuser does fuse with their pointwise prologue and
epilogue: ``amax``/``amin`` when only the values of ``max.dim``/``min.dim`` are used, and
``sqrt(sum(x * x))`` (accumulated in float32 for float16/bfloat16 inputs, as eager does) for the
2-norm. The plan ``fusable-reductions`` (``plans/fusable-reductions.yaml``) is the default plan with
this pass after ``decompose``.

Written only against the public API: ``pipeline`` and, in the tests, ``pipeline.testing``.
"""
from __future__ import annotations

import operator
from pathlib import Path
from typing import Callable, Literal

import attrs
import torch
import torch.fx

import pipeline

__version__ = "0.1.0"

aten = torch.ops.aten
prims = torch.ops.prims

PLANS_DIR = Path(__file__).parent / "plans"

RuleName = Literal["max-values", "min-values", "vector-norm"]
ALL_RULES: list[str] = ["max-values", "min-values", "vector-norm"]


@attrs.frozen
class FusableReductionsOptions:
    rules: list[RuleName] = pipeline.option(
        list(ALL_RULES),
        "Rewrites to apply. max-values / min-values: max.dim / min.dim whose indices are unused "
        "become amax / amin. vector-norm: linalg_vector_norm with ord 2 becomes sqrt(sum(x * x)).")


class FusableReductions(pipeline.Pass):
    """Rewrite reductions the fuser cannot fuse (max.dim/min.dim values, the 2-norm) into amax, amin
    and sqrt(sum(x * x)), which it fuses with their prologue and epilogue.

    Needs functional ATen (run it after ``functionalize``; after ``decompose`` it also sees what the
    decomposition table leaves). Each rewrite is recorded as a note in the compile record.
    """

    name = "fusable-reductions"
    Options = FusableReductionsOptions
    version = "1"
    requires = frozenset({"functional", "aten"})
    uses_fuel = True  # asks context.use_fuel() before each rewrite, so `pipeline bisect` can find one

    def run(self, graph: torch.fx.GraphModule, context: pipeline.PassContext) -> torch.fx.GraphModule:
        rules = [rule for rule in RULES if rule.name in self.options.rules]
        counts: dict[str, int] = {}
        for node in list(graph.graph.nodes):
            for rule in rules:
                if node.op != "call_function" or node.target is not rule.target or not rule.matches(node):
                    continue
                if not context.use_fuel(f"{node.name}: {rule.name}"):
                    continue
                rule.rewrite(graph.graph, node)
                counts[rule.name] = counts.get(rule.name, 0) + 1
        for name, count in sorted(counts.items()):
            context.note(f"{name}: rewrote {count} node(s)")
        graph.graph.lint()
        graph.recompile()
        return graph


def _value(node: object) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


# -- max-values / min-values ---------------------------------------------------------------------
def _values_only(node: torch.fx.Node) -> bool:
    """``max.dim``/``min.dim`` of a real tensor whose indices nothing reads."""
    source = _value(node.args[0])
    if node.kwargs or source is None or source.dtype.is_complex or source.dtype == torch.bool:
        return False
    users = list(node.users)
    if not all(user.op == "call_function" and user.target is operator.getitem for user in users):
        return False
    values = [user for user in users if user.args[1] == 0]
    return bool(values) and not any(user.users for user in users if user.args[1] != 0)


def _as_extremum(replacement):
    def rewrite(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
        """``max.dim(x, d, keepdim)[0]`` -> ``amax(x, [d], keepdim)`` (``min``/``amin`` alike)."""
        x, dim = node.args[0], node.args[1]
        keepdim = node.args[2] if len(node.args) > 2 else False
        users = list(node.users)
        with graph.inserting_before(node):
            reduced = graph.call_function(replacement, (x, [dim], keepdim))
        reduced.meta = dict(next(u for u in users if u.args[1] == 0).meta)
        for user in users:
            user.replace_all_uses_with(reduced)
            graph.erase_node(user)
        graph.erase_node(node)
    return rewrite


# -- vector-norm ---------------------------------------------------------------------------------
def _norm_args(node: torch.fx.Node) -> tuple:
    """(x, ord, dims, keepdim) of a ``linalg_vector_norm`` call, positional or keyword."""
    args, kwargs = list(node.args), node.kwargs
    names = ["self", "ord", "dim", "keepdim"]
    defaults = [None, 2, None, False]
    return tuple(args[i] if i < len(args) else kwargs.get(names[i], defaults[i]) for i in range(4))


def _is_two_norm(node: torch.fx.Node) -> bool:
    """A 2-norm of a real floating-point tensor of rank >= 1, without ``dtype=``."""
    x, order, _, _ = _norm_args(node)
    source = _value(x)
    if node.kwargs.get("dtype") is not None or source is None or _value(node) is None:
        return False
    return source.dtype.is_floating_point and source.dim() > 0 and not isinstance(order, bool) and order == 2


def _two_norm(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """``linalg_vector_norm(x, 2, dims, keepdim)`` -> ``sqrt(sum(x * x, dims, keepdim))``, with
    float16/bfloat16 accumulated in float32 and rounded once at the end, as eager does."""
    x, _, dims, keepdim = _norm_args(node)
    source = _value(x)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = list(range(source.dim()))
    elif isinstance(dims, int):
        dims = [dims]
    low_precision = source.dtype in (torch.float16, torch.bfloat16)
    new: list[torch.fx.Node] = []
    with graph.inserting_before(node):
        value = x
        if low_precision:
            value = graph.call_function(prims.convert_element_type.default, (x, torch.float32))
            new.append(value)
        square = graph.call_function(aten.mul.Tensor, (value, value))
        total = graph.call_function(aten.sum.dim_IntList, (square, list(dims), keepdim))
        out = graph.call_function(aten.sqrt.default, (total,))
        new += [square, total, out]
        if low_precision:
            out = graph.call_function(prims.convert_element_type.default, (out, source.dtype))
            new.append(out)
    _set_meta(new)
    node.replace_all_uses_with(out)
    graph.erase_node(node)


def _set_meta(nodes: list[torch.fx.Node]) -> None:
    """Fill ``meta["val"]`` of newly inserted nodes by running their targets on the fake values of
    their inputs (what passes after this one, like ``fuse``, read)."""
    for node in nodes:
        args = torch.fx.node.map_arg(node.args, lambda n: n.meta["val"])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: n.meta["val"])
        node.meta["val"] = node.target(*args, **kwargs)


@attrs.frozen
class Rule:
    """One rewrite: the ATen overload it looks at, when it applies, and what it does."""

    name: str
    target: object
    matches: Callable[[torch.fx.Node], bool]
    rewrite: Callable[[torch.fx.Graph, torch.fx.Node], None]


RULES = [
    Rule("max-values", aten.max.dim, _values_only, _as_extremum(aten.amax.default)),
    Rule("min-values", aten.min.dim, _values_only, _as_extremum(aten.amin.default)),
    Rule("vector-norm", aten.linalg_vector_norm.default, _is_two_norm, _two_norm),
]


@pipeline.hookimpl
def pipeline_register_passes() -> list[type]:
    return [FusableReductions]


@pipeline.hookimpl
def pipeline_register_plans() -> list[str]:
    return [str(PLANS_DIR)]


__all__ = ["FusableReductions", "FusableReductionsOptions", "ALL_RULES", "RULES", "Rule"]
