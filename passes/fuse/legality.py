"""What may fuse. Every rule returns None (legal) or a reason string that the report shows.
Nothing here decides what *should* fuse: that is ``choices.py``."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.fx
import torch.utils._pytree as pytree

from passes.kernel_ir import rules
from passes.kernel_ir.groups import (CONSTANTS, GATHER, IOTAS, REDUCTIONS, UNIT_RESHAPES, broadcasts_to, end_padding,
                                     group_levels, input_gather, iota_of, meta_of, packet_name, reduction_axes)

if TYPE_CHECKING:
    from .dependencies import Dependencies

_SUPPORTED_DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
                     torch.int16, torch.int32, torch.int64, torch.bool}


class Group:
    """A group being formed: its nodes in graph order, domain shape, reduced axes and device."""

    def __init__(self, gid: int, node: torch.fx.Node, domain: tuple, reduced: tuple[int, ...]):
        self.id = gid
        self.nodes = [node]
        self.members = {node}
        self.domain = domain
        self.reduced = reduced
        self.device = meta_of(node).device if isinstance(meta_of(node), torch.Tensor) else None

    def add(self, node: torch.fx.Node, reduced: tuple[int, ...]) -> None:
        self.nodes.append(node)
        self.members.add(node)
        self.reduced = reduced

    def merge(self, other: "Group", order: dict) -> None:
        """Take over ``other``'s nodes (it is emptied), keeping graph order."""
        self.nodes = sorted(self.nodes + other.nodes, key=order.__getitem__)
        self.members |= other.members
        self.reduced = self.reduced or other.reduced
        other.nodes, other.members = [], set()

    def only_used_inside(self, extra: torch.fx.Node | None = None) -> bool:
        """True when no value of the group is needed outside it (besides by ``extra``)."""
        return all(u in self.members or u is extra for n in self.nodes for u in n.users)


