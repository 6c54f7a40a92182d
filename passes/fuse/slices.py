"""Slices of elementwise results, computed from slices of the operands (``fuse`` option
``split_elementwise``).

``split(f(a, m), sizes, dim)`` reads ``f``'s whole result in pieces. A kernel computing ``f`` would
write it all for the pieces' consumers to read back, and a piece's consumer cannot take ``f`` into
its own kernel: it reads ``f`` at other positions than its own. Computed per piece instead, each
``f(slice(a), m)`` reads the same elements of ``a`` and joins the kernel that consumes the piece; the
whole result is never written. Exact for elementwise ``f``: an operand with the full size along
``dim`` is sliced like the result, one of size 1 there (or without that axis) broadcasts to every
piece as it did to the whole.

Where it matters: a mixture-of-experts layer (Mixtral in transformers) zeroes the padded rows of its
grouped matmul with ``where(mask, 0, y)``, then splits ``y`` into the gate and up halves of a
SwiGLU. Rewritten, ``silu(where(mask, 0, y_gate)) * where(mask, 0, y_up)`` is one kernel reading
the matmul's output directly.

A rewrite applies when every user of ``f`` is a slice (``aten.slice``, or ``split`` /
``split_with_sizes`` read through ``getitem``) along one static axis, with static bounds, and every
piece is read only by fusable nodes (a piece an extern call reads would be a kernel of its own
either way). Its operands' slices are new slice nodes, so an operand that is itself elementwise and
now sliced everywhere is rewritten in the next round.
"""
from __future__ import annotations

import operator

import torch
import torch.fx

from passes.kernel_ir.groups import meta_of
from passes.kernel_ir.nodes import static_sizes

from .legality import classify
from .views import LAYOUT_FREE, _remap, rewrite_in_rounds

aten = torch.ops.aten
SPLITS = (aten.split.Tensor, aten.split_with_sizes.default)


def split_elementwise(graph: torch.fx.GraphModule) -> int:
    """Rewrite slices of elementwise results in ``graph`` (in place) as above, in rounds until
    none applies; returns how many elementwise nodes were split. New nodes carry example values
    derived from the old ones; the caller re-traces the graph for exact ones."""
    return rewrite_in_rounds(graph, (_split,))


def _int(value) -> bool:
    return type(value) is int


def _pieces(node: torch.fx.Node) -> list[tuple[torch.fx.Node, int, int, int]] | None:
    """``(piece node, dim, start, end)`` for every slice of ``node`` (all its users must be slices
    along the same axis, step 1, static bounds), or None."""
    rank = meta_of(node).dim()
    size_of = list(meta_of(node).shape)
    pieces, dims = [], set()
    for user in node.users:
        if user.op != "call_function" or user.kwargs:
            return None
        if user.target is aten.slice.Tensor:
            bounds = slice_bounds(user)
            if bounds is None:
                return None
            dim = bounds[0]
            pieces.append((user, *bounds))
        elif user.target in SPLITS:
            sizes = user.args[1]
            dim = user.args[2] if len(user.args) > 2 else 0
            if not _int(dim):
                return None
            dim %= rank
            if _int(sizes):
                sizes = [min(sizes, size_of[dim] - k) for k in range(0, size_of[dim], sizes)]
            if not all(_int(s) for s in sizes) or not all(
                    u.op == "call_function" and u.target is operator.getitem for u in user.users):
                return None
            offsets = [sum(sizes[:k]) for k in range(len(sizes))]
            for item in user.users:
                k = item.args[1]
                pieces.append((item, dim, offsets[k], offsets[k] + sizes[k]))
        else:
            return None
        dims.add(dim)
    return pieces if len(dims) == 1 else None


def slice_bounds(node: torch.fx.Node) -> tuple[int, int, int] | None:
    """``(dim, start, end)`` of a step-1 ``aten.slice`` with static bounds (normalized and
    clamped as eager does, ``end >= start``), else None."""
    if node.op != "call_function" or node.target is not aten.slice.Tensor or node.kwargs:
        return None
    size_of = list(meta_of(node.args[0]).shape)
    dim, start, end, step = (list(node.args[1:]) + [0, None, None, 1][len(node.args) - 1:])[:4]
    if not (_int(dim) and _int(step) and step == 1):
        return None
    dim %= len(size_of)
    start = 0 if start is None else start
    end = size_of[dim] if end is None else end
    if not (_int(start) and _int(end) and _int(size_of[dim])):
        return None
    start, end = _clamped(start, size_of[dim]), _clamped(end, size_of[dim])
    return dim, start, max(start, end)


def _clamped(index: int, size: int) -> int:
    if index < 0:
        index += size
    return min(max(index, 0), size)


def _split(graph: torch.fx.Graph, node: torch.fx.Node) -> int:
    """Rewrite the slices of ``node``, an elementwise result; 1 if rewritten."""
    if node.op != "call_function" or classify(node)[0] != "pointwise" or not node.users:
        return 0
    value = meta_of(node)
    if not isinstance(value, torch.Tensor) or not static_sizes(value.shape) \
            or node.kwargs.get("memory_format") not in LAYOUT_FREE:
        return 0
    pieces = _pieces(node)
    if not pieces or not all(all(classify(u)[0] in ("pointwise", "reduction") for u in piece.users)
                             for piece, *_ in pieces):
        return 0
    dim = pieces[0][1]
    sliced: list[torch.fx.Node] = []     # operands sliced with the result
    for arg in node.all_input_nodes:
        operand = meta_of(arg)
        if not isinstance(operand, torch.Tensor) or not static_sizes(operand.shape):
            return 0
        axis = dim - (value.dim() - operand.dim())
        if axis < 0 or operand.shape[axis] == 1:
            continue                                            # broadcast along dim: every piece reads it whole
        if operand.shape[axis] != value.shape[dim]:
            return 0
        sliced.append(arg)
    if not sliced:
        return 0
    for piece, _, start, end in pieces:
        with graph.inserting_before(piece):
            mapping = {}
            for arg in sliced:
                axis = dim - (value.dim() - meta_of(arg).dim())
                cut = graph.call_function(aten.slice.Tensor, (arg, axis, start, end))
                cut.meta["val"] = meta_of(arg).narrow(axis, start, end - start)
                mapping[arg] = cut
            args, kwargs = _remap(node, mapping)
            moved = graph.call_function(node.target, args, kwargs)
            moved.meta = {k: v for k, v in node.meta.items() if k != "val"}
            moved.meta["val"] = torch.empty_like(meta_of(piece), memory_format=torch.contiguous_format)
        piece.replace_all_uses_with(moved)
    for piece, *_ in pieces:
        if piece.graph is graph and not piece.users:
            split = piece.args[0] if piece.target is operator.getitem else None
            graph.erase_node(piece)
            if split is not None and split is not node and not split.users:
                graph.erase_node(split)
    return 1

