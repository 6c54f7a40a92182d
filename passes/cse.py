"""``cse``: merge nodes that compute the same pure function of the same arguments."""
from __future__ import annotations

import attrs
import torch

from pipeline import Pass, PassContext, option
from pipeline import compat
from pipeline.ir import finish, has_side_effects, is_random, node_args_hashable


@attrs.frozen
class CseOptions:
    exclude: list[str] = option([], "Operators never merged (by aten name, e.g. aten.clone).")


class CommonSubexpressionElimination(Pass):
    """Replace a repeated pure computation by the first one. Runs on functional graphs, where a
    value can never change after it is computed."""

    name = "cse"
    Options = CseOptions
    version = "1"
    requires = frozenset({"functional"})
    uses_fuel = True

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        excluded = set(self.options.exclude)
        seen: dict = {}
        merged = 0
        for node in list(graph.graph.nodes):
            if node.op not in ("call_function", "get_attr") or has_side_effects(node) or is_random(node):
                if node.op == "call_function" and compat.is_mutating(node.target):
                    seen.clear()
                continue
            if node.op == "call_function" and compat.op_name(node.target) in excluded:
                continue
            try:
                key = (node.op, node.target, node_args_hashable(node.args), node_args_hashable(node.kwargs))
                hash(key)
            except TypeError:
                continue
            first = seen.get(key)
            if first is None:
                seen[key] = node
                continue
            if not context.use_fuel(f"merge {node.name} into {first.name}"):
                continue
            node.replace_all_uses_with(first)
            graph.graph.erase_node(node)
            merged += 1
        if merged:
            context.note(f"merged {merged} duplicate node(s)")
        return finish(graph)
