"""Concatenations as selects over padded pieces (``fuse`` option ``max_cat_inputs``).

``cat([a, b], dim)`` copies its pieces into a new tensor: a kernel of its own, whose result the
next kernel reads back, and pieces computed by kernels of their own first. Rotary position
embeddings do this in every attention layer of a decoder: ``rotate_half(q) = cat(-q2, q1)`` feeds
``q * cos + rotate_half(q) * sin``, and partial rotary glues the rotated and the untouched part
back together.

Written as an elementwise function of the output position instead, the same values are::

    where(i < n_a, pad(a, [0, n_b]), pad(b, [n_a, 0]))       # i: the index along dim

where ``pad`` places a piece at its offset along ``dim`` (a ``constant_pad_nd``). A kernel reads
the pad of one of its inputs as a masked load at a shifted address (passes/kernel_ir/loops.py), so
the select, the pieces' elementwise work and the cat's consumers become one kernel, and the
concatenated tensor is never written. The pad moves below elementwise work on a piece
(``pad(-q2)`` becomes ``-pad(q2)``), so that work joins the kernel too; what a piece computes
outside its own range is discarded by the select.

A rewrite applies to a cat of static shape, contiguous or channels-last, along any dim, with at
most ``max_cat_inputs`` non-empty pieces (``max_cat_inputs_by_device`` per device type), when it
saves a kernel: some piece is elementwise work read only by the cat, or every reader of the cat
is elementwise (it takes the select into its kernel). A cat of extern results read by an extern
call (a key-value cache) or by a reduction (a U-Net's skip connection into a group norm:
reduction kernels do not read padded inputs) stays a cat. Pads move only through elementwise
operators with floating-point or boolean results (a discarded integer division by the zero
padding would raise in eager execution), and through slices of such results.
"""
from __future__ import annotations

import torch
import torch.fx

from passes.kernel_ir.groups import iota_of, meta_of, packet_name
from passes.kernel_ir.nodes import input_padding, static_sizes

from .legality import classify
from .slices import slice_bounds
from .views import LAYOUT_FREE, call_with_value

aten = torch.ops.aten
prims = torch.ops.prims

MAX_DEPTH = 16      # most elementwise nodes a pad moves below, per piece


def pointwise_cats(graph: torch.fx.GraphModule, max_inputs: dict[str, int]) -> int:
    """Rewrite the qualifying cats of ``graph`` in place (module docstring), with at most
    ``max_inputs[device type]`` pieces; returns how many. New nodes carry example values; the
    caller re-traces the graph for their exact layouts."""
    rewritten = 0
    for node in list(graph.graph.nodes):
        pieces = _pieces(node, max_inputs)
        if pieces is None or not _saves_a_kernel(node, pieces):
            continue
        with graph.graph.inserting_before(node):
            node.replace_all_uses_with(_select(graph.graph, node, pieces))
        graph.graph.erase_node(node)
        rewritten += 1
    if rewritten:
        graph.graph.eliminate_dead_code()
        graph.recompile()
    return rewritten


def scatters_into_fills(graph: torch.fx.GraphModule) -> int:
    """Rewrite ``slice_scatter(full(v), src, dim, start, end)`` (step 1, static sizes, the result
    not returned) as ``constant_pad_nd(src, ..., v)``: the same values, and a pad that the kernel
    reading it takes as a masked load. The backward of a slice is this (a rotary embedding's
    halves, a split's pieces): each gradient piece was written into a zero tensor by an ATen call
    before the kernel that adds the pieces up. Returns how many."""
    returned = set(next(n for n in graph.graph.nodes if n.op == "output").all_input_nodes)
    rewritten = 0
    for node in list(graph.graph.nodes):
        pad = _fill_pad(node) if node not in returned else None
        if pad is None:
            continue
        base, src = node.args[0], node.args[1]
        with graph.graph.inserting_before(node):
            padded = call_with_value(graph.graph, aten.constant_pad_nd.default, (src, pad, base.args[1]))
        node.replace_all_uses_with(padded)
        graph.graph.erase_node(node)
        if not base.users:
            graph.graph.erase_node(base)
        rewritten += 1
    if rewritten:
        graph.recompile()
    return rewritten


def zero_pads_as_clones(graph: torch.fx.GraphModule) -> int:
    """Rewrite ``constant_pad_nd(x, [0, 0, ...])`` as ``clone(x)`` in the pad's layout: a pad of zero
    widths copies ``x`` (a Swin block pads its windows by what the image lacks, often nothing), and
    ATen runs the copy as a kernel of its own where a clone joins the kernels around it. Pads whose
    layout neither contiguous nor channels-last clone gives stay. Returns how many."""
    rewritten = 0
    for node in list(graph.graph.nodes):
        if node.op != "call_function" or node.target is not aten.constant_pad_nd.default \
                or not isinstance(node.args[0], torch.fx.Node) or any(w != 0 for w in node.args[1]):
            continue
        value = meta_of(node)
        formats = [torch.contiguous_format] + ([torch.channels_last] if value.dim() == 4 else [])
        for memory_format in formats:
            with graph.graph.inserting_before(node):
                clone = call_with_value(graph.graph, aten.clone.default, (node.args[0],),
                                        {"memory_format": memory_format})
            if tuple(meta_of(clone).stride()) == tuple(value.stride()):
                node.replace_all_uses_with(clone)
                graph.graph.erase_node(node)
                rewritten += 1
                break
            graph.graph.erase_node(clone)
    if rewritten:
        graph.recompile()
    return rewritten


