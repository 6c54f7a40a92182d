"""``transpose-weights``: give small-batch matmuls a row-major copy of the weights they read transposed.

``linear`` multiplies by ``weight.t()``, a transposed view, and the CPU BLAS repacks that view on
every call. With few rows the repacking is a visible part of the call (with many rows it is not,
hence ``max_rows``). This pass makes
``mm``/``addmm`` with at most ``max_rows`` rows read their transposed weight through a
:class:`TransposedWeight`, which keeps that copy between calls.

The copy is remade whenever the weight is seen to change: each call checks that the weight is the
same tensor object, at the same address, with the same version counter (every in-place update
through the tensor itself bumps it: an optimizer's step, ``copy_``, ``add_`` under no_grad). A
write through ``weight.data`` (``weight.data.copy_(...)``) does not bump the counter and cannot be
seen, which is why the pass is off unless a plan sets ``enabled: true`` (torch's ``freezing`` makes
the same trade, assuming weights never change). A weight that is not a parameter or buffer (a
tensor the caller passes in, new each call) gets the transposed view as before, without a copy.
The cost is memory: one copy of each such weight.

Place it after ``fuse``: fuse re-traces the graph, which would trace through the cache and leave a
plain transpose.
"""
from __future__ import annotations

from typing import Any

import attrs
import torch
import torch.fx

from pipeline import Pass, PassContext, device_types, option, positive
from passes.kernel_ir.groups import meta_of
from pipeline.ir import KeptWeightValue, is_static_input, transposed_matrix

aten = torch.ops.aten


@attrs.frozen
class TransposeWeightsOptions:
    enabled: bool = option(False, "Read kept copies. Only for models whose weights change through the tensors "
                                  "themselves (optimizers, copy_, load_state_dict), never by writing "
                                  "weight.data in place, which the per-call check cannot see.")
    max_rows: int = option(256, "Only matmuls with at most this many rows (the batch of a linear layer) read a "
                                "copy: with more rows the BLAS's own repacking is a small share of the call.",
                           check=positive)
    devices: list[str] = option(["cpu"], "Devices whose matmuls read copies.", check=device_types)


class TransposedWeight:
    """``weight.t()`` for a matmul: for a parameter or buffer a contiguous copy, kept while the
    weight is unchanged (:class:`pipeline.ir.KeptWeightValue`); for any other tensor the transposed
    view. ``copies`` counts the copies made (tests read it)."""

    __name__ = "transposed_weight"

    def __init__(self) -> None:
        self._kept = KeptWeightValue(lambda weight: weight.t().contiguous())

    @property
    def copies(self) -> int:
        return self._kept.made

    def __call__(self, weight: torch.Tensor) -> torch.Tensor:
        if not is_static_input(weight):
            return weight.t()
        return self._kept.get(weight)

    def to_data(self, codec: Any) -> dict:
        """Nothing to write: a rebuilt object starts without a copy (see pipeline.cache.graph_io)."""
        return {}

    @classmethod
    def from_data(cls, data: dict, codec: Any) -> "TransposedWeight":
        """A fresh object (its first call makes the copy)."""
        return cls()


class TransposeWeights(Pass):
    """Small-batch CPU matmuls read a kept row-major copy of their transposed weight (checked each call)."""

    name = "transpose-weights"
    Options = TransposeWeightsOptions
    version = "1"
    requires = frozenset({"aten"})

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        if not self.options.enabled or context.role != "inference":
            return graph            # a training step's weights change every step: a copy would not pay
        placeholders = {n for n in graph.graph.nodes if n.op == "placeholder"}
        made: dict = {}
        for node in list(graph.graph.nodes):
            transposed = self._transposed_operand(node, placeholders)
            if transposed is None:
                continue
            weight = transposed.args[0]
            if weight not in made:
                with graph.graph.inserting_after(weight):
                    made[weight] = graph.graph.call_function(TransposedWeight(), (weight,))
                # The example value is the view's: the node's value is either layout (a kept
                # copy or the view), which its only consumers, ATen matmuls, both accept.
                made[weight].meta["val"] = meta_of(transposed)
            node.replace_input_with(transposed, made[weight])
            context.note(f"{node.name} reads a kept copy of {weight.name}.t()")
        if not made:
            return graph
        graph.graph.eliminate_dead_code()
        graph.recompile()
        return graph

    def _transposed_operand(self, node: torch.fx.Node, placeholders: set) -> torch.fx.Node | None:
        """The ``permute(w, [1, 0])`` / ``t(w)`` node ``node`` (an mm/addmm of few enough rows on a
        chosen device) multiplies by, ``w`` a graph input; else None."""
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
            return None
        left, right = node.args[-2], node.args[-1]
        out, rows = meta_of(node), meta_of(left)
        if not isinstance(out, torch.Tensor) or out.device.type not in self.options.devices:
            return None
        if not isinstance(rows, torch.Tensor) or not isinstance(rows.shape[0], int) or rows.shape[0] > self.options.max_rows:
            return None
        weight = transposed_matrix(right)
        if weight is None or weight not in placeholders:
            return None
        return right


__all__ = ["TransposeWeights", "TransposedWeight", "TransposeWeightsOptions"]
