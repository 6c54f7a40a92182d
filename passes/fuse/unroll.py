"""Reductions over a few elements, computed as elementwise work (``fuse`` option
``unroll_reductions``).

``sum(x, dim)`` over an axis of 2 elements is ``x[:, 0] + x[:, 1]``. As a reduction it is a kernel
of its own whose every row holds two elements (a grid of tiny rows, loads strided by the row
length), and it ends fusion: the pointwise or reduction work that reads its result cannot join
it when that work iterates another domain. Written as adds of slices, it is pointwise work over
the result's domain that joins its consumers' kernel, reading each slice with the coalesced
strides of the rest of ``x``.

Where it matters: a mixture-of-experts layer sums each token's top-2 expert outputs
(``view(y, [tokens, 2, hidden]).sum(1)``) and adds the residual before the next RMS norm; unrolled,
the sum joins the norm's kernel. Inductor unrolls reductions of up to 8 elements the same way.

A ``sum``, ``mean``, ``amax`` or ``amin`` over static axes of at most ``limit`` (and at least 2)
elements per result qualifies when what it reduces is read from memory (a kernel input) or is
elementwise work that feeds only this reduction, down to values read from memory: the slices
then move up through that work (:func:`~.slices.split_elementwise`) and never cut a kernel in
two. A reduction whose result is read by work over its input's own shape (a softmax's
``x - max(x)``) stays one: its kernel holds that work already; so does one that reduces a value
read from memory and that no kernel reads (a bias gradient over a batch of 4: its slices would
only be views the host makes on every call). Sums of half-precision values add in float32 and
round once, as eager's sum does.

A reduction over the index dims of indexing ``x[idx]`` (:func:`~.gathers.indexing`; after
:func:`~.gathers.index_views`, ``y[order].view(tokens, 2, hidden).sum(1)`` is one) unrolls into
``x`` indexed by slices of ``idx``: each piece is a gather a kernel reads with indirect loads, made
in the shape of the one view that reads the result when that view only reshapes the index dims.
"""
from __future__ import annotations

import itertools
import math

import torch
import torch.fx

from passes.kernel_ir.groups import meta_of
from passes.kernel_ir.nodes import SOURCES, packet_name, static_sizes

from .gathers import indexing
from .legality import classify
from .views import VIEWS, call_with_value

aten = torch.ops.aten

_COMBINE = {"sum": aten.add.Tensor, "mean": aten.add.Tensor, "max": aten.maximum.default,
            "min": aten.minimum.default}
_KINDS = {aten.sum.dim_IntList: "sum", aten.sum.default: "sum", aten.mean.dim: "mean",
          aten.amax.default: "max", aten.amin.default: "min"}
MAX_DEPTH = 16   # most elementwise nodes above a reduction that the feeds-only check walks


def unroll_reductions(graph: torch.fx.GraphModule, limit: int) -> int:
    """Rewrite every qualifying reduction of ``graph`` (module docstring) in place; returns how
    many were rewritten. New nodes carry example values."""
    done = 0
    for node in list(graph.graph.nodes):
        parsed = _parse(node)
        if parsed is None:
            continue
        kind, source, dims, keepdim = parsed
        value = meta_of(source)
        count = math.prod(value.shape[d] for d in dims)
        if not 2 <= count <= limit or _read_at_source_shape(node, tuple(value.shape)):
            continue
        indexed = _indexed_over(source, dims)
        if indexed is None and not _feeds_only(source, node, dims, value.dim()):
            continue
        if indexed is None and _read_from_memory(source) and not any(_fusable(user) for user in node.users):
            continue        # nothing to join: the slices would be views the host makes per call
        replaced, block = node, None
        if indexed is not None:
            replaced, block = _index_block(node, indexed, dims, keepdim)
        with graph.graph.inserting_before(node):
            replacement = _unrolled(graph.graph, kind, source, dims, keepdim, meta_of(node).dtype, indexed, block)
        replaced.replace_all_uses_with(replacement)
        graph.graph.erase_node(replaced)
        if replaced is not node:
            graph.graph.erase_node(node)
        done += 1
    if done:
        graph.graph.eliminate_dead_code()
        graph.recompile()
    return done