def _fill_pad(node: torch.fx.Node) -> list[int] | None:
    """The pad widths of a ``slice_scatter`` into a fill that :func:`scatters_into_fills` rewrites."""
    if node.op != "call_function" or node.target is not aten.slice_scatter.default:
        return None
    base, src = node.args[0], node.args[1]
    if not isinstance(base, torch.fx.Node) or base.op != "call_function" or packet_name(base.target) != "aten.full" \
            or not isinstance(src, torch.fx.Node):
        return None
    names = ("dim", "start", "end", "step")
    given = dict(zip(names, node.args[2:]), **node.kwargs)
    value, piece = meta_of(node), meta_of(src)
    if not (isinstance(value, torch.Tensor) and isinstance(piece, torch.Tensor)) or given.get("step", 1) != 1 \
            or value.dtype != piece.dtype or value.dim() != piece.dim() or value.dim() == 0 \
            or not static_sizes(value.shape) or not static_sizes(piece.shape):
        return None
    dim = given.get("dim", 0) % value.dim()
    size, length = value.shape[dim], piece.shape[dim]
    start = given.get("start") or 0
    start = min(max(start + size if start < 0 else start, 0), size)
    if start + length > size or any(a != b for d, (a, b) in enumerate(zip(value.shape, piece.shape)) if d != dim):
        return None
    return [0, 0] * (value.dim() - 1 - dim) + [start, size - start - length]


def _pieces(node: torch.fx.Node, max_inputs: dict[str, int]) -> list[torch.fx.Node] | None:
    """The non-empty pieces of a cat that qualifies (module docstring), else None."""
    if node.op != "call_function" or node.target is not aten.cat.default:
        return None
    value = meta_of(node)
    if not isinstance(value, torch.Tensor) or value.dim() == 0 or not static_sizes(value.shape) \
            or not _dense(value) or value.device.type not in ("cpu", "cuda"):
        return None
    dim = _dim(node) % value.dim()
    pieces = []
    for piece in node.args[0]:
        piece_value = meta_of(piece)
        if not isinstance(piece_value, torch.Tensor) or piece_value.dim() != value.dim() \
                or not static_sizes(piece_value.shape) or piece_value.device != value.device:
            return None
        if piece_value.shape[dim]:
            pieces.append(piece)
    return pieces if 2 <= len(pieces) <= max_inputs.get(value.device.type, 0) else None


def _dense(value: torch.Tensor) -> bool:
    """Contiguous, or channels-last (the layout a select over pieces of that layout takes)."""
    return value.is_contiguous() or (value.dim() == 4 and value.is_contiguous(memory_format=torch.channels_last))


def _dim(node: torch.fx.Node) -> int:
    return node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)


def _saves_a_kernel(node: torch.fx.Node, pieces: list) -> bool:
    own = any(classify(p)[0] == "pointwise" and set(p.users) == {node} for p in pieces)
    return own or all(classify(user)[0] == "pointwise" for user in node.users)


def _select(graph: torch.fx.Graph, node: torch.fx.Node, pieces: list) -> torch.fx.Node:
    """``where(i < end_0, pad_0, where(i < end_1, pad_1, ... pad_last))`` for the cat ``node``."""
    value = meta_of(node)
    dim = _dim(node) % value.dim()
    total = value.shape[dim]
    ramp = call_with_value(graph, prims.iota.default, (total,), {
        "start": 0, "step": 1, "dtype": torch.int64, "device": value.device, "requires_grad": False})
    index = call_with_value(graph, aten.view.default, (ramp, [total] + [1] * (value.dim() - dim - 1)))
    padded, start = [], 0
    for piece in pieces:
        size = meta_of(piece).shape[dim]
        padded.append((_Placed(graph, value.dim(), dim, start, total - start - size).of(piece), start + size))
        start += size
    result = padded[-1][0]
    for piece, end in reversed(padded[:-1]):
        below = call_with_value(graph, aten.lt.Scalar, (index, end))
        result = call_with_value(graph, aten.where.self, (below, piece, result))
    return result


