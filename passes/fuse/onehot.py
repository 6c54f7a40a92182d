"""Sums of one-hot rows, computed in closed form (``fuse`` option ``sum_one_hots``).

``sum(where(iota == index, value, 0) * weight, dim)``, with ``index``, ``value`` and ``weight``
constant along ``dim`` and the ramp ``0, 1, ..., n-1`` along it, picks one element per line: it
is ``where(0 <= index < n, value, 0) * weight``. The backward of cross-entropy computes exactly
this (the sum of the one-hot gradient over the vocabulary, inside log-softmax's backward), and
as written its kernel spends a whole pass over every row (GPT-2: 4096 x 50257 elements) adding
zeros. The rewrite keeps eager's special values: each skipped element contributed ``0 * weight``,
so ``0 * weight`` is added once (NaN when ``weight`` is infinite or NaN, as the sum was).
"""
from __future__ import annotations

import torch
import torch.fx

from passes.kernel_ir.groups import constant_value, iota_of, meta_of, packet_name

aten = torch.ops.aten
SUMS = (aten.sum.dim_IntList,)


def sum_one_hots(graph: torch.fx.GraphModule) -> int:
    """Rewrite every sum of a one-hot row in ``graph`` (in place); returns how many. New nodes
    call :func:`picked`, which the caller's re-trace turns into ATen ops with example values."""
    done = 0
    for node in list(graph.graph.nodes):
        match = _match(node)
        if match is None:
            continue
        index, value, weight, n, dim = match
        if isinstance(value, torch.fx.Node) and constant_value(value) is not None:
            value = constant_value(value)       # a fill: its number, so the fill stays in one kernel
        keepdim = bool(node.args[2]) if len(node.args) > 2 else bool(node.kwargs.get("keepdim", False))
        out = meta_of(node)
        rows = meta_of(node.args[0])
        kept = list(rows.shape)
        kept[dim] = 1
        with graph.graph.inserting_before(node):
            new = graph.graph.call_function(picked, (index, value, weight, n, dim, keepdim, kept,
                                                     meta_of(_where_of(node)).dtype, out.dtype))
        node.replace_all_uses_with(new)
        graph.graph.erase_node(node)
        done += 1
    if done:
        graph.graph.eliminate_dead_code()
        graph.recompile()
    return done


def picked(index: torch.Tensor, value, weight, n: int, dim: int, keepdim: bool, kept: list,
           where_dtype: torch.dtype, dtype: torch.dtype) -> torch.Tensor:
    """The one element per line a one-hot sum picks (see the module docstring)."""
    valid = (index >= 0) & (index < n)
    zero = torch.full((), 0, dtype=where_dtype, device=index.device)
    if not isinstance(value, torch.Tensor):
        value = torch.full((), value, dtype=where_dtype, device=index.device)
    chosen = torch.where(valid, value.to(where_dtype), zero)
    if weight is not None:
        chosen = chosen * weight + weight * 0
    out = chosen.to(dtype).expand(kept)
    return out if keepdim else out.squeeze(dim)


def _where_of(node: torch.fx.Node) -> torch.fx.Node:
    source = node.args[0]
    return source if packet_name(source.target) == "aten.where" else next(
        a for a in source.args if isinstance(a, torch.fx.Node) and packet_name(a.target) == "aten.where")


def _match(node: torch.fx.Node):
    """(index, value, weight or None, n, dim) when ``node`` sums a one-hot row, else None."""
    if node.op != "call_function" or node.target not in SUMS or node.kwargs.get("dtype") is not None:
        return None
    source, dims = node.args[0], node.args[1]
    if not isinstance(source, torch.fx.Node) or dims is None or len(dims) != 1:
        return None
    rows = meta_of(source)
    if not isinstance(rows, torch.Tensor) or not rows.dtype.is_floating_point or rows.dim() == 0:
        return None
    dim = dims[0] % rows.dim()
    n = rows.shape[dim]
    if not isinstance(n, int) or n < 2:
        return None
    weight = None
    where = source
    if packet_name(source.target) == "aten.mul":
        a, b = source.args[0], source.args[1]
        if isinstance(a, torch.fx.Node) and packet_name(a.target) == "aten.where":
            where, weight = a, b
        elif isinstance(b, torch.fx.Node) and packet_name(b.target) == "aten.where":
            where, weight = b, a
        else:
            return None
        if not _constant_along(weight, rows, dim):
            return None
    if not (isinstance(where, torch.fx.Node) and packet_name(where.target) == "aten.where"):
        return None
    condition, value, other = where.args[0], where.args[1], where.args[2]
    if not _is_zero(other) or not _constant_along(value, rows, dim):
        return None
    if not (isinstance(condition, torch.fx.Node) and packet_name(condition.target) == "aten.eq"):
        return None
    left, right = condition.args[0], condition.args[1]
    for ramp, index in ((left, right), (right, left)):
        if _ramp_along(ramp, rows, dim, n) and isinstance(index, torch.fx.Node) \
                and _constant_along(index, rows, dim) and not meta_of(index).dtype.is_floating_point:
            return index, value, weight, n, dim
    return None


def _constant_along(operand, rows: torch.Tensor, dim: int) -> bool:
    """A scalar, or a tensor broadcasting to ``rows`` with size 1 along ``dim``."""
    if not isinstance(operand, torch.fx.Node):
        return isinstance(operand, (int, float, bool))
    value = meta_of(operand)
    if not isinstance(value, torch.Tensor) or value.dim() > rows.dim():
        return False
    offset = rows.dim() - value.dim()
    if any(s != 1 and s != r for s, r in zip(value.shape, rows.shape[offset:])):
        return False
    return dim < offset or value.shape[dim - offset] == 1


def _ramp_along(node, rows: torch.Tensor, dim: int, n: int) -> bool:
    """``0, 1, ..., n-1`` along ``dim`` of ``rows`` (broadcast over the other axes)."""
    ramp = iota_of(node)
    if ramp is None or ramp.axis is None or (ramp.start, ramp.step) != (0, 1):
        return False
    shape = tuple(meta_of(node).shape)
    offset = rows.dim() - len(shape)
    return offset >= 0 and ramp.axis + offset == dim and shape[ramp.axis] == n and all(
        s == 1 for k, s in enumerate(shape) if k != ramp.axis)


def _is_zero(operand) -> bool:
    if isinstance(operand, torch.fx.Node):
        value = constant_value(operand)
        return value is not None and value == 0
    return isinstance(operand, (int, float)) and operand == 0