def _parse(node: torch.fx.Node) -> tuple | None:
    """``(kind, source, dims, keepdim)`` of a reduction this rewrite handles, or None."""
    if node.op != "call_function" or node.target not in _KINDS:
        return None
    kind = _KINDS[node.target]
    source = node.args[0]
    value, out = meta_of(source), meta_of(node)
    if not (isinstance(value, torch.Tensor) and isinstance(out, torch.Tensor)) or value.dim() == 0:
        return None
    if not static_sizes(value.shape) or value.numel() == 0:
        return None
    if kind == "mean":
        if not (out.dtype.is_floating_point and value.dtype.is_floating_point) or out.device.type not in ("cpu", "cuda"):
            return None
    elif classify(node)[0] != "reduction":
        return None
    if kind == "sum" and node.target is aten.sum.default:
        dims, keepdim = None, False
    else:
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    if isinstance(dims, int):
        dims = [dims]
    if dims is None or len(dims) == 0:
        dims = list(range(value.dim()))
    if not all(type(d) is int for d in dims) or type(keepdim) is not bool:
        return None
    return kind, source, sorted({d % value.dim() for d in dims}), keepdim


def _read_at_source_shape(node: torch.fx.Node, shape: tuple) -> bool:
    """True when work of the reduced input's ``shape`` reads the result (directly or through
    reshapes): a softmax's ``x - max``. The reduction's kernel then holds that work already (an
    epilogue over its own domain), and unrolling would only add inputs."""
    pending, seen = list(node.users), 0
    while pending and seen < MAX_DEPTH:
        user = pending.pop()
        seen += 1
        value = meta_of(user)
        if isinstance(value, torch.Tensor) and tuple(value.shape) == shape:
            return True
        if user.op == "call_function" and classify(user)[0] == "reshape":
            pending.extend(user.users)
    return False


def _indexed_over(source: torch.fx.Node, dims: list[int]) -> tuple | None:
    """``(x, k, idx)`` when ``source`` is indexing ``x[idx]`` (:func:`~.gathers.indexing`) read only
    by the reduction and every reduced dim is a dim of the index: each piece is then ``x`` indexed by
    a slice of ``idx``, which a kernel reads with an indirect load."""
    found = indexing(source)
    if found is None or len(source.users) != 1 or source.target is not aten.index.Tensor:
        return None
    _, k, idx = found
    if not all(k <= d < k + meta_of(idx).dim() for d in dims):
        return None
    return found


def _index_block(node: torch.fx.Node, indexed: tuple, dims: list[int], keepdim: bool) -> tuple:
    """``(node to replace, index shape)`` of an unrolled reduction over index dims: each piece
    indexes with a slice of the index reshaped to the index block of the result, or of the one
    view that reads the result when that view only reshapes the block (``sum(1)`` of
    ``y[order.view(t, k)]`` then viewed ``[b, s, hidden]``: the pieces are made in that shape,
    so the work after the view joins their kernel)."""
    x, k, idx = indexed
    shape = list(meta_of(idx).shape)
    block = [1 if d + k in dims else s for d, s in enumerate(shape)] if keepdim else \
        [s for d, s in enumerate(shape) if d + k not in dims]
    value = meta_of(x)
    if len(node.users) == 1:
        view = next(iter(node.users))
        out = meta_of(view)
        if view.op == "call_function" and view.target in VIEWS and isinstance(out, torch.Tensor) \
                and static_sizes(out.shape):
            width = out.dim() - (value.dim() - 1)
            if width >= 1 and list(out.shape[:k]) == list(value.shape[:k]) \
                    and list(out.shape[k + width:]) == list(value.shape[k + 1:]) \
                    and math.prod(out.shape[k:k + width]) == math.prod(block):
                return view, list(out.shape[k:k + width])
    return node, block


