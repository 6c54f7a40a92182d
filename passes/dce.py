"""``dce``: remove nodes whose results nothing uses (never mutations, assertions or outputs)."""
from __future__ import annotations

import torch

from pipeline import NoOptions, Pass, PassContext
from pipeline.ir import finish, has_side_effects


class DeadCodeElimination(Pass):
    """Delete unused pure nodes, last to first, so whole dead chains go in one sweep."""

    name = "dce"
    Options = NoOptions
    version = "1"

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        removed = 0
        for node in reversed(list(graph.graph.nodes)):
            if node.users or has_side_effects(node):
                continue
            graph.graph.erase_node(node)
            removed += 1
        if removed:
            context.note(f"removed {removed} unused node(s)")
        return finish(graph)
