"""Pooling windows as elementwise work on shifted slices, and slices moved inside pads.

``max_pool2d_with_indices`` (when nothing reads the indices, as in inference) and ``avg_pool2d``
are ATen kernels of their own: the tensor before them is written by one kernel and read by the
pool. A window of ``kh x kw`` elements is also ``kh * kw`` strided slices of the (padded) input,
combined elementwise: ``maximum`` for a max pool (``-inf`` padding, which no window consists of
alone; NaN propagates as ATen's pool propagates it), a sum divided by the window size for an
average pool (without padding, or counting it, or by a given divisor). The pool then joins the kernel that
reads its result, and the kernel reads its input through the slices' strides.

The slices are of a ``constant_pad_nd``: :func:`slices_through_pads` rewrites ``slice(pad(x))``
as ``pad(slice(x))`` (the slice's start, end and step moved onto the source, the padding it keeps
counted again), so the kernel reads ``x`` itself with a masked, shifted, strided load per window
element, and the padded tensor never exists.
"""
from __future__ import annotations

import math
import operator

import torch
import torch.fx

from passes.kernel_ir.groups import meta_of
from passes.kernel_ir.nodes import input_padding

from .views import call_with_value, rewrite_in_rounds

aten = torch.ops.aten
SLICE = aten.slice.Tensor


