"""``functionalize``: trace the captured graph to functional ATen with torch's functionalization.

In-place ops become out-of-place ones; writes into graph inputs (a buffer updated in place) stay
as one ``copy_`` into that input at the end of the graph, so the caller still sees the update.

Functionalization sees the operators a graph calls, not the ones a C++ composite kernel calls
inside: ``instance_norm`` with running statistics writes them through ``alias(...).copy_`` from
within ATen, and that write comes out of the first trace unchanged. When the traced graph still
mutates a value that is not a graph input, it is traced once more: those inner operators are now
graph nodes, and functionalization rewrites them like any other.

Operators with a declared side effect (``_linalg_check_errors``, which raises on a failed
factorization) are threaded through an effect token while tracing and come out as plain calls
in their original order, which no later pass removes or reorders.
"""
from __future__ import annotations

from typing import Literal

import attrs
import torch
import torch.fx

from pipeline import Pass, PassContext, option
from pipeline import compat


@attrs.frozen
class FunctionalizeOptions:
    remove: Literal["mutations", "mutations_and_views"] = option(
        "mutations", "mutations: in-place writes become out-of-place ops and views stay views (no "
                     "copies); mutations_and_views: views become *_copy ops too, which materialize.")


def mutated_intermediates(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """In-place nodes that write into something other than a graph input (none in a functional graph)."""
    out = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and compat.is_mutating(node.target):
            first = node.args[0] if node.args else None
            if not (isinstance(first, torch.fx.Node) and first.op == "placeholder"):
                out.append(node)
    return out


class Functionalize(Pass):
    """Functional ATen graph via make_fx(functionalize(...)): no in-place ops except input write-backs."""

    name = "functionalize"
    Options = FunctionalizeOptions
    version = "4"
    requires = frozenset({"captured"})
    provides = frozenset({"functional", "aten"})

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        with torch.no_grad():
            traced = compat.retrace(graph, context.example_inputs, functionalize=True,
                                    remove=self.options.remove)
            left = mutated_intermediates(traced)
            if left:
                context.note(f"traced again: {len(left)} in-place write(s) from inside composite "
                             f"operators ({', '.join(sorted({compat.op_name(n.target) for n in left}))})")
                traced = compat.retrace(traced, context.example_inputs, functionalize=True,
                                        remove=self.options.remove)
        # Python floats Dynamo lifted into inputs: tensor operations, or traced again as constants.
        compat.tensorify_python_scalars(traced)
        return traced