def classify(node: torch.fx.Node) -> tuple[str | None, str]:
    """('pointwise' | 'reduction' | 'reshape' | 'gather', '') for a fusable node, or (None, reason).
    A gather (:func:`~passes.kernel_ir.nodes.input_gather`) joins a group like pointwise work but
    is not elementwise in its source: rewrites that move work across elementwise nodes skip it."""
    if node.op != "call_function":
        return None, f"{node.op} node"
    if not isinstance(node.target, torch._ops.OpOverload):
        return None, f"{getattr(node.target, '__name__', node.target)} is not an ATen operator"
    name = packet_name(node.target)
    value = meta_of(node)
    if not isinstance(value, torch.Tensor):
        return None, f"{name} does not produce one tensor"
    if value.dtype not in _SUPPORTED_DTYPES:
        return None, f"{name} produces {value.dtype}"
    if value.device.type not in ("cpu", "cuda"):
        return None, f"{name} runs on {value.device}"
    for arg in pytree.tree_leaves((node.args, node.kwargs)):
        if isinstance(arg, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return None, f"{name} has a symbolic scalar argument"
        if isinstance(arg, torch.fx.Node) and isinstance(meta_of(arg), (torch.SymInt, torch.SymFloat)):
            return None, f"{name} takes a symbolic value from the graph"
        if isinstance(arg, torch.fx.Node) and isinstance(meta_of(arg), torch.Tensor):
            if meta_of(arg).device != value.device:
                return None, f"{name} mixes devices"
            if meta_of(arg).dtype not in _SUPPORTED_DTYPES:
                return None, f"{name} reads {meta_of(arg).dtype}"
    if name == GATHER:
        if input_gather(node) is None:
            return None, f"{name} with symbolic sizes, a non-integer index or an index of another shape"
        return "gather", ""
    if rules.pointwise(name):
        why = rules.problem(node)
        return (None, why) if why is not None else ("pointwise", "")
    if name in CONSTANTS:
        return "pointwise", ""
    if name in IOTAS:
        if iota_of(node) is None:
            return None, f"{name} that is not an integer ramp with constant start and step"
        return "pointwise", ""
    if name in REDUCTIONS:
        if node.kwargs.get("dtype") is not None and name != "aten.sum":
            return None, f"{name} with dtype= is not supported"
        return "reduction", ""
    if name in UNIT_RESHAPES:
        return "reshape", ""
    return None, f"{name} is not a pointwise or reduction operator (stays an extern call)"


def shape_problem(group: Group, node: torch.fx.Node, kind: str) -> str | None:
    """Why ``node`` cannot join ``group`` because of shapes, levels or device (None if it can)."""
    value = meta_of(node)
    if value.device != group.device:
        return f"device {value.device} differs from the group's {group.device}"
    domain, reduced = tuple(group.domain), tuple(group.reduced)
    if kind == "reduction":
        source = meta_of(node.args[0])
        axes = reduction_axes(node)
        if tuple(source.shape) != domain:
            return f"reduces shape {tuple(source.shape)}, group iterates {domain}"
        if reduced and axes != reduced:
            return f"reduces axes {list(axes)}, group reduces {list(reduced)}"
        if node.args[0] not in group.members:
            return "its input is not computed by the group"
        reduced = axes
    elif can_grow(group, tuple(value.shape), node):
        domain = tuple(value.shape)
    levels, why = group_levels(group.nodes + [node], domain, reduced)
    if levels is None:
        return why
    if kind == "reshape" and levels[node] != "outer" and not _reshapes_member_ramp(group, node) \
            and packet_name(node.target) != "aten.expand":
        return ("reshapes are fused only on reduced (outer) values, on an index ramp of the group, or as "
                "expands (a broadcast)")
    return stranded_broadcast(levels, domain, reduced)


def stranded_broadcast(levels: dict, domain: tuple, reduced: tuple) -> str | None:
    """Why a reduction group with these node ``levels`` would strand a broadcast value: one
    recomputed per element of the ``domain`` but of a smaller shape (a group norm's per-channel
    scale), with a user that cannot consume it inside the group (a reshape, another domain). That
    value would be a kernel output, which a kernel cannot store. None when there is none."""
    if not reduced:
        return None
    for member, level in levels.items():
        if level != "full" or tuple(meta_of(member).shape) == domain or end_padding(member) is not None:
            continue
        for user in member.users:
            if user in levels:
                continue
            if classify(user)[0] != "pointwise" or not broadcasts_to(tuple(meta_of(user).shape), domain):
                return (f"{member.name} would be a value of shape {tuple(meta_of(member).shape)} recomputed over "
                        f"the domain {domain} that {user.name} reads outside the group (a kernel cannot store it)")
    return None


def input_reshape_problem(group: Group, node: torch.fx.Node) -> str | None:
    """Why the unit reshape ``node`` of a value from outside ``group``, read only by the group, cannot
    join it as an access pattern (its kernel reading the value through the reshape's layout), or None."""
    source = node.args[0] if node.args else None
    if not isinstance(source, torch.fx.Node) or source in group.members:
        return "it reshapes a value of the group"
    value, reshaped = meta_of(source), meta_of(node)
    if not (isinstance(value, torch.Tensor) and isinstance(reshaped, torch.Tensor)):
        return "not a tensor"
    if value.device != group.device or value.dtype != reshaped.dtype:
        return "another device or dtype"
    if reshaped.storage_offset() != value.storage_offset():
        return "the reshape moves the storage offset"
    if unbound_symbols(group.members | {node}) - unbound_symbols(group.members):
        return (f"the kernel would read {source.name} of sizes {tuple(value.shape)} instead of {node.name}'s, "
                f"and no input of its would have each symbol as a whole size")
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    nodes = sorted(group.nodes + [node], key=order.__getitem__)
    levels, why = group_levels(nodes, tuple(group.domain), tuple(group.reduced))
    return why if levels is None else stranded_broadcast(levels, tuple(group.domain), tuple(group.reduced))


def unbound_symbols(members: set) -> set:
    """The symbols of the sizes of ``members`` (a group's nodes) that no input from outside them
    has as a whole size: a kernel of symbolic sizes reads each symbol's value from an input's
    sizes (:func:`passes.codegen.specialize.binders`), so one without such an input runs eagerly."""
    inputs = {a for n in members for a in n.all_input_nodes if a not in members}
    sizes = {s.node.expr for a in inputs if isinstance(meta_of(a), torch.Tensor)
             for s in meta_of(a).shape if isinstance(s, torch.SymInt)}
    symbols: set = set()
    for n in members:
        value = meta_of(n)
        if isinstance(value, torch.Tensor):
            for s in value.shape:
                if isinstance(s, torch.SymInt):
                    symbols |= s.node.expr.free_symbols
    return symbols - sizes


def input_pad_problem(group: Group, node: torch.fx.Node) -> str | None:
    """Why the pad ``node`` of a value from outside ``group``, read only by the group, cannot join
    it as a masked, shifted load of that value (see :func:`passes.kernel_ir.groups.node_level`), or None."""
    source = node.args[0]
    if not isinstance(source, torch.fx.Node) or source in group.members:
        return "it pads a value of the group"
    value = meta_of(source)
    if not isinstance(value, torch.Tensor) or value.device != group.device or value.dtype != meta_of(node).dtype:
        return "another device or dtype"
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    levels, why = group_levels(sorted(group.nodes + [node], key=order.__getitem__), tuple(group.domain),
                               tuple(group.reduced))
    return why if levels is None else None


def _reshapes_member_ramp(group: Group, node: torch.fx.Node) -> bool:
    """A reshape of an index ramp computed in the group is itself a ramp (computed from the loop
    indices, so it needs no eager broadcasting to line up)."""
    return iota_of(node) is not None and node.args[0] in group.members


def ramps_only(group: Group) -> bool:
    """True when every node of ``group`` is an index ramp: it reads nothing, so it takes the
    shape of whatever consumes it."""
    return all(iota_of(n) is not None for n in group.nodes)


def sources_only(group: Group) -> bool:
    """True when ``group`` only makes fills and index ramps: as a kernel it would write what the
    ATen calls write, so it is left to them (fills and ramps fuse into the groups that read them)."""
    return all(packet_name(n.target) in CONSTANTS or iota_of(n) is not None for n in group.nodes)


def can_grow(group: Group, shape: tuple, node: torch.fx.Node | None) -> bool:
    """A pointwise group may take a larger domain its own broadcasts to, if none of its values is
    needed outside (they are then recomputed per element of the larger domain)."""
    from passes.kernel_ir.groups import broadcasts_to
    fits = broadcasts_to(group.domain, shape) or ramps_only(group)
    return (not group.reduced and fits and tuple(group.domain) != shape
            and group.only_used_inside(node))


def merge_problem(target: Group, other: Group, node: torch.fx.Node, depends_on: "Dependencies",
                  order: dict) -> str | None:
    """Why sibling group ``other`` cannot merge into ``target`` as ``node`` joins it (None if it can)."""
    from passes.kernel_ir.groups import broadcasts_to, outer_axis_map
    if other.device != target.device:
        return "different devices"
    if other.reduced:
        if other.domain != target.domain or (target.reduced and other.reduced != target.reduced):
            return "reductions over different domains or axes"
    elif tuple(other.domain) != tuple(target.domain):
        # A pointwise sibling over the reduction's kept axes (a batch norm's running statistics,
        # scaled per channel) joins as values computed once per output row.
        outer = bool(target.reduced) and outer_axis_map(tuple(other.domain), tuple(target.domain),
                                                        tuple(target.reduced)) is not None
        fits = broadcasts_to(other.domain, target.domain) or ramps_only(other)
        if not (outer or fits and other.only_used_inside(node)):
            return f"domain {tuple(other.domain)} does not broadcast to {tuple(target.domain)}"
    reduced = tuple(target.reduced or other.reduced)
    merged = sorted(target.nodes + other.nodes, key=lambda n: order[n]) + [node]
    levels, why = group_levels(merged, tuple(target.domain), reduced)
    if levels is None:
        return why
    if reduced and levels[node] == "full" and tuple(meta_of(node).shape) != tuple(target.domain):
        # Without the sibling, the node reading the reduction is computed once per output element;
        # with it, it would become a broadcast full-domain value, which a kernel cannot store.
        return (f"{node.name} would become a broadcast value of shape {tuple(meta_of(node).shape)} recomputed "
                f"over the domain {tuple(target.domain)}, which cannot be a kernel output")
    why = stranded_broadcast(levels, tuple(target.domain), reduced)
    if why is not None:
        return why
    for a, b in ((other, target), (target, other)):
        for member in a.nodes:
            for arg in member.all_input_nodes:
                if arg not in a.members and arg not in b.members and depends_on.reaches(arg, b.id):
                    return f"{arg.name} depends on group {b.id} (merging would create a cycle)"
    return None


def outside_inputs(group: Group) -> set:
    return {a for n in group.nodes for a in n.all_input_nodes if a not in group.members}


def independent_merge_problem(first: Group, second: Group, depends_on: "Dependencies") -> str | None:
    """Why two groups that share no computed value cannot become one kernel (None if they can):
    both reductions or both pointwise, they must iterate the same domain, reduce the same axes on
    the same device, and neither may depend on the other (then the merged kernel can run where the
    later one would)."""
    if bool(first.reduced) != bool(second.reduced):
        return "a reduction and a pointwise group"
    if first.device != second.device:
        return "different devices"
    if tuple(first.domain) != tuple(second.domain) or tuple(first.reduced) != tuple(second.reduced):
        return "different domains or reduced axes"
    for a, b in ((first, second), (second, first)):
        if any(arg in a.members or depends_on.reaches(arg, a.id) for arg in outside_inputs(b)):
            return f"group {b.id} depends on group {a.id}"
    return None


def creates_cycle(group: Group, node: torch.fx.Node, depends_on: "Dependencies") -> str | None:
    """A node may not join a group if one of its other inputs depends on the group (transitively,
    with groups as units: see dependencies.py)."""
    for arg in node.all_input_nodes:
        if arg not in group.members and depends_on.reaches(arg, group.id):
            return f"input {arg.name} depends on the group (fusing would create a cycle)"
    return None