def _read_from_memory(node: torch.fx.Node) -> bool:
    """A placeholder or an extern result, through views: no elementwise work for slices to move up
    through."""
    while node.op == "call_function" and classify(node)[0] == "reshape":
        node = node.args[0]
    return node.op == "placeholder" or (node.op == "call_function" and classify(node)[0] is None)


def _fusable(node: torch.fx.Node) -> bool:
    """Whether ``node`` can join a kernel (a view, when something it feeds can)."""
    if node.op != "call_function":
        return False
    kind = classify(node)[0]
    if kind == "reshape":
        return any(_fusable(user) for user in node.users)
    return kind is not None


def _feeds_only(source: torch.fx.Node, reduction: torch.fx.Node, dims: list[int], rank: int) -> bool:
    """True when ``source`` is read from memory by a kernel, or is elementwise work whose operands
    that vary along ``dims`` qualify the same way and which feeds nothing but this reduction."""
    seen = 0
    pending = [(source, reduction)]
    while pending:
        node, reader = pending.pop()
        kind = classify(node)[0] if node.op == "call_function" else None
        if node.op not in ("placeholder", "call_function") or not isinstance(meta_of(node), torch.Tensor):
            return False                       # a constant attribute: no example value to slice
        if kind is None:
            continue                           # placeholder or extern result: a kernel input
        if kind == "reshape":                  # a view of a kernel input is read through its layout
            pending.append((node.args[0], None))
            continue
        if kind != "pointwise" or packet_name(node.target) in SOURCES or reader is None:
            return False
        seen += 1
        if seen > MAX_DEPTH or set(node.users) != {reader}:
            return False
        for arg in node.all_input_nodes:
            value = meta_of(arg)
            if not isinstance(value, torch.Tensor):
                return False
            offset = rank - value.dim()
            if all(d - offset < 0 or value.shape[d - offset] == 1 for d in dims):
                continue                       # broadcast along every reduced axis: read whole
            pending.append((arg, node))
    return True


def _unrolled(graph: torch.fx.Graph, kind: str, source: torch.fx.Node, dims: list[int], keepdim: bool,
              out_dtype: torch.dtype, indexed: tuple | None = None, block: list | None = None) -> torch.fx.Node:
    """The reduction as a chain of elementwise combines of the size-1 slices of ``source`` (of an
    indexed ``source``: of ``x`` indexed by slices of the index reshaped to ``block``, already in
    the result's shape)."""
    value = meta_of(source)
    accumulate = out_dtype
    if kind in ("sum", "mean") and out_dtype in (torch.float16, torch.bfloat16):
        accumulate = torch.float32
    total = None
    for point in itertools.product(*(range(value.shape[d]) for d in dims)):
        if indexed is not None:         # x indexed by the index's slice: a gather of its own
            x, k, piece = indexed
            for d, i in zip(dims, point):
                piece = call_with_value(graph, aten.slice.Tensor, (piece, d - k, i, i + 1))
            piece = call_with_value(graph, aten.reshape.default, (piece, block))
            piece = call_with_value(graph, aten.index.Tensor, (x, [None] * k + [piece]))
        else:
            piece = source
            for d, i in zip(dims, point):
                piece = call_with_value(graph, aten.slice.Tensor, (piece, d, i, i + 1))
        if meta_of(piece).dtype != accumulate:
            piece = call_with_value(graph, aten._to_copy.default, (piece,), {"dtype": accumulate})
        total = piece if total is None else call_with_value(graph, _COMBINE[kind], (total, piece))
    if kind == "mean":
        count = math.prod(value.shape[d] for d in dims)
        total = call_with_value(graph, aten.div.Tensor, (total, count))
    if meta_of(total).dtype != out_dtype:
        total = call_with_value(graph, aten._to_copy.default, (total,), {"dtype": out_dtype})
    if not keepdim and indexed is None:
        total = call_with_value(graph, aten.squeeze.dims, (total, dims))
    return total


__all__ = ["unroll_reductions"]
