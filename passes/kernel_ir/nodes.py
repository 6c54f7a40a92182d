"""Facts about single graph nodes that the kernel IR, the operator rules and both backends share:
operator names, the op families fuse treats specially, and the dtypes torch computes values in."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx

from pipeline import compat

from .symbolic import Dim, sizes

aten = torch.ops.aten
prims = torch.ops.prims

REDUCTIONS = {"aten.sum", "prims.sum", "aten.amax", "aten.amin", "aten.argmax", "aten.argmin", "aten.prod"}


# Shape-only ops allowed inside a group when they just add or drop size-1 axes of an outer value.
UNIT_RESHAPES = {"aten.view", "aten._unsafe_view", "aten.unsqueeze", "aten.squeeze", "aten.reshape",
                 "prims.broadcast_in_dim", "aten.expand"}


FLOAT_TYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# Operators that read no tensor, computed from nothing at each element: fills (a constant) and
# index ramps (iota / arange: the element's index along one axis). Inside a kernel they cost no
# memory traffic, so e.g. a one-hot ``where(iota == index, value, fill)`` never materializes.
CONSTANTS = {"aten.full", "aten.scalar_tensor"}


IOTAS = {"prims.iota", "aten.arange"}


SOURCES = CONSTANTS | IOTAS


# An output pad: ``constant_pad_nd`` of a group's full-domain value, padding trailing dims at their
# end only (pad-mm's zero-padded matmul operands). ``fuse`` puts it in the producing group as that
# value's output: the kernel stores the value into the padded buffer's layout, and the kernel
# object fills the padding (:func:`output_fills`), so no separate pad copies the whole tensor.
PAD = "aten.constant_pad_nd"


def input_padding(node: torch.fx.Node) -> tuple[list[tuple[int, int, int]], Any] | None:
    """``([(dim, before, size), ...], value)`` when ``node`` is a ``constant_pad_nd`` with static,
    non-negative padding of a tensor whose padded dims have static sizes: along ``dim`` the
    result holds the source's ``size`` elements from ``before`` on and ``value`` elsewhere.
    A group reads such a pad of one of its inputs as a masked load at a shifted address (a
    concatenation rewritten by ``fuse`` reads its pieces so); None for anything else, and for a
    source of symbolic shape."""
    if node.op != "call_function" or packet_name(node.target) != PAD:
        return None
    source = meta_of(node.args[0])
    pad = list(node.args[1])
    value = node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0)
    if not isinstance(source, torch.Tensor) or len(pad) % 2 or len(pad) // 2 > source.dim():
        return None
    if not all(type(p) is int and p >= 0 for p in pad) or not isinstance(value, (int, float, bool)):
        return None
    if not static_sizes(source.shape):
        return None
    regions = []
    for k in range(len(pad) // 2):
        dim = source.dim() - 1 - k
        if pad[2 * k] or pad[2 * k + 1]:
            regions.append((dim, pad[2 * k], source.shape[dim]))
    return regions, value


# A gather of a kernel input: ``gather(x, dim, index)`` reads ``x`` at the index's value along ``dim``
# and at the element's own position along the other axes. Inside a kernel it is a load at an
# address computed from the index (an indirect load): the gathered rows never exist apart. ``fuse``
# writes ``x[idx]`` indexing and embeddings as such gathers (passes/fuse/gathers.py).
GATHER = "aten.gather"


def input_gather(node: torch.fx.Node) -> tuple[int, int] | None:
    """``(dim, stride)`` of ``x`` along ``dim`` when ``node`` is ``gather(x, dim, index)`` of
    a tensor ``x`` and an integer index of static shapes with the result's shape (no
    ``sparse_grad``); a group reads ``x`` at ``index * stride`` plus the element's position along
    the other axes. None for anything else."""
    if node.op != "call_function" or packet_name(node.target) != GATHER or node.kwargs.get("sparse_grad"):
        return None
    if len(node.args) != 3 or not isinstance(node.args[0], torch.fx.Node) or not isinstance(node.args[2], torch.fx.Node):
        return None
    if type(node.args[1]) is not int:
        return None
    source, index, out = meta_of(node.args[0]), meta_of(node.args[2]), meta_of(node)
    if not all(isinstance(v, torch.Tensor) for v in (source, index, out)) or source.dim() == 0:
        return None
    if index.dtype not in (torch.int32, torch.int64) or not static_sizes(tuple(source.shape) + tuple(index.shape)):
        return None
    if not static_sizes(source.stride()) or tuple(index.shape) != tuple(out.shape) or index.dim() != source.dim():
        return None
    dim = node.args[1] % source.dim()
    return dim, int(source.stride(dim))


def gather_view(node: torch.fx.Node) -> tuple[tuple, tuple]:
    """``(shape, strides)`` through which a group's gather ``node`` reads its source: the result's
    shape, the source's strides, and stride 0 along the gathered dim (the index supplies it)."""
    dim, _ = input_gather(node)
    strides = list(meta_of(node.args[0]).stride())
    strides[dim] = 0
    return tuple(meta_of(node).shape), tuple(strides)


def packet_name(target: Any) -> str:
    """``aten.add`` for ``aten.add.Tensor`` (the name tables above use)."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}"
    return compat.op_name(target)


def static_sizes(sizes: Any) -> bool:
    """True when every size in ``sizes`` is a plain int (none is symbolic)."""
    return all(isinstance(s, int) for s in sizes)


def known_sizes(sizes: Any) -> bool:
    """True when every size in ``sizes`` is an int or a :class:`~.symbolic.Dim` (a symbolic size
    read inside a binding): sizes a kernel can be generated for."""
    return all(isinstance(s, (int, Dim)) for s in sizes)


def shape_of(value: Any) -> tuple:
    """The shape of a node's example value (or of a tensor), symbolic sizes as
    :class:`~.symbolic.Dim` values inside a :func:`~.symbolic.binding`."""
    return sizes(meta_of(value).shape)


def strides_of(value: Any) -> tuple:
    """The strides of a node's example value, like :func:`shape_of`."""
    return sizes(meta_of(value).stride())


def meta_of(value: Any) -> Any:
    """The example value (fake tensor, SymInt or constant) recorded for a node or literal."""
    if isinstance(value, torch.fx.Node):
        return value.meta.get("val")
    return value


def call_with_value(graph: torch.fx.Graph, target, args: tuple, kwargs: dict | None = None) -> torch.fx.Node:
    """A new ``call_function`` node at the graph's insertion point, with its example value computed
    from its arguments' (a rewrite's later steps read the shapes of the nodes it added)."""
    node = graph.call_function(target, args, kwargs or {})
    node.meta["val"] = compat.example_value(node)
    return node


def value_dtype(value: Any) -> torch.dtype:
    """The dtype of a graph value or Python literal as torch's type promotion sees it."""
    meta = meta_of(value)
    if isinstance(meta, torch.Tensor):
        return meta.dtype
    if isinstance(meta, bool):
        return torch.bool
    if isinstance(meta, int):
        return torch.int64
    return torch.float32


def promoted_dtype(args: list) -> torch.dtype:
    """The dtype torch computes a comparison of ``args`` in (promotion of tensors and scalars)."""
    values = [torch.empty((), dtype=meta_of(a).dtype) if isinstance(meta_of(a), torch.Tensor)
              else meta_of(a) for a in args]
    result = values[0] if len(values) == 1 else torch.result_type(values[0], values[1])
    return result.dtype if isinstance(result, torch.Tensor) else result
