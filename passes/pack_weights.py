"""``pack-weights``: fp32 CPU linear layers multiply by a weight kept in MKL's packed GEMM layout.

A CPU ``linear`` hands ``weight.t()`` to MKL's ``sgemm``, which copies the weight into its own
blocked layout on every call before multiplying. ``cblas_sgemm_pack`` makes that layout once and
``cblas_sgemm_compute`` multiplies by it directly; ATen exposes the pair as
``mkl::_mkl_reorder_linear_weight`` and ``mkl::_mkl_linear`` (what Inductor's ``freezing`` uses on
CPU), so the copy happens once instead of on every call; results are bit-identical to eager's. This pass makes every fp32 CPU ``mm``/``addmm`` of a static number of rows by the
transpose of a graph input call a :class:`PackedLinear`, which packs a parameter or buffer once and
keeps the packed copy while the weight is unchanged (:class:`pipeline.ir.KeptWeightValue`: same
object, address and version counter, checked every call). A weight that is not a parameter or
buffer (a tensor passed in, new each call) runs the plain ``linear``; so does a call with another
number of rows than the packing was made for (``_mkl_linear`` falls back itself).

A write through ``weight.data`` (``weight.data.copy_(...)``) cannot be seen by the per-call check,
so the pass is off unless a plan sets ``enabled: true``: ``cpu-inference`` does. The cost is
memory, a packed copy per weight: 50 weights of 256x256 (12.5 MB) added 15 MB of resident memory
(MKL reserves more address space, about 1.3x the weight plus 7.5 MB, but does not touch it).

Place it after ``fuse`` (fuse re-traces the graph) and before ``transpose-weights``, which would
otherwise take the same matmuls.
"""
from __future__ import annotations

from typing import Any

import attrs
import torch
import torch.fx

from pipeline import Pass, PassContext, non_negative, option
from passes.kernel_ir.groups import meta_of
from pipeline.ir import KeptWeightValue, is_static_input, transposed_matrix

aten = torch.ops.aten


def mkl_packing_available() -> bool:
    """Whether this torch build has MKL and ATen's packed-linear operators."""
    return (torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")
            and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight"))


@attrs.frozen
class PackWeightsOptions:
    enabled: bool = option(False, "Multiply by kept packed copies. Only for models whose weights change through "
                                  "the tensors themselves (optimizers, copy_, load_state_dict), never by "
                                  "writing weight.data in place, which the per-call check cannot see.")
    min_flops: int = option(1_000_000, "Only matmuls of at least this many floating-point operations (2 x rows x "
                                       "inner x outer): below it the packed call's fixed cost outweighs the "
                                       "repacking it saves.",
                            check=non_negative)


def kept_packing(rows: int) -> KeptWeightValue:
    """A kept MKL-packed copy of a weight, packed for matmuls of ``rows`` rows."""
    return KeptWeightValue(lambda weight: torch.ops.mkl._mkl_reorder_linear_weight(weight.contiguous(), rows))


class PackedLinear:
    """``linear(x, weight, bias)`` through MKL's packed GEMM, packed for ``rows`` rows. ``packing``
    (shared by the linear layers of one graph that read the same weight) keeps the packed copy;
    ``packings`` counts the packings made (tests read it)."""

    __name__ = "packed_linear"

    def __init__(self, rows: int, packing: KeptWeightValue | None = None) -> None:
        self.rows = rows
        self._packing = packing or kept_packing(rows)

    @property
    def packings(self) -> int:
        return self._packing.made

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if not is_static_input(weight):
            return aten.linear.default(x, weight, bias)
        return torch.ops.mkl._mkl_linear.default(x, self._packing.get(weight), weight, bias, self.rows)

    def to_data(self, codec: Any) -> dict:
        """The row count; a rebuilt object packs on its first call (see pipeline.cache.graph_io)."""
        return {"rows": self.rows}

    @classmethod
    def from_data(cls, data: dict, codec: Any) -> "PackedLinear":
        return cls(int(data["rows"]))


class PackWeights(Pass):
    """fp32 CPU linear layers multiply by a kept MKL-packed copy of their weight (checked each call)."""

    name = "pack-weights"
    Options = PackWeightsOptions
    version = "1"
    requires = frozenset({"aten"})

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        if not self.options.enabled or context.role != "inference":
            return graph            # a training step's weights change every step: packing would not pay
        if not mkl_packing_available():
            context.note("this torch build has no MKL packed GEMM: matmuls unchanged")
            return graph
        placeholders = {n for n in graph.graph.nodes if n.op == "placeholder"}
        packings: dict = {}
        changed = False
        for node in list(graph.graph.nodes):
            operands = self._linear_operands(node, placeholders)
            if operands is None:
                continue
            x, weight, bias, rows = operands
            key = (weight, rows)
            if key not in packings:
                packings[key] = kept_packing(rows)
            with graph.graph.inserting_before(node):
                packed = graph.graph.call_function(PackedLinear(rows, packings[key]), (x, weight, bias))
            packed.meta.update(node.meta)
            node.replace_all_uses_with(packed)
            graph.graph.erase_node(node)
            changed = True
            context.note(f"{packed.name} multiplies by an MKL-packed copy of {weight.name} ({rows} rows)")
        if not changed:
            return graph
        graph.graph.eliminate_dead_code()
        graph.recompile()
        return graph

    def _linear_operands(self, node: torch.fx.Node, placeholders: set) -> tuple | None:
        """``(x, w, bias or None, rows)`` when ``node`` is an fp32 CPU ``mm(x, w.t())`` or
        ``addmm(bias, x, w.t())`` (bias 1-D, no scaling) with a static row count, ``w`` a contiguous
        graph input of static shape and at least ``min_flops`` of work; else None."""
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
            return None
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return None
        x, right = node.args[-2], node.args[-1]
        out, left = meta_of(node), meta_of(x)
        if not isinstance(out, torch.Tensor) or out.device.type != "cpu" or out.dtype != torch.float32:
            return None
        if not isinstance(left, torch.Tensor) or left.dtype != torch.float32 or not isinstance(left.shape[0], int):
            return None
        weight = transposed_matrix(right)
        if weight is None or weight not in placeholders:
            return None
        value = meta_of(weight)
        if (value.dtype != torch.float32 or not value.is_contiguous()
                or not all(isinstance(size, int) for size in value.shape)):
            return None
        bias = None
        if node.target is aten.addmm.default:
            bias = node.args[0]
            bias_value = meta_of(bias) if isinstance(bias, torch.fx.Node) else None
            if (not isinstance(bias_value, torch.Tensor) or tuple(bias_value.shape) != (out.shape[1],)
                    or bias_value.dtype != torch.float32):
                return None
        rows, (outer, inner) = int(left.shape[0]), value.shape
        if 2 * rows * inner * outer < self.options.min_flops:
            return None
        return x, weight, bias, rows


__all__ = ["PackWeights", "PackWeightsOptions", "PackedLinear", "kept_packing", "mkl_packing_available"]
