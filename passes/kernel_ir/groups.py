"""The fused-group description shared by the ``fuse`` pass and every ``codegen`` backend.

After ``fuse``, each group of ATen nodes is one graph node calling a :class:`FusedGroup`: callable,
it runs its subgraph eagerly (so the graph stays executable and verifiable); backends read the same
object to generate a kernel. A group iterates over one *domain* shape ``S``. Pointwise groups have no
reduced axes. Reduction groups reduce the axes ``reduced`` of ``S``; their nodes live at one of two
levels: *full* (shape ``S``) or *outer* (the reduced shape, with or without kept size-1 axes).
"""
from __future__ import annotations

import math
from typing import Any, Callable, ClassVar

import attrs
import torch
import torch.fx

from . import rules
from .symbolic import parse, size_data
# Node facts live in .nodes; they are re-exported here, where plugins have always read them.
from .nodes import (CONSTANTS, FLOAT_TYPES, GATHER, IOTAS, PAD, REDUCTIONS, SOURCES, UNIT_RESHAPES,  # noqa: F401
                    input_gather, input_padding, meta_of, packet_name, promoted_dtype, shape_of, value_dtype)

aten = torch.ops.aten
prims = torch.ops.prims


def __getattr__(name: str) -> Any:
    """``POINTWISE``: the pointwise operators the backends implement, by overload packet name
    ("aten.add"): those with a rule in :mod:`passes.kernel_ir.rules` (computed when read, so it
    includes the rules a plugin added)."""
    if name == "POINTWISE":
        return frozenset(rules.RULES)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def end_padding(node: torch.fx.Node) -> tuple[list[tuple[int, int, int]], Any] | None:
    """``([(dim, start, length), ...], value)`` when ``node`` is a ``constant_pad_nd`` that pads
    trailing dims at their end only (never before, never negative), else None."""
    if node.op != "call_function" or packet_name(node.target) != PAD:
        return None
    source = meta_of(node.args[0])
    pad, value = _pad_arguments(node)
    if not isinstance(source, torch.Tensor) or len(pad) % 2 or len(pad) // 2 > source.dim():
        return None
    if not all(isinstance(p, int) for p in pad) or any(pad[0::2]) or min(pad[1::2], default=0) < 0:
        return None
    if not isinstance(value, (int, float, bool)) or not all(isinstance(d, int) for d in source.shape):
        return None     # a symbolic size: no static padded layout
    regions = [(source.dim() - 1 - k, int(source.shape[source.dim() - 1 - k]), pad[2 * k + 1])
               for k in range(len(pad) // 2) if pad[2 * k + 1]]
    return regions, value


def pads_inputs(group: "FusedGroup") -> bool:
    """True when ``group`` reads one of its inputs through a pad (:func:`~.nodes.input_padding`)."""
    return any(n.op == "call_function" and packet_name(n.target) == PAD and n.args[0].op == "placeholder"
               for n in group.subgraph.graph.nodes)


def _pad_arguments(node: torch.fx.Node) -> tuple[list, Any]:
    """``constant_pad_nd``'s pad list and fill value."""
    return list(node.args[1]), (node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0))


def output_fills(group: "FusedGroup", shapes: list) -> list[tuple[int, list, Any]]:
    """``(output index, [(dim, start, length)], value)`` for each output pad of ``group`` whose
    outputs have ``shapes`` (padded): the regions of the output buffer the kernel does not write,
    which the kernel object fills. Read from the pad's arguments alone (a group loaded from the
    compile cache carries no example values)."""
    output = next(n for n in group.subgraph.graph.nodes if n.op == "output")
    fills = []
    for k, node in enumerate(output.args[0]):
        if not (isinstance(node, torch.fx.Node) and node.op == "call_function" and packet_name(node.target) == PAD):
            continue
        pad, value = _pad_arguments(node)
        rank = len(shapes[k])
        regions = [(rank - 1 - j, shapes[k][rank - 1 - j] - pad[2 * j + 1], pad[2 * j + 1])
                   for j in range(len(pad) // 2) if pad[2 * j + 1]]
        if regions:
            fills.append((k, regions, value))
    return fills


def fill_padding(outs: tuple, fills: list) -> None:
    """Write each output pad's value into the regions its kernel leaves (see :func:`output_fills`)."""
    for k, regions, value in fills:
        for dim, start, length in regions:
            outs[k].narrow(dim, start, length).fill_(value)


def constant_value(node: torch.fx.Node) -> Any:
    """The Python scalar a fill (``aten.full``, ``aten.scalar_tensor``) holds, converted to its
    dtype as eager converts it (so backends render it exactly); None for other nodes."""
    name = packet_name(node.target) if node.op == "call_function" else None
    if name not in CONSTANTS:
        return None
    value = node.args[1] if name == "aten.full" else node.args[0]
    return torch.full((), value, dtype=meta_of(node).dtype).item()


@attrs.frozen
class Iota:
    """An index ramp: the value at an element is ``start + step * k``, ``k`` its index along
    ``axis`` of the node's own shape (``axis`` None: the ramp has one element, so it is ``start``
    everywhere)."""

    start: int
    step: int
    axis: int | None


def iota_of(node: Any) -> Iota | None:
    """The ramp a node computes: an integer ``prims.iota`` / ``aten.arange``, or a unit reshape
    (size-1 axes added or dropped, an expand, a broadcast_in_dim) of one; None for anything else.
    Reshapes keep the ramp exact because they move its one varying axis without reordering."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    value = meta_of(node)
    if not isinstance(value, torch.Tensor) or value.dtype.is_floating_point or value.dtype == torch.bool:
        return None
    name = packet_name(node.target)
    shape = shape_of(node)
    if name in IOTAS:
        if name == "prims.iota":
            start, step = node.kwargs.get("start"), node.kwargs.get("step")
        else:
            overload = node.target._overloadname
            args = list(node.args)
            if overload == "default":
                start, step = 0, 1
            elif overload == "start":
                start, step = args[0], 1
            elif overload == "start_step":
                start, step = args[0], (args[2] if len(args) > 2 else node.kwargs.get("step", 1))
            else:
                return None
        if not (type(start) is int and type(step) is int and len(shape) == 1):
            return None
        return Iota(start, step, 0 if shape[0] != 1 else None)
    if name not in UNIT_RESHAPES or not node.args:
        return None
    inner = iota_of(node.args[0])
    if inner is None or inner.axis is None:
        return inner if inner is None else Iota(inner.start, inner.step, None)
    source = shape_of(node.args[0])
    if name == "aten.expand":
        axis = len(shape) - len(source) + inner.axis
    elif name == "prims.broadcast_in_dim":
        axis = list(node.args[2])[inner.axis]
    else:
        if [s for s in source if s != 1] != [s for s in shape if s != 1]:
            return None
        rank = sum(1 for s in source[:inner.axis] if s != 1)
        axis = [k for k, s in enumerate(shape) if s != 1][rank]
    if not (0 <= axis < len(shape) and shape[axis] == source[inner.axis]):
        return None
    return Iota(inner.start, inner.step, axis)


def reduction_axes(node: torch.fx.Node) -> tuple[int, ...]:
    """Normalized reduced axes of a reduction node (all axes when none are given)."""
    src = meta_of(node.args[0])
    rank = src.dim()
    name = packet_name(node.target)
    if name in ("aten.argmax", "aten.argmin"):
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        dims = list(range(rank)) if dim is None else [dim]
    else:
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            dims = list(range(rank))
        if isinstance(dims, int):
            dims = [dims]
    return tuple(sorted({d % rank for d in dims})) if rank else ()


@attrs.define(eq=False)
class FusedGroup:
    """One fused kernel: its subgraph (placeholders = group inputs, output = tuple of group outputs),
    the domain shape it iterates and the reduced axes. Calling it runs the subgraph eagerly."""

    name: str
    subgraph: torch.fx.GraphModule
    domain: tuple
    reduced: tuple[int, ...] = ()
    reasons: list = attrs.field(factory=list)
    # Set on a copy of a group with symbolic sizes that is to be generated for the size class of
    # one binding (passes/codegen/specialize.py): a passes.kernel_ir.symbolic.Decisions.
    decisions: Any = attrs.field(default=None, repr=False)

    @property
    def kind(self) -> str:
        """``reduction`` when the group reduces axes of its domain, else ``pointwise``."""
        return "reduction" if self.reduced else "pointwise"

    def __call__(self, *args: Any) -> tuple:
        return self.subgraph(*args)

    def __repr__(self) -> str:
        ops = [packet_name(n.target) for n in self.subgraph.graph.nodes if n.op == "call_function"]
        return f"<FusedGroup {self.name} {self.kind} domain={list(self.domain)} reduced={list(self.reduced)} ops={ops}>"

    @property
    def __name__(self) -> str:  # FX prints call targets by name
        return self.name

    portable: ClassVar[bool] = True   # its data needs no files or shared texts (pipeline.cache.graph_io)

    def to_data(self, codec: Any) -> dict:
        """The group as plain data: name, domain (symbolic sizes as expressions), reduced axes and
        its subgraph (without example values)."""
        return {"name": self.name, "domain": [size_data(d) for d in self.domain], "reduced": list(self.reduced),
                **codec.subgraph_to_data(self.subgraph, self.name)}

    @classmethod
    def from_data(cls, data: dict, codec: Any) -> "FusedGroup":
        """The group :meth:`to_data` described (a symbolic size comes back as a sympy expression)."""
        return cls(data["name"], codec.subgraph_from_data(data), tuple(parse(d) for d in data["domain"]),
                   tuple(data["reduced"]))

    def outer_shape(self) -> tuple:
        """The domain without its reduced axes (the shape of a reduced value, kept axes dropped)."""
        return tuple(s for i, s in enumerate(self.domain) if i not in self.reduced)


def outer_axis_map(shape: tuple, domain: tuple, reduced: tuple[int, ...]) -> list | None:
    """For a value of the reduced ("outer") shape, the domain axis behind each of its axes (None
    for a kept size-1 reduced axis); None when ``shape`` is not an outer shape."""
    shape, domain = tuple(shape), tuple(domain)
    if not reduced:
        return None
    outer = [d for d in range(len(domain)) if d not in reduced]
    if shape == tuple(domain[d] for d in outer):
        return outer
    if len(shape) == len(domain) and all(
            (shape[d] == 1) if d in reduced else (shape[d] == domain[d]) for d in range(len(domain))):
        return [None if d in reduced else d for d in range(len(domain))]
    return None


def level_of(shape: tuple, group_domain: tuple, reduced: tuple[int, ...]) -> str | None:
    """'outer' for a reduced shape, 'full' for the domain or a shape that broadcasts to it, else None
    (shape alone; :func:`node_level` also uses where a value comes from)."""
    if outer_axis_map(shape, group_domain, reduced) is not None:
        return "outer"
    if broadcasts_to(shape, group_domain):
        return "full"
    return None


def node_level(node: torch.fx.Node, levels: dict, domain: tuple, reduced: tuple[int, ...]) -> tuple[str | None, str]:
    """The level of ``node`` inside a group whose other nodes have ``levels``, or (None, reason).

    A node reading a full value is full; a node reading only outer values (or none) is outer when
    its shape is a reduced shape; otherwise it is full, recomputed per domain element. A full node
    may read an outer value only where eager broadcasting lines the value up with the kept axes.
    """
    shape = shape_of(node)
    if packet_name(node.target) == PAD:
        source = node.args[0]
        if source not in levels:
            return _input_pad_level(node, shape, domain, reduced)
        if end_padding(node) is None or levels.get(source) != "full" or shape_of(source) != tuple(domain):
            return None, "pads something other than a full-domain value of the group at its end"
        return "full", ""
    if packet_name(node.target) == GATHER:
        return _gather_level(node, shape, levels, domain)
    if iota_of(node) is not None and outer_axis_map(shape, domain, reduced) is None:
        # A ramp is computed from the loop indices, never loaded: any shape can live in the
        # group (a ramp that does not line up with the domain only feeds reshapes of itself,
        # which compute their own value; see passes.kernel_ir.loops).
        return "full", ""
    if packet_name(node.target) in REDUCTIONS:
        source = node.args[0]
        if shape_of(source) != tuple(domain) or reduction_axes(node) != tuple(reduced):
            return None, "reduces other axes or another shape than the group"
        if levels.get(source, "full") != "full":
            return None, f"reduces {source.name}, which is not a full-domain value"
        return "outer", ""
    inputs = [levels[a] for a in node.all_input_nodes if a in levels]
    if "full" not in inputs and outer_axis_map(shape, domain, reduced) is not None:
        return "outer", ""
    if not broadcasts_to(shape, domain):
        return None, f"shape {shape} is neither the group's domain {tuple(domain)}, nor broadcasts to it, nor is its reduced shape"
    for arg in node.all_input_nodes:
        if levels.get(arg) == "outer" and not _lines_up(shape_of(arg), domain, reduced):
            return None, f"reads reduced value {arg.name} of shape {shape_of(arg)} broadcast along other axes"
    return "full", ""


def _input_pad_level(node: torch.fx.Node, shape: tuple, domain: tuple, reduced: tuple) -> tuple[str | None, str]:
    """The level of a pad of a group input (:func:`~.nodes.input_padding`): full, in pointwise
    groups, when it lines up with the domain along every padded dim."""
    padding = input_padding(node)
    if padding is None:
        return None, "pads an input with symbolic or negative padding"
    if reduced:
        return None, "pads an input of a reduction (only pointwise kernels read padded inputs)"
    if not broadcasts_to(shape, domain):
        return None, f"shape {shape} does not broadcast to the group's domain {tuple(domain)}"
    offset = len(domain) - len(shape)
    if any(shape[dim] != domain[offset + dim] for dim, _, _ in padding[0]):
        return None, "a padded dim is broadcast over the domain"
    return "full", ""


def _gather_level(node: torch.fx.Node, shape: tuple, levels: dict, domain: tuple) -> tuple[str | None, str]:
    """The level of a gather (:func:`~.nodes.input_gather`): full, when it gathers from a group
    input (read with an indirect load) with an index of the group's full level or from outside."""
    if input_gather(node) is None:
        return None, "gathers with symbolic sizes, a non-integer index or an index of another shape"
    if node.args[0] in levels:
        return None, f"gathers from {node.args[0].name}, which the group computes (only inputs are gathered)"
    if levels.get(node.args[2], "full") != "full":
        return None, "its index is a reduced value"
    if not broadcasts_to(shape, domain):
        return None, f"shape {shape} does not broadcast to the group's domain {tuple(domain)}"
    return "full", ""


def gathers_inputs(group: "FusedGroup") -> bool:
    """True when ``group`` reads one of its inputs through a gather (an indirect load). Read from
    the nodes alone, like :func:`pads_inputs` (a group loaded from the compile cache carries no
    example values)."""
    return any(n.op == "call_function" and packet_name(n.target) == GATHER and n.args[0].op == "placeholder"
               for n in group.subgraph.graph.nodes)


def _lines_up(shape: tuple, domain: tuple, reduced: tuple[int, ...]) -> bool:
    mapping = outer_axis_map(shape, domain, reduced)
    if mapping is None:
        return False
    offset = len(domain) - len(shape)
    return all(size == 1 or mapping[k] == k + offset for k, size in enumerate(shape))


def group_levels(nodes: list, domain: tuple, reduced: tuple[int, ...]) -> tuple[dict | None, str]:
    """Levels of all ``nodes`` (in graph order) of one group, or (None, reason of the first misfit)."""
    levels: dict = {}
    for node in nodes:
        level, why = node_level(node, levels, domain, reduced)
        if level is None:
            return None, f"{node.name}: {why}"
        levels[node] = level
    return levels, ""


def broadcasts_to(shape: tuple, target: tuple) -> bool:
    """True when a tensor of ``shape`` broadcasts to ``target`` without changing ``target``."""
    if len(shape) > len(target):
        return False
    for s, t in zip(reversed(tuple(shape)), reversed(tuple(target))):
        if s != t and s != 1:
            return False
    return True


def numel(shape: tuple) -> Any:
    """Number of elements of ``shape`` (1 for a scalar; symbolic when a size is)."""
    return math.prod(shape) if shape else 1


def output_buffers(outputs: list, inputs: tuple, donors: tuple, reuse: tuple, allocate: Callable) -> tuple:
    """A kernel's output tensors: per output ``(shape, stride, dtype)``, the buffer the host code
    handed it (``reuse[k]``, a dead tensor of that layout), else the input it donated
    (``inputs[donors[k]]``), else ``allocate(shape, stride, dtype)``."""
    outs = []
    for k, (shape, stride, dtype) in enumerate(outputs):
        if reuse and reuse[k] is not None:
            outs.append(reuse[k])
        elif donors and donors[k] >= 0:
            outs.append(inputs[donors[k]])
        else:
            outs.append(allocate(shape, stride, dtype))
    return tuple(outs)


class CompiledKernel:
    """Base of the objects ``codegen`` backends put in place of a :class:`FusedGroup`: callable
    with the group's inputs, returning the group's outputs, with readable generated source.
    The engine counts these as the graph's kernels."""

    backend: str = "?"
    #: Whether the kernel's code reads each input element only at the index it writes, so an
    #: output may take the buffer of a dying input of the same layout: calling the kernel with
    #: ``donors=(...)`` (one input index per output, -1: allocate) writes output ``k`` into
    #: ``inputs[donors[k]]``. Backends say so for their pointwise kernels, see
    #: :meth:`writes_inputs_safely`; the generated host code passes donors only where it may.
    in_place_capable: bool = False
    #: Whether the kernel's call takes ``reuse=(tensor or None, ...)``: per output, a dead buffer
    #: of exactly that output's layout to write into instead of allocating (the generated host
    #: code passes one where a tensor died before the call, see passes/codegen/buffers.py).
    accepts_reuse: bool = False
    #: A kernel generated for symbolic sizes (see :mod:`passes.kernel_ir.symbolic`): the size
    #: class it holds for; such a kernel is called through ``at(binding)``, which returns the
    #: kernel for those sizes (``size_args``: the values it passes as its size arguments).
    size_class: Any = None
    size_args: tuple = ()

    def __init__(self, group: FusedGroup, source: str):
        self.group = group
        self.source = source

    def launcher(self, kwargs: dict) -> Callable | None:
        """A function the generated host code may call in place of this kernel at one call site
        whose keyword arguments (``donors=``, ``reuse=``) are ``kwargs``: taking the inputs only,
        with the same results as ``self(*inputs, **kwargs)``, specialized to the call site so
        that less is decided per call; None where the kernel has none (it is then called as
        itself)."""
        return None

    def writes_inputs_safely(self) -> bool:
        """True when an output of this kernel may be written into one of its inputs (same shape,
        strides and dtype as the output, both covering the whole domain): a pointwise kernel of a
        backend that loads an element before storing to the same index (a padded or gathered input
        is read at other indices, so a kernel that pads or gathers one never writes into its inputs)."""
        return self.in_place_capable and self.group.kind == "pointwise" and not pads_inputs(self.group) \
            and not gathers_inputs(self.group)

    @property
    def __name__(self) -> str:
        return f"{self.backend}_{self.group.name}"

    def __repr__(self) -> str:
        return f"<{self.backend} kernel {self.group.name}>"


def count_kernels(gm: torch.fx.GraphModule) -> int:
    """Generated kernels called by a graph, including those of graphs it runs through a wrapper
    object that exposes the wrapped graph as ``wrapped_graph`` (a CUDA-graph runner)."""
    total = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if isinstance(node.target, CompiledKernel):
            total += 1
        inner = getattr(node.target, "wrapped_graph", None)
        if isinstance(inner, torch.fx.GraphModule):
            total += count_kernels(inner)
    return total