class _Placed:
    """Pieces placed at ``before`` along ``dim`` of a rank-``rank`` result, ``after`` more after:
    elementwise nodes computed from placed operands, down to leaves that are padded (a fill or
    an index ramp along ``dim`` is made at the placed shape instead: it reads no memory)."""

    def __init__(self, graph: torch.fx.Graph, rank: int, dim: int, before: int, after: int):
        self.graph, self.rank, self.dim, self.before, self.after = graph, rank, dim, before, after
        self.depth = 0
        self.made: dict[torch.fx.Node, torch.fx.Node] = {}

    def of(self, node: torch.fx.Node) -> torch.fx.Node:
        if node not in self.made:
            self.made[node] = self._place(node)
        return self.made[node]

    def _place(self, node: torch.fx.Node) -> torch.fx.Node:
        value = meta_of(node)
        axis = self.dim - (self.rank - value.dim())
        shape = list(value.shape)
        shape[axis] += self.before + self.after
        if self.depth < MAX_DEPTH and _elementwise(node):
            self.depth += 1
            return call_with_value(self.graph, node.target, tuple(self._operand(a) for a in node.args),
                         {k: self._operand(v) for k, v in node.kwargs.items()})
        if self.depth < MAX_DEPTH and _slice_of_elementwise(node):
            return self.of(self._sliced_operands(node))
        if packet_name(node.target) == "aten.full" and node.op == "call_function":
            return call_with_value(self.graph, node.target, (shape, *node.args[1:]), dict(node.kwargs))
        ramp = iota_of(node)
        if ramp is not None and ramp.axis == axis:      # the ramp continued over the placed extent
            line = call_with_value(self.graph, prims.iota.default, (shape[axis],), {
                "start": ramp.start - self.before * ramp.step, "step": ramp.step, "dtype": value.dtype,
                "device": value.device, "requires_grad": False})
            unit = [1] * len(shape)
            unit[axis] = shape[axis]
            return call_with_value(self.graph, aten.expand.default, (
                call_with_value(self.graph, aten.view.default, (line, unit)), shape))
        pad = [0, 0] * (value.dim() - 1 - axis) + [self.before, self.after]
        inner = input_padding(node)
        if inner is not None:           # a pad of a pad: one pad (the outer fill is never selected)
            source, widths, fill = node.args[0], list(node.args[1]), inner[1]
            widths += [0] * (len(pad) - len(widths))
            pad += [0] * (len(widths) - len(pad))
            return call_with_value(self.graph, aten.constant_pad_nd.default,
                                   (source, [a + b for a, b in zip(pad, widths)], fill))
        return call_with_value(self.graph, aten.constant_pad_nd.default, (node, pad, 0))

    def _sliced_operands(self, cut: torch.fx.Node) -> torch.fx.Node:
        """``f(slice(a), b)`` for ``cut = slice(f(a, b))``: the slice of an elementwise result is
        the elementwise op on slices of its operands (those of size 1 along the sliced dim are
        not sliced), so the pad can move below ``f`` (a rotary embedding of ``q.float()`` slices
        the conversion)."""
        source, dim, start, end = cut.args[0], *slice_bounds(cut)
        rank = meta_of(source).dim()

        def sliced(arg):
            value = meta_of(arg) if isinstance(arg, torch.fx.Node) else None
            if not isinstance(value, torch.Tensor):
                return arg
            axis = dim - (rank - value.dim())
            if axis < 0 or value.shape[axis] == 1:
                return arg
            return call_with_value(self.graph, aten.slice.Tensor, (arg, axis, start, end))
        return call_with_value(self.graph, source.target, tuple(sliced(a) for a in source.args),
                     {k: sliced(v) for k, v in source.kwargs.items()})

    def _operand(self, arg):
        """An operand of an elementwise node being placed: placed too when it has the piece's
        extent along ``dim``; as it is when it broadcasts along ``dim`` (or is no tensor)."""
        value = meta_of(arg) if isinstance(arg, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor):
            return arg
        axis = self.dim - (self.rank - value.dim())
        if axis < 0 or value.shape[axis] == 1:
            return arg
        return self.of(arg)




def _slice_of_elementwise(node: torch.fx.Node) -> bool:
    """A static step-1 slice of an elementwise result (see :meth:`_Placed._sliced_operands`)."""
    return slice_bounds(node) is not None and isinstance(node.args[0], torch.fx.Node) \
        and _elementwise(node.args[0]) and static_sizes(meta_of(node.args[0]).shape)


def _elementwise(node: torch.fx.Node) -> bool:
    """An elementwise operator with a floating-point or boolean result that fuse can put in a
    kernel (an integer result could be a division by the padding's zeros, which eager refuses)."""
    if node.op != "call_function" or classify(node)[0] != "pointwise" or not node.all_input_nodes:
        return False
    if node.target is aten._to_copy.default:
        if not set(node.kwargs) <= {"dtype", "memory_format"} or node.kwargs.get("memory_format") not in LAYOUT_FREE:
            return False
    elif not (isinstance(node.target, torch._ops.OpOverload) and torch.Tag.pointwise in node.target.tags):
        return False
    dtype = meta_of(node).dtype
    return dtype.is_floating_point or dtype == torch.bool


__all__ = ["pointwise_cats", "scatters_into_fills"]
