"""``dce``: remove nodes whose results nothing uses (never mutations, assertions or outputs), and
drop operands an operator ignores in the form it is called with (:data:`IGNORED_OPERANDS`), so the
values behind them are not kept alive for it (a forward then saves fewer tensors for the backward)."""
from __future__ import annotations

from typing import Callable

import torch

from pipeline import NoOptions, Pass, PassContext
from pipeline.ir import finish, has_side_effects

aten = torch.ops.aten

#: operator -> (when its call ignores operands, the names of those optional operands). A
#: training batch norm's backward reads the batch statistics saved by its forward, never the
#: running statistics (ATen reads those only with ``train=False``).
IGNORED_OPERANDS: dict = {
    aten.native_batch_norm_backward.default: (lambda arg: arg("train") is True, ("running_mean", "running_var")),
}


class DeadCodeElimination(Pass):
    """Pass None for operands an operator ignores, then delete unused pure nodes, last to first, so
    whole dead chains go in one sweep."""

    name = "dce"
    Options = NoOptions
    version = "2"

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        dropped = _drop_ignored_operands(graph.graph)
        if dropped:
            context.note(f"{dropped} operand(s) the operator ignores passed as None")
        removed = 0
        for node in reversed(list(graph.graph.nodes)):
            if node.users or has_side_effects(node):
                continue
            graph.graph.erase_node(node)
            removed += 1
        if removed:
            context.note(f"removed {removed} unused node(s)")
        return finish(graph)


def _drop_ignored_operands(graph: torch.fx.Graph) -> int:
    dropped = 0
    for node in graph.nodes:
        rule: tuple[Callable, tuple] | None = IGNORED_OPERANDS.get(node.target) if node.op == "call_function" else None
        if rule is None:
            continue
        names = [a.name for a in node.target._schema.arguments]
        args, kwargs = list(node.args), dict(node.kwargs)

        def arg(name: str):
            i = names.index(name)
            return args[i] if i < len(args) else kwargs.get(name)

        if not rule[0](arg):
            continue
        for name in rule[1]:
            if arg(name) is None:
                continue
            i = names.index(name)
            if i < len(args):
                args[i] = None
            else:
                kwargs[name] = None
            dropped += 1
        node.args, node.kwargs = tuple(args), kwargs
    return dropped
