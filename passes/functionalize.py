"""``functionalize``: trace the captured graph to functional ATen with torch's functionalization.

In-place ops become out-of-place ones; writes into graph inputs (a buffer updated in place) stay
as one ``copy_`` into that input at the end of the graph, so the caller still sees the update."""
from __future__ import annotations

from typing import Literal

import attrs
import torch

from pipeline import Pass, PassContext, option
from pipeline import compat


@attrs.frozen
class FunctionalizeOptions:
    remove: Literal["mutations", "mutations_and_views"] = option(
        "mutations", "mutations: in-place writes become out-of-place ops and views stay views (no "
                     "copies); mutations_and_views: views become *_copy ops too, which materialize.")


class Functionalize(Pass):
    """Functional ATen graph via make_fx(functionalize(...)): no in-place ops except input write-backs."""

    name = "functionalize"
    Options = FunctionalizeOptions
    version = "1"
    requires = frozenset({"captured"})
    provides = frozenset({"functional", "aten"})

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        with torch.no_grad():
            return compat.retrace(graph, context.example_inputs, functionalize=True,
                                  remove=self.options.remove)
