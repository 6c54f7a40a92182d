"""``constant-fold``: compute, at compile time, values that depend on no graph input.

A node folds when it is a pure, deterministic call whose every input is a constant (a tensor
attribute of the graph, or another foldable node) and its result is a tensor no larger than
``max_bytes``. Lone factory calls (``full``, ``arange`` with no tensor input) are left in place:
a fused kernel can make them for free, while a folded copy costs memory traffic."""
from __future__ import annotations

import attrs
import torch
import torch.fx
import torch.utils._pytree as pytree

from pipeline import Pass, PassContext, non_negative, option
from pipeline import compat
from pipeline.ir import finish, has_side_effects, is_random


@attrs.frozen
class ConstantFoldOptions:
    max_bytes: int = option(1 << 20, "Largest folded result kept as a graph constant, in bytes.",
                            check=non_negative)


def _is_symbolic(value) -> bool:
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


class ConstantFold(Pass):
    """Evaluate input-independent subgraphs once and store their results as graph constants."""

    name = "constant-fold"
    Options = ConstantFoldOptions
    version = "1"

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        values: dict[torch.fx.Node, object] = {}
        has_node_input: dict[torch.fx.Node, bool] = {}
        with compat.real_tensors(), torch.no_grad():
            for node in graph.graph.nodes:
                if node.op == "get_attr":
                    value = _attr(graph, node.target)
                    if isinstance(value, torch.Tensor) and not compat.is_fake(value):
                        values[node] = value
                        has_node_input[node] = True
                    continue
                if node.op != "call_function" or has_side_effects(node) or is_random(node):
                    continue
                inputs = [a for a in pytree.tree_leaves((node.args, node.kwargs))
                          if isinstance(a, torch.fx.Node)]
                if any(a not in values for a in inputs):
                    continue
                if any(_is_symbolic(a) for a in pytree.tree_leaves((node.args, node.kwargs))):
                    continue
                args, kwargs = pytree.tree_map_only(torch.fx.Node, values.__getitem__, (node.args, node.kwargs))
                try:
                    result = node.target(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - not foldable; the graph keeps the node
                    context.note(f"not folded {node.name}: {type(exc).__name__}: {exc}")
                    continue
                if not isinstance(result, torch.Tensor) or compat.is_fake(result):
                    continue
                values[node] = result
                has_node_input[node] = bool(inputs)
        folded = 0
        for node, value in values.items():
            if node.op == "get_attr" or not has_node_input.get(node):
                continue
            if all(user in values for user in node.users):
                continue
            if value.numel() * value.element_size() > self.options.max_bytes:
                context.note(f"not folded {node.name}: {value.numel() * value.element_size()} bytes "
                             f"> max_bytes {self.options.max_bytes}")
                continue
            attr = f"_folded_{folded}_{node.name}"
            graph.register_buffer(attr, value.contiguous() if not value.is_contiguous() else value)
            with graph.graph.inserting_before(node):
                new = graph.graph.get_attr(attr)
            new.meta = dict(node.meta)
            node.replace_all_uses_with(new)
            folded += 1
        if folded:
            context.note(f"folded {folded} constant subexpression(s)")
            for node in reversed(list(graph.graph.nodes)):
                if not node.users and not has_side_effects(node) and node in values:
                    graph.graph.erase_node(node)
        return finish(graph)


def _attr(gm: torch.nn.Module, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj
