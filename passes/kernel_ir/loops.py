"""Loop-level analysis of a :class:`FusedGroup`, shared by the code generation backends.

It answers, for static shapes (or symbolic ones read as :class:`~.symbolic.Dim` values): which domain axes the kernel loops over (after merging axes that
every access walks contiguously), the level and pass of every node (multi-pass row kernels for
softmax-like groups), and how each input and output is addressed (one stride per loop axis, 0 for
broadcast axes; an output pad, see :data:`passes.kernel_ir.groups.PAD`, by the padded buffer's strides
over the unpadded domain). Backends turn this into C++ or Triton without redoing shape reasoning.
"""
from __future__ import annotations

import attrs
import torch
import torch.fx

from pipeline import compat

from .nodes import gather_view, input_gather, input_padding, known_sizes, shape_of, strides_of
from .symbolic import Decisions, active, has_dims, sizes
from .groups import (REDUCTIONS, UNIT_RESHAPES, FusedGroup, broadcasts_to, end_padding, group_levels, iota_of,
                    meta_of, outer_axis_map, packet_name)


class UnsupportedGroup(Exception):
    """The group cannot be generated as a kernel (it then runs eagerly, with this reason)."""


@attrs.frozen
class Access:
    """How one tensor is addressed: element strides per loop axis (0 = broadcast). A padded input
    (:func:`~.nodes.input_padding`) is read at ``shift`` elements from there, only where every
    ``(loop axis, lo, hi)`` of ``bounds`` holds ``lo <= i<axis> < hi``; elsewhere it is ``fill``.
    A gathered input (:func:`~.nodes.input_gather`) is read ``index * gather`` elements further,
    the index being the gather node's operand."""

    strides: tuple[int, ...]
    shift: int = 0
    bounds: tuple[tuple[int, int, int], ...] = ()
    fill: int | float | bool = 0
    gather: int | None = None   # stride of the dim a gather's index value addresses


@attrs.frozen
class Ramp:
    """An index ramp's value at a loop point: ``start + step * i<axis>``, or ``start`` when
    ``axis`` is None (a ramp of one element)."""

    start: int
    step: int
    axis: int | None


@attrs.define(eq=False)
class LoopNest:
    """The loops of one kernel and what happens at each node."""

    group: FusedGroup
    sizes: tuple[int, ...]                      # loop axes after merging
    reduced: tuple[int, ...]                    # which loop axes are reduced
    nodes: list[torch.fx.Node]                  # compute nodes in order
    level: dict                                 # node -> 'full' | 'outer'
    pass_of: dict                               # full node -> pass; reduction/outer node -> pass it is available at
    loads: dict                                 # (placeholder, level) -> Access
    outputs: list[tuple[torch.fx.Node, Access]]
    passes: int
    ramps: dict = attrs.field(factory=dict)     # index-ramp node -> Ramp (computed, never loaded)
    # With symbolic sizes (Dim values in sizes and strides): the decisions taken about them, which
    # the kernel's size class is made of (passes/kernel_ir/symbolic.py); None for static sizes.
    decisions: Decisions | None = None

    @property
    def outer_axes(self) -> list[int]:
        """Indices of the loop axes that are not reduced, in loop order."""
        return [a for a in range(len(self.sizes)) if a not in self.reduced]


def _strides_for(shape: tuple, strides: tuple, consumer_shape: tuple | None, domain: tuple,
                 reduced: tuple, lined_up: bool = False) -> list[int]:
    """Element strides over the domain axes of a tensor (shape, strides) read with eager
    broadcasting by a consumer: right-aligned to the domain for full-level consumers, or to the
    consumer's reduced shape (``consumer_shape``) for outer-level consumers. ``lined_up``: each
    size but 1 must equal the size it lines up with for every value of the symbols (an input, not
    a padded read or output), not only at the sizes the graph was captured with."""
    rank = len(domain)
    out = [0] * rank
    if consumer_shape is None:
        axis_of = list(range(rank))
        target_rank = rank
    else:
        axis_of = outer_axis_map(consumer_shape, domain, reduced)
        if axis_of is None and not reduced and tuple(consumer_shape) == tuple(domain):
            axis_of = list(range(rank))     # a reduction over no axis (a 0-d input): outer is full
        if axis_of is None:
            raise UnsupportedGroup(f"{consumer_shape} is not a reduced shape of {domain}")
        target_rank = len(consumer_shape)
    offset = target_rank - len(shape)
    if offset < 0:
        raise UnsupportedGroup(f"cannot broadcast {shape} to rank {target_rank}")
    target = tuple(domain) if consumer_shape is None else tuple(consumer_shape)
    for k, size in enumerate(shape):
        axis = axis_of[k + offset]
        if size != 1 and axis is not None:
            if lined_up and not compat.known_equal(size, target[k + offset]):
                raise UnsupportedGroup(f"an input of shape {tuple(shape)} does not line up with {target}")
            out[axis] = strides[k]
    return out


def analyze(group: FusedGroup) -> LoopNest:
    """Loop structure of ``group``. Symbolic sizes are analyzed as :class:`~.symbolic.Dim` values
    inside a :func:`~.symbolic.binding` (the nest then records the decisions it took about them,
    ``LoopNest.decisions``); outside one they raise :class:`UnsupportedGroup`."""
    graph = group.subgraph.graph
    domain = sizes(group.domain)
    reduced = tuple(group.reduced)
    if not known_sizes(domain):
        raise UnsupportedGroup(f"dynamic domain {domain}")
    nodes = [n for n in graph.nodes if n.op == "call_function"]
    output_node = next(n for n in graph.nodes if n.op == "output")
    level, why = group_levels(nodes, domain, reduced)
    if level is None:
        raise UnsupportedGroup(why)
    ramp_axes = {}
    for node in list(nodes):
        axis = _ramp_domain_axis(node, level[node], domain, reduced)
        if axis is False:
            if node in output_node.args[0]:
                raise UnsupportedGroup(f"index ramp {node.name} does not line up with the domain")
            nodes.remove(node)      # only reshapes of itself read it; they compute their own value
        elif iota_of(node) is not None:
            ramp_axes[node] = axis
    pass_of: dict = {}
    for node in nodes:
        deps = [pass_of[a] for a in node.all_input_nodes if a in pass_of]
        if packet_name(node.target) in REDUCTIONS:
            pass_of[node] = (max(deps) if deps else 0) + 1
        else:
            pass_of[node] = max(deps) if deps else 0
    passes = max([pass_of[n] for n in nodes if level[n] == "full"] + [0]) + 1
    raw_loads: dict = {}
    padded: dict = {}       # (placeholder, pad node) -> (shift, [(domain axis, lo, hi)], fill)
    gathered: dict = {}     # (placeholder, gather node) -> stride of the gathered dim
    members = set(nodes)
    for node in nodes:
        reads_full = packet_name(node.target) in REDUCTIONS or level[node] == "full"
        consumer_shape = None if reads_full else shape_of(node)
        for arg in node.all_input_nodes:
            if arg.op != "placeholder":
                continue
            value = meta_of(arg)
            if not isinstance(value, torch.Tensor):
                raise UnsupportedGroup(f"input {arg.name} is not a tensor")
            # A unit reshape of an input (fuse moves reshapes of kernel inputs into the group) reads
            # the input through the reshape's layout: a view of the same storage at the same offset;
            # through a chain of them, the last one's (the others only pass the value on).
            view = _last_reshape(node, members) if packet_name(node.target) in UNIT_RESHAPES else arg
            if view is not node and not reads_full:
                consumer_shape = shape_of(view)
            shape, strides = shape_of(view), strides_of(view)
            gather = input_gather(node) if arg is node.args[0] else None
            if gather is not None:
                shape, strides = gather_view(node)
                gathered[(arg, node)] = gather[1]
            if not (known_sizes(shape) and known_sizes(strides)):
                raise UnsupportedGroup(f"input {arg.name} has dynamic shape or strides")
            padding = input_padding(node)
            raw_loads[(arg, node)] = _strides_for(shape, strides, consumer_shape, domain, reduced,
                                                  lined_up=padding is None)
            if padding is not None:
                padded[(arg, node)] = _padded_read(padding, shape, raw_loads[(arg, node)], domain)
    raw_outputs = []
    for out in output_node.args[0]:
        shape, strides = shape_of(out), strides_of(out)
        if not (known_sizes(shape) and known_sizes(strides)):
            raise UnsupportedGroup(f"output {out.name} has dynamic shape or strides")
        consumer_shape = None if level[out] == "full" else shape
        if level[out] == "full" and shape != domain and end_padding(out) is None:
            raise UnsupportedGroup(f"output {out.name} is broadcast to the domain; it would be written repeatedly")
        raw_outputs.append((out, _strides_for(shape, strides, consumer_shape, domain, reduced)))
    pinned = {a for a in ramp_axes.values() if a is not None}
    pinned |= {axis for _, bounds, _ in padded.values() for axis, _, _ in bounds}
    elementwise = not reduced and not any(packet_name(n.target) in REDUCTIONS for n in nodes)
    if reduced:
        order = _reduced_memory_order(list(raw_loads.values()), reduced, len(domain))
    else:
        order = _memory_order(raw_outputs[0][1]) if elementwise and raw_outputs else None
    loop_sizes, red, loads, outputs, origin = _merge_axes(list(domain), reduced, raw_loads, raw_outputs, pinned,
                                                          order)
    ramps = {}
    for node, axis in ramp_axes.items():
        ramp = iota_of(node)
        ramps[node] = Ramp(ramp.start, ramp.step, None if axis is None else origin.index(axis))
    accesses = {k: Access(tuple(v), gather=gathered.get(k)) for k, v in loads.items()}
    for key, (shift, bounds, fill) in padded.items():
        if any(axis not in origin for axis, _, _ in bounds):
            raise UnsupportedGroup(f"{key[1].name} pads an axis of size 1")
        accesses[key] = Access(tuple(loads[key]), shift, tuple((origin.index(a), lo, hi) for a, lo, hi in bounds), fill)
    return LoopNest(group=group, sizes=tuple(loop_sizes), reduced=tuple(red), nodes=nodes, level=level,
                    pass_of=pass_of, loads=accesses,
                    outputs=[(n, Access(tuple(s))) for n, s in outputs], passes=passes, ramps=ramps,
                    decisions=active() if has_dims((loop_sizes, list(loads.values()), outputs)) else None)


def _last_reshape(node: torch.fx.Node, members: set) -> torch.fx.Node:
    """The last of the chain of unit reshapes in ``members`` that starts at ``node``, each the only
    reader of the one before (``unsqueeze(unsqueeze(mask, 1), 2)``: read as the second's layout,
    since the first's ``[b, 1, t]`` would line up with the domain's trailing axes wrongly)."""
    while len(node.users) == 1:
        user = next(iter(node.users))
        if user not in members or packet_name(user.target) not in UNIT_RESHAPES or user.args[0] is not node:
            break
        node = user
    return node


def _padded_read(padding: tuple, shape: tuple, strides: list, domain: tuple) -> tuple[int, list, object]:
    """``(shift, [(domain axis, lo, hi)], fill)`` of an input of ``shape`` read through the pad
    ``padding`` (:func:`~.nodes.input_padding`), with ``strides`` its element strides over the
    domain: element ``i`` along a padded dim is the source's ``i - before``."""
    regions, fill = padding
    offset = len(domain) - len(shape)
    shift, bounds = 0, []
    for dim, before, size in regions:
        axis = offset + dim
        shift -= before * strides[axis]
        bounds.append((axis, before, before + size))
    return shift, bounds, fill


def _ramp_domain_axis(node: torch.fx.Node, level: str, domain: tuple, reduced: tuple):
    """The domain axis an index ramp's value runs along at ``level``: None for a one-element ramp
    (or a node that is no ramp), False for a full-level ramp whose shape does not broadcast to the
    domain (only reshapes of itself may read it)."""
    ramp = iota_of(node)
    if ramp is None or ramp.axis is None:
        return None
    shape = shape_of(node)
    if level == "outer":
        return outer_axis_map(shape, domain, reduced)[ramp.axis]
    if not broadcasts_to(shape, domain):
        return False
    return len(domain) - len(shape) + ramp.axis


def _memory_order(strides: list) -> list[int] | None:
    """The domain axes of an elementwise kernel in its first output's memory order, outermost
    first (a channels-last output loops over channels innermost, so both backends store it
    contiguously); None when that is the domain's own order or a stride is symbolic."""
    if not all(type(s) is int for s in strides):
        return None
    order = sorted(range(len(strides)), key=lambda axis: -strides[axis])
    return None if order == sorted(order) else order


def _reduced_memory_order(loads: list, reduced: tuple, rank: int) -> list[int] | None:
    """The domain axes with the reduced ones in the memory order of the first input that reads
    them all (largest stride first, so the innermost reduced loop walks the smallest stride: a group
    norm of a channels-last image reduces channels innermost, not pixels a row apart), the outer
    axes where they are; None when that is the domain's own order or a stride is symbolic."""
    for strides in loads:
        if not all(type(strides[a]) is int for a in reduced) or not all(strides[a] for a in reduced):
            continue
        ranked = sorted(reduced, key=lambda a: -strides[a])
        if ranked == sorted(reduced):
            return None
        slots = iter(ranked)
        return [next(slots) if a in reduced else a for a in range(rank)]
    return None


def _merge_axes(sizes: list[int], reduced: tuple, loads: dict, outputs: list, pinned: set = frozenset(),
                order: list[int] | None = None):
    """Merge neighbouring axes of the same kind that every access walks as one (contiguously),
    except the ``pinned`` domain axes (an index ramp runs along them, so they keep their own loop
    index), after putting the axes in ``order`` (domain axes, outermost first) when given. Also
    returns, per loop axis, the domain axis it starts at."""
    red = set(reduced)
    origin = list(range(len(sizes)))
    accesses = list(loads.values()) + [s for _, s in outputs]
    if order is not None:
        sizes[:] = [sizes[i] for i in order]
        origin = list(order)
        for acc in accesses:
            acc[:] = [acc[i] for i in order]
    axis = len(sizes) - 2
    while axis >= 0:
        a, b = axis, axis + 1
        same_kind = (a in red) == (b in red)
        free = origin[a] not in pinned and origin[b] not in pinned
        if same_kind and free and all(acc[a] == acc[b] * sizes[b] for acc in accesses):
            sizes[a] = sizes[a] * sizes[b]
            del sizes[b]
            del origin[b]
            for acc in accesses:
                acc[a] = acc[b]
                del acc[b]
            red = {x - 1 if x > b else x for x in red if x != b}
        axis -= 1
    # Drop size-1 axes: they never change an address.
    keep = [i for i, s in enumerate(sizes) if s != 1]
    if len(keep) != len(sizes):
        remap = {old: new for new, old in enumerate(keep)}
        sizes = [sizes[i] for i in keep]
        origin = [origin[i] for i in keep]
        red = {remap[x] for x in red if x in remap}
        for acc in accesses:
            acc[:] = [acc[i] for i in keep]
    return sizes, tuple(sorted(red)), loads, outputs, origin


__all__ = ["analyze", "LoopNest", "Access", "UnsupportedGroup", "UNIT_RESHAPES"]


def closure(roots: list, full_nodes: list, stop: frozenset = frozenset()) -> list:
    """Full-level nodes of a nest needed to compute ``roots``, in graph order (not looking past the
    nodes in ``stop``, whose values a backend already holds). Both backends plan their passes
    over a reduction's row with it."""
    full = set(full_nodes)
    needed: set = set()
    stack = [r for r in roots if r in full]
    while stack:
        node = stack.pop()
        if node in needed:
            continue
        needed.add(node)
        if node not in stop:
            stack.extend(a for a in node.all_input_nodes if a in full)
    return [n for n in full_nodes if n in needed]
