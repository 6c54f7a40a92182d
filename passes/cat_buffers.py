"""Concatenations that extend one another share one buffer (``reinplace`` option ``share_cat_prefixes``).

A DenseNet block concatenates every earlier feature map again before each layer::

    c5 = cat([x, f1, f2, f3, f4], 1)      # read by layer 5
    c6 = cat([x, f1, f2, f3, f4, f5], 1)  # read by layer 6
    ...

Each ``cat`` copies all of its pieces, so a block of n layers copies its input n times: the bytes
grow with the square of the block's length (58 ATen cats, 2.3 ms a call in DenseNet-121 on a GPU).
When each cat's pieces begin with the previous cat's pieces, every cat is a leading part of the
last one along the cat dimension. So one buffer of the last cat's size and layout is allocated
where the first cat was, each piece is copied into its place once (where the first cat holding it
was computed), and every cat becomes a view of the buffer's leading part. Later copies write only
beyond a view's part, so a view keeps its values wherever its readers run.

A view of a leading part has the buffer's strides, not its own contiguous ones: the kernels that
read it are generated for that layout (this runs after ``fuse`` and before ``codegen``, and the
placeholders of fused groups reading a view take its layout, views of it are computed again). So
a cat is extended only when every reader, directly or through views, is a fused group: a graph
output would come back as a strided view of a larger buffer, and an extern call's result may take
its input's layout, which later nodes were not built for. The last cat of a chain is the whole
buffer, with the layout it had. Cats of symbolic sizes are left alone.
"""
from __future__ import annotations

import torch
import torch.fx

from passes.kernel_ir.groups import FusedGroup, meta_of
from passes.kernel_ir.nodes import call_with_value, static_sizes
from pipeline import compat

aten = torch.ops.aten


class _Cat:
    """A cat that may join a chain: its node, dim and non-empty pieces."""

    def __init__(self, node: torch.fx.Node, dim: int, pieces: list[torch.fx.Node]):
        self.node, self.dim, self.pieces = node, dim, pieces
        self.value = meta_of(node)

    def extends(self, other: "_Cat") -> bool:
        """True when ``other``'s pieces are the leading pieces of this cat's, along the same dim."""
        if other.dim != self.dim or len(other.pieces) >= len(self.pieces) or self.pieces[:len(other.pieces)] != other.pieces:
            return False
        a, b = self.value, other.value
        return a.dtype == b.dtype and a.device == b.device and all(
            x == y for d, (x, y) in enumerate(zip(a.shape, b.shape)) if d != self.dim)


def share_cat_prefixes(graph: torch.fx.GraphModule, use_fuel=lambda what: True) -> int:
    """Rewrite each chain of cats that extend one another (module docstring) into copies into one
    buffer and views of it; returns the number of cats rewritten. Chains of one cat stay."""
    chains: list[list[_Cat]] = []
    for node in graph.graph.nodes:
        cat = _candidate(node)
        if cat is None:
            continue
        tail = next((c for c in chains if cat.extends(c[-1]) and _reads_any_layout(c[-1].node)), None)
        if tail is not None:
            tail.append(cat)
        else:
            chains.append([cat])
    rewritten = 0
    for chain in chains:
        views = _fitting(chain)
        if len(chain) > 1 and use_fuel(f"share one buffer among {len(chain)} cats ending at {chain[-1].node.name}"):
            _rewrite(graph.graph, chain)
            for node, value in views.items():     # the layouts the readers of the cats' parts now see
                node.meta["val"] = value
            rewritten += len(chain)
    if rewritten:
        graph.recompile()
    return rewritten


def _candidate(node: torch.fx.Node) -> _Cat | None:
    if node.op != "call_function" or node.target is not aten.cat.default:
        return None
    value = meta_of(node)
    if not isinstance(value, torch.Tensor) or value.dim() == 0 or not static_sizes(value.shape) \
            or not static_sizes(value.stride()) or value.numel() == 0:
        return None
    dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % value.dim()
    pieces = []
    for piece in node.args[0]:
        piece_value = meta_of(piece) if isinstance(piece, torch.fx.Node) else None
        if not isinstance(piece_value, torch.Tensor) or piece_value.dim() != value.dim() \
                or not static_sizes(piece_value.shape):
            return None
        if piece_value.shape[dim]:
            pieces.append(piece)
    return _Cat(node, dim, pieces) if pieces else None


def _reads_any_layout(node: torch.fx.Node) -> bool:
    """True when every reader of ``node``, directly or through views, is a fused group: a kernel
    generated later for whatever layout its input has. An output, a write into it or an extern
    call (whose result's layout may follow its input's) ends a chain."""
    todo = list(node.users)
    while todo:
        user = todo.pop()
        if user.op == "call_function" and compat.is_view_op(user.target) and not compat.is_mutating(user.target):
            todo.extend(user.users)
        elif not isinstance(user.target, FusedGroup):
            return False
    return True


def _fitting(chain: list[_Cat]) -> dict:
    """Shorten ``chain`` (in place) until every view taken of an earlier cat can be taken of its
    part of the buffer (``view(-1)`` of a contiguous cat cannot of a strided part); returns the
    example values its readers see then, by node (the cats' own are their parts')."""
    while len(chain) > 1:
        last = chain[-1]
        total = last.value.new_empty_strided(last.value.shape, last.value.stride())
        values: dict = {}
        for index, cat in enumerate(chain[:-1]):
            values[cat.node] = total.narrow(last.dim, 0, cat.value.shape[last.dim])
            if not _view_values(cat.node, values):
                del chain[index + 1:]
                break
        else:
            return values
    return {}


def _view_values(node: torch.fx.Node, values: dict) -> bool:
    """Add to ``values`` what the views of ``node`` give for its value there (``values[node]``),
    views of them, and the placeholders of fused groups reading any of these and the views of
    those inside the group (which the group's kernel reads its input through); False when one of
    the views cannot be taken."""
    todo = [node]
    while todo:
        current = todo.pop(0)
        for user in current.users:
            if isinstance(user.target, FusedGroup):
                placeholders = user.target.subgraph.graph.find_nodes(op="placeholder")
                for placeholder, arg in zip(placeholders, user.args):
                    if arg is current:
                        values[placeholder] = values[current]
                        todo.append(placeholder)
            elif user.op == "call_function" and compat.is_view_op(user.target):
                try:
                    values[user] = compat.example_value(user, lambda n: values.get(n, n.meta.get("val")))
                except Exception:  # noqa: BLE001 - a view this layout does not allow
                    return False
                todo.append(user)
    return True


def _rewrite(graph: torch.fx.Graph, chain: list[_Cat]) -> None:
    last = chain[-1]
    dim, total = last.dim, last.value
    with graph.inserting_before(chain[0].node):
        buffer = call_with_value(graph, aten.empty_strided.default, (list(total.shape), list(total.stride())),
                                 {"dtype": total.dtype, "device": total.device})
    placed, offset = 0, 0
    for cat in chain:
        with graph.inserting_before(cat.node):
            for piece in cat.pieces[placed:]:
                width = meta_of(piece).shape[dim]
                part = call_with_value(graph, aten.slice.Tensor, (buffer, dim, offset, offset + width))
                copy = graph.call_function(aten.copy_.default, (part, piece))
                copy.meta["val"] = meta_of(part)
                offset += width
            placed = len(cat.pieces)
            view = buffer if cat is last else call_with_value(graph, aten.slice.Tensor, (buffer, dim, 0, offset))
        cat.node.replace_all_uses_with(view)
        graph.erase_node(cat.node)


__all__ = ["share_cat_prefixes"]