def window_pools(graph: torch.fx.GraphModule, max_window: int) -> int:
    """Rewrite max and average pools of at most ``max_window`` elements per window as elementwise
    work on slices; returns how many were rewritten."""
    rewritten = 0
    for node in list(graph.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten.max_pool2d_with_indices.default:
            rewritten += _max_pool(graph.graph, node, max_window)
        elif node.target is aten.avg_pool2d.default:
            rewritten += _avg_pool(graph.graph, node, max_window)
    if rewritten:
        graph.graph.eliminate_dead_code()
        graph.recompile()
    return rewritten


def _pair(value, default=None) -> tuple[int, int] | None:
    if value is None or value == []:
        return default
    value = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(value) == 1:
        value = value * 2
    return (value[0], value[1]) if len(value) == 2 and all(type(v) is int for v in value) else None


def _window(node: torch.fx.Node, kernel, stride, padding, dilation, max_window: int):
    """``(kernel, stride, padding, dilation, output sizes)`` of a 2-D pool over a floating tensor of
    static sizes, or None."""
    source, out = meta_of(node.args[0]), meta_of(node)
    out = out[0] if isinstance(out, (tuple, list)) else out
    if not (isinstance(source, torch.Tensor) and source.dtype.is_floating_point and source.dim() in (3, 4)):
        return None
    if not all(type(s) is int for s in (*source.shape, *out.shape)):
        return None
    kernel = _pair(kernel)
    stride = _pair(stride, kernel)
    padding, dilation = _pair(padding, (0, 0)), _pair(dilation, (1, 1))
    if None in (kernel, stride, padding, dilation) or kernel[0] * kernel[1] > max_window:
        return None
    return kernel, stride, padding, dilation, tuple(out.shape[-2:])


def _slices(graph: torch.fx.Graph, source: torch.fx.Node, window, fill: float) -> list[torch.fx.Node]:
    """The ``kh * kw`` strided slices of ``source`` (padded with ``fill``) whose combination is the
    pool: slice ``(i, j)`` holds each window's element ``(i, j)``."""
    kernel, stride, padding, dilation, (oh, ow) = window
    value = meta_of(source)
    height, width = value.shape[-2:]
    need = [(o - 1) * s + (k - 1) * d + 1 for o, s, k, d in zip((oh, ow), stride, kernel, dilation)]
    extra = [max(0, n - (size + 2 * p)) for n, size, p in zip(need, (height, width), padding)]
    padded = source
    if any(padding) or any(extra):
        pads = [padding[1], padding[1] + extra[1], padding[0], padding[0] + extra[0]]
        padded = call_with_value(graph, aten.constant_pad_nd.default, (source, pads, fill))
    rank = value.dim()
    pieces = []
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            rows = call_with_value(graph, SLICE, (padded, rank - 2, i * dilation[0],
                                                  i * dilation[0] + (oh - 1) * stride[0] + 1, stride[0]))
            pieces.append(call_with_value(graph, SLICE, (rows, rank - 1, j * dilation[1],
                                                         j * dilation[1] + (ow - 1) * stride[1] + 1, stride[1])))
    return pieces


def _max_pool(graph: torch.fx.Graph, node: torch.fx.Node, max_window: int) -> int:
    users = list(node.users)
    if not all(u.op == "call_function" and u.target is operator.getitem for u in users) \
            or any(u.args[1] != 0 for u in users):
        return 0                        # the indices are read (a backward): ATen's pool makes them
    args = list(node.args) + [None] * (6 - len(node.args))
    window = _window(node, args[1], args[2], args[3], args[4], max_window)
    if window is None:
        return 0
    with graph.inserting_before(node):
        pieces = _slices(graph, node.args[0], window, -math.inf)
        result = pieces[0]
        for piece in pieces[1:]:
            result = call_with_value(graph, aten.maximum.default, (result, piece))
    for user in users:
        user.replace_all_uses_with(result)
        graph.erase_node(user)
    graph.erase_node(node)
    return 1


def _avg_pool(graph: torch.fx.Graph, node: torch.fx.Node, max_window: int) -> int:
    args = list(node.args) + [None] * (7 - len(node.args))
    kernel, stride, padding, ceil_mode, count_include_pad, divisor = args[1:7]
    count_include_pad = True if count_include_pad is None else count_include_pad
    window = _window(node, kernel, stride, padding, None, max_window)
    if window is None or ceil_mode or (any(window[2]) and not count_include_pad and divisor is None):
        return 0                        # windows of differing sizes: ATen counts each one's elements
    area = divisor if divisor is not None else window[0][0] * window[0][1]
    with graph.inserting_before(node):
        pieces = _slices(graph, node.args[0], window, 0.0)
        total = pieces[0]
        for piece in pieces[1:]:
            total = call_with_value(graph, aten.add.Tensor, (total, piece))
        result = call_with_value(graph, aten.div.Tensor, (total, float(area)))
    node.replace_all_uses_with(result)
    graph.erase_node(node)
    return 1


def slices_through_pads(graph: torch.fx.GraphModule) -> int:
    """``slice(constant_pad_nd(x))`` -> ``constant_pad_nd(slice(x))`` (static sizes, positive
    step): the slice then reads ``x`` and the pad keeps only the padding the slice keeps. Returns
    how many slices moved."""
    return rewrite_in_rounds(graph, (_slice_through_pad,))


def _slice_through_pad(graph: torch.fx.Graph, node: torch.fx.Node) -> int:
    if node.op != "call_function" or node.target is not SLICE:
        return 0
    pad = node.args[0]
    if not isinstance(pad, torch.fx.Node) or input_padding(pad) is None:
        return 0
    source, padded = meta_of(pad.args[0]), meta_of(pad)
    args = list(node.args) + [None] * (5 - len(node.args))
    dim, start, end, step = args[1] if args[1] is not None else 0, args[2], args[3], args[4] or 1
    dim = dim % padded.dim()
    size = padded.shape[dim]
    start = 0 if start is None else start
    end = size if end is None else end
    if not all(type(v) is int for v in (start, end, step, size)) or step < 1:
        return 0
    start, end = (max(0, min(size, v + size if v < 0 else v)) for v in (start, end))
    length = max(0, -(-(end - start) // step))
    widths = list(pad.args[1])
    k = padded.dim() - 1 - dim                  # this dim's place in the pad list
    before, after = (widths[2 * k], widths[2 * k + 1]) if 2 * k + 1 < len(widths) else (0, 0)
    n = source.shape[dim]
    first = max(0, -(-(before - start) // step))                 # first output element inside x
    last = min(length - 1, (before + n - 1 - start) // step)     # last one
    if length == 0 or first > last:
        return 0                                                # all padding: leave it
    inner_start = start + step * first - before
    inner = list(widths)
    while len(inner) < 2 * (k + 1):
        inner += [0, 0]
    inner[2 * k], inner[2 * k + 1] = first, length - 1 - last
    value = pad.args[2] if len(pad.args) > 2 else pad.kwargs.get("value", 0)
    with graph.inserting_before(node):
        moved = call_with_value(graph, SLICE, (pad.args[0], dim, inner_start,
                                               inner_start + step * (last - first) + 1, step))
        if any(inner):
            moved = call_with_value(graph, aten.constant_pad_nd.default, (moved, inner, value))
    node.replace_all_uses_with(moved)
    graph.erase_node(node)
    return 1


__all__ = ["slices_through_pads", "window_pools"]
