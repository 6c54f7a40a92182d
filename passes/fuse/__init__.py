"""``fuse``: group ATen nodes into kernels.

Pointwise chains (with broadcasting and strided inputs) become one group; reductions join the
pointwise nodes that feed them (prologue) and consume them (epilogue), so softmax, log_softmax,
layer norm and RMS norm are one group each. With ``horizontal``, sibling groups that read one input
merge where they meet again, a pointwise group merges into an earlier pointwise group over the same
domain that reads one of its inputs, and a reduction merges into the reduction group formed just
before it, when both iterate one domain and neither depends on the other (a backward's
bias-gradient sums).
Each group becomes one node calling a
:class:`passes.kernel_ir.groups.FusedGroup`, which runs the group eagerly until ``codegen`` gives it a kernel.
Legality (legality.py) is separate from profitability (choices.py); every rejected candidate is
recorded with its reason. A ``constant_pad_nd`` appending to trailing dims of a group's result that
nothing else reads joins that group as an output pad (:data:`passes.kernel_ir.groups.PAD`). A unit
reshape of a value from outside whose users are all in one group joins it: the kernel reads the
value through the reshape's layout (a batch norm's per-channel parameters, viewed as ``[C, 1, 1]``).
"""
from __future__ import annotations

import math
import operator

import attrs
import torch
import torch.fx

from pipeline import Pass, PassContext, device_types, non_negative, option, positive
from pipeline import compat
from passes.kernel_ir.groups import FusedGroup, end_padding, input_padding, meta_of, reduction_axes
from passes.kernel_ir import rules
from passes.kernel_ir.extern_layouts import align_extern_inputs

from .canonicalize import (FUSION_DECOMPOSITIONS, drop_identity_copies, fold_lone_sources, split_shared_sources,
                           without_conv_bias)
from .choices import FusionChoices
from .dependencies import Dependencies
from .legality import (Group, can_grow, classify, creates_cycle, independent_merge_problem, input_pad_problem,
                       input_reshape_problem, merge_problem, outside_inputs, shape_problem, sources_only)
from .cats import pointwise_cats, scatters_into_fills, zero_pads_as_clones
from .gathers import index_as_gather, index_views, sink_gathers
from .onehot import sum_one_hots
from .pools import slices_through_pads, window_pools
from .slices import split_elementwise
from .unroll import unroll_reductions
from .views import drop_leading_units, hoist_pads, hoist_permutes, move_views, symbolic_views


def _cat_limits(limits: dict) -> str | None:
    """Check for ``max_cat_inputs_by_device``: device types to limits of 0 or more."""
    bad = device_types(list(limits or {}))
    if bad:
        return bad
    wrong = {k: v for k, v in (limits or {}).items() if not isinstance(v, int) or isinstance(v, bool) or v < 0}
    return f"limits must be integers of 0 or more, got {wrong}" if wrong else None


#: Pointwise groups over a domain of at most this many elements merge even when they read nothing
#: in common (see Fuse._merge_pointwise_siblings).
SMALL_DOMAIN = 1024


@attrs.frozen
class FuseOptions:
    max_group_size: int = option(64, "Most ATen nodes one fused group may hold.", check=positive, tune=(16, 64, 256))
    reductions: bool = option(True, "Fuse reductions with their pointwise prologue and epilogue.")
    move_views: bool = option(True, "Move reshapes across elementwise nodes so the elementwise work "
                                    "joins the kernel on the other side, and end pads above reshapes so "
                                    "they become a kernel's padded output (see passes/fuse/views.py).",
                            tune=(True, False))
    split_elementwise: bool = option(True, "Compute slices (split, chunk, narrow) of an elementwise result as "
                                           "the elementwise op on slices of its operands, so each piece's "
                                           "kernel computes it and the whole result is not written (see "
                                           "passes/fuse/slices.py).", tune=(True, False))
    horizontal: bool = option(True, "Horizontal fusion: merge sibling groups that read the same input where they "
                                    "meet again, a pointwise group into an earlier pointwise group over the same "
                                    "domain that reads one of its inputs, and a reduction into the reduction group "
                                    "formed just before it, when both iterate the same domain and neither depends "
                                    "on the other (one launch for a layer's bias-gradient sums).", tune=(True, False))
    sum_one_hots: bool = option(True, "Compute sum(where(iota == index, value, 0) * weight) along the ramp's "
                                      "axis as the one element it picks, instead of a pass over every row "
                                      "(cross-entropy's backward; see passes/fuse/onehot.py).")
    sink_gathers: bool = option(True, "Compute gather(f(x), dim, index) of an elementwise f as "
                                      "f(gather(x, dim, index)) when f's other operands are constant along "
                                      "dim, so the full f(x) is not written (cross-entropy's log-probabilities; "
                                      "see passes/fuse/gathers.py).")
    gather_loads: bool = option(True, "Compute indexing by one integer tensor (x[idx]) and embeddings as gathers "
                                      "that the kernel consuming the picked rows reads with indirect loads, "
                                      "instead of ATen calls writing the rows (see passes/fuse/gathers.py).",
                                tune=(True, False))
    max_cat_inputs: int = option(4, "Concatenations of at most this many pieces become a select over the pieces "
                                    "placed at their offsets, read by the kernel that consumes the cat (masked "
                                    "loads), so the concatenated tensor is never written; 0 keeps every cat an "
                                    "ATen call (see passes/fuse/cats.py).", check=non_negative, tune=(0, 4))
    max_cat_inputs_by_device: dict[str, int] = option(
        {}, "Per device type, a limit that replaces max_cat_inputs for cats on that device (e.g. {cuda: 8}, "
            "Inductor's limit for pointwise cats). Every piece costs its readers a masked load per element "
            "on the GPU; a DenseNet's wider cats read by their batch norm and ReLU took more GPU time as "
            "selects of up to 8 pieces than as ATen cats.", check=_cat_limits)
    unroll_reductions: int = option(8, "Sums, means and extrema over at most this many elements per result (static "
                                       "sizes) become elementwise work on slices of their input, so they join the "
                                       "kernel of their consumers instead of ending it; 0 keeps every reduction a "
                                       "reduction (see passes/fuse/unroll.py).", check=non_negative, tune=(0, 8))
    window_pools: int = option(25, "Max pools (whose indices nothing reads) and average pools of at most this "
                                   "many elements per window become elementwise work on strided slices of "
                                   "their input, computed by the kernel that reads the pool; 0 keeps them ATen "
                                   "calls (see passes/fuse/pools.py).", check=non_negative, tune=(0, 25))
    conv_bias_apart: list[str] = option(
        ["cuda"], "Devices on which a convolution's bias is added by the kernel that reads the convolution "
                  "(the convolution runs without it): ATen's CUDA convolution adds a bias in a kernel of its "
                  "own. On the CPU, oneDNN adds it inside the convolution.", check=device_types)
    drop_identity_copies: bool = option(True, "Drop copies (clone, contiguous) that keep their input's layout "
                                              "when nothing can tell them apart: the input is computed by the "
                                              "graph and the copy is not returned (see "
                                              "passes/fuse/canonicalize.py).")
    max_notes: int = option(50, "Most rejected-fusion reasons recorded per graph in the report.",
                            check=positive)


class Fuse(Pass):
    """Group pointwise and reduction nodes into fused kernels (legality apart from scoring)."""

    name = "fuse"
    Options = FuseOptions
    version = "37"
    cache_material = rules.cache_material   # rules a plugin adds or replaces change the output
    requires = frozenset({"functional", "aten"})
    provides = frozenset({"fused"})
    Choices = FusionChoices

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        if self.options.window_pools:
            pooled = window_pools(graph, self.options.window_pools)
            if pooled:
                context.note(f"{pooled} pool(s) computed elementwise over their windows", topic="fusion")
        if self.options.gather_loads:
            index_views(graph)
        if self.options.unroll_reductions:
            unrolled = unroll_reductions(graph, self.options.unroll_reductions)
            if unrolled:
                context.note(f"{unrolled} reduction(s) over few elements computed elementwise", topic="fusion")
        if self.options.split_elementwise:
            split = split_elementwise(graph)
            if split:
                context.note(f"{split} elementwise node(s) computed per slice of their result", topic="fusion")
        if self.options.gather_loads:
            gathered = index_as_gather(graph)
            if gathered:
                context.note(f"{gathered} indexing/embedding node(s) computed as gathers", topic="fusion")
        padded = scatters_into_fills(graph)
        if padded:
            context.note(f"{padded} slice_scatter(s) into fills computed as pads", topic="fusion")
        cloned = zero_pads_as_clones(graph)
        if cloned:
            context.note(f"{cloned} pad(s) of zero widths computed as copies that fuse", topic="fusion")
        if self.options.move_views:
            moved = move_views(graph) + hoist_pads(graph) + slices_through_pads(graph)
            if moved:
                context.note(f"moved {moved} node(s) across reshapes and pads", topic="fusion")
        if self.options.sink_gathers:
            sunk = sink_gathers(graph)
            if sunk:
                context.note(f"{sunk} gather(s) of elementwise results now gather before computing",
                             topic="fusion")
        limits = {"cpu": self.options.max_cat_inputs, "cuda": self.options.max_cat_inputs}
        limits.update(self.options.max_cat_inputs_by_device)
        if any(limits.values()):
            cats = pointwise_cats(graph, limits)
            if cats:
                context.note(f"{cats} cat(s) computed as selects over their placed pieces", topic="fusion")
        with torch.no_grad():
            decompositions = FUSION_DECOMPOSITIONS
            if self.options.conv_bias_apart:
                decompositions = {**decompositions,
                                  torch.ops.aten.convolution.default: without_conv_bias(self.options.conv_bias_apart)}
            graph = compat.retrace(graph, context.example_inputs, decompositions=decompositions)
        if self.options.move_views and self.options.conv_bias_apart and hoist_permutes(graph):
            context.note("a convolution's bias moved across a permute into the kernel reading it", topic="fusion")
        with compat.guards_suppressed(context.example_inputs):     # (a symbolic stride is compared)
            aligned = align_extern_inputs(graph)
        if aligned:     # made here, the padding joins the kernel computing the value (a padded output)
            context.note(f"{aligned} attention bias(es) padded to the aligned layout the fused attention kernels "
                         "need, before grouping", topic="fusion")
        if self.options.move_views and drop_leading_units(graph):
            context.note("leading size-1 axes of broadcast operands dropped (no reshape between their kernels)",
                         topic="fusion")
        if self.options.sum_one_hots:
            summed = sum_one_hots(graph)
            if summed:
                context.note(f"{summed} sum(s) of one-hot rows computed in closed form", topic="fusion")
                with torch.no_grad():
                    graph = compat.retrace(graph, context.example_inputs)
        graph.graph.eliminate_dead_code()  # unused outputs of rewritten reductions never become kernels
        graph.recompile()
        spelled = symbolic_views(graph)
        if spelled:
            context.note(f"{spelled} view(s) of one symbolic size written with -1 instead of a size computed in "
                         "the graph: they join their kernels as access patterns", topic="fusion")
        if self.options.drop_identity_copies:
            dropped = drop_identity_copies(graph)       # (sizes compared without guarding on them)
            if dropped:
                context.note(f"{dropped} copy(ies) of an unchanged layout dropped", topic="fusion")
        copies = split_shared_sources(graph, lambda user: classify(user)[0] not in (None, "reshape"),
                                      lambda node: classify(node)[0] in ("pointwise", "reshape"))
        if copies:
            context.note(f"{copies} fill(s), ramp(s) or index expression(s) copied into each kernel that reads them",
                         topic="fusion")
        # Grouping compares symbolic sizes at the values Dynamo saw without guarding on them: a
        # group's subgraph computes what its nodes did at any size, and its kernels are generated
        # per concrete size, where a group whose shapes do not line up runs eagerly.
        with compat.guards_suppressed(context.example_inputs):
            groups = self.form_groups(graph, context)
            kept = [g for g in groups if any(classify(n)[0] != "reshape" for n in g.nodes) and not sources_only(g)]
            absorbed = absorb_input_reshapes(graph, kept)
        if not kept:
            context.note("no fusable nodes", topic="fusion")
            return graph
        if absorbed:
            context.note(f"{absorbed} reshape(s) or pad(s) of kernel inputs read as the kernels' access patterns",
                         topic="fusion")
        context.note(f"{len(kept)} fused group(s) from "
                     f"{sum(len(g.nodes) for g in kept)} nodes", topic="fusion")
        graph = rebuild(graph, kept)
        folded = fold_lone_sources(graph)
        if folded:
            context.note(f"{folded} one-element fill(s) or index ramp(s) outside kernels stored as constants",
                         topic="fusion")
        return graph

    def form_groups(self, graph: torch.fx.GraphModule, context: PassContext) -> list[Group]:
        choices = self.Choices(self.options.max_group_size)
        group_of: dict[torch.fx.Node, Group] = {}
        depends_on = Dependencies()
        groups: list[Group] = []
        notes = 0

        def note(message: str) -> None:
            nonlocal notes
            if notes < self.options.max_notes:
                context.note(message, topic="fusion")
            notes += 1

        order = {n: i for i, n in enumerate(graph.graph.nodes)}
        for node in graph.graph.nodes:
            depends_on.record(node, group_of)
            kind, why = classify(node)
            if kind == "reduction" and not self.options.reductions:
                kind, why = None, "reductions are off (fuse.reductions: false)"
            if kind is None:
                padded = output_pad_group(node, group_of, depends_on)
                if padded is not None:
                    padded.add(node, padded.reduced)
                    group_of[node] = padded
                    depends_on.record(node, group_of)
                elif node.op == "call_function":
                    note(f"{node.name}: not fused: {why}")
                continue
            best, best_score = None, None
            for arg in node.all_input_nodes:
                group = group_of.get(arg)
                if group is None or group is best:
                    continue
                problem = shape_problem(group, node, kind) or creates_cycle(group, node, depends_on)
                if problem:
                    note(f"{node.name} not fused into group {group.id} ({group.nodes[-1].name}): {problem}")
                    continue
                score = choices.score(group, node)
                if score is None:
                    note(f"{node.name} not fused into group {group.id}: declined by {type(choices).__name__}")
                    continue
                if best_score is None or score.bytes_saved > best_score.bytes_saved:
                    best, best_score = group, score
            if best is not None:
                reduced = reduction_axes(node) if kind == "reduction" else best.reduced
                if kind != "reduction" and can_grow(best, tuple(meta_of(node).shape), node):
                    best.domain = tuple(meta_of(node).shape)
                best.add(node, reduced)
                group_of[node] = best
                depends_on.record(node, group_of)
                if self.options.horizontal:
                    self._merge_siblings(best, node, group_of, depends_on, order, note)
            elif kind != "reshape":
                if kind == "reduction":
                    source = meta_of(node.args[0])
                    group = Group(len(groups), node, tuple(source.shape), reduction_axes(node))
                else:
                    group = Group(len(groups), node, tuple(meta_of(node).shape), ())
                groups.append(group)
                group_of[node] = group
                depends_on.record(node, group_of)
        if self.options.horizontal:
            self._merge_independent(groups, group_of, depends_on, order, choices, note)
        return [g for g in groups if g.nodes]

    @staticmethod
    def _merge_independent(groups: list[Group], group_of: dict, depends_on: Dependencies, order: dict,
                           choices: FusionChoices, note) -> None:
        """Merge each reduction group into the reduction group formed just before it, where legal
        (:func:`independent_merge_problem`) and wanted (``choices.merge_independent``)."""
        Fuse._merge_pointwise_siblings(groups, group_of, depends_on, order, choices)
        previous = None
        for group in groups:
            if not group.nodes or not group.reduced:
                continue
            if previous is not None:
                problem = independent_merge_problem(previous, group, depends_on)
                if problem is None and choices.merge_independent(previous, group):
                    _absorb(previous, group, group_of, depends_on, order)
                    continue
                if problem is not None and problem != "different domains or reduced axes":
                    note(f"group {group.id} not merged into group {previous.id}: {problem}")
            previous = group

    @staticmethod
    def _merge_pointwise_siblings(groups: list[Group], group_of: dict, depends_on: Dependencies, order: dict,
                                  choices: FusionChoices) -> None:
        """Merge each pointwise group into an earlier pointwise group over the same domain that reads
        one of the same inputs, where legal (:func:`independent_merge_problem`) and wanted
        (``choices.merge_independent``): one launch reads the shared input once for both (a sorted
        index converted for a histogram and compared for a mask). Groups over the same domain of at
        most :data:`SMALL_DOMAIN` elements that read only graph inputs merge whatever they read
        (each batch norm's ``num_batches_tracked + 1`` in a training step: one launch for all):
        their launches cost more than their work, their buffers are too small for a longer
        lifetime to matter, and, ready from the start, none waits for another's inputs."""
        readers: dict = {}      # outside input (or a small domain) -> pointwise groups, in formation order
        for group in groups:
            if not group.nodes or group.reduced or sources_only(group):
                continue
            inputs: list = [a for a in outside_inputs(group) if isinstance(meta_of(a), torch.Tensor)]
            if all(type(size) is int for size in group.domain) and math.prod(group.domain) <= SMALL_DOMAIN \
                    and all(a.op in ("placeholder", "get_attr") for a in outside_inputs(group)) \
                    and any(classify(n)[0] == "pointwise" for n in group.nodes):    # not views alone
                inputs.append(("small domain", tuple(group.domain), group.device))
            target = None
            for arg in inputs:
                for earlier in readers.get(arg, []):
                    if earlier.nodes and tuple(earlier.domain) == tuple(group.domain) \
                            and independent_merge_problem(earlier, group, depends_on) is None \
                            and choices.merge_independent(earlier, group):
                        target = earlier
                        break
                if target is not None:
                    break
            if target is not None:
                _absorb(target, group, group_of, depends_on, order)
                group = target
            for arg in inputs:
                if group not in readers.setdefault(arg, []):
                    readers[arg].append(group)

    @staticmethod
    def _merge_siblings(target: Group, node: torch.fx.Node, group_of: dict, depends_on: Dependencies,
                        order: dict, note) -> None:
        """Merge the other groups feeding ``node`` into ``target`` where legal (horizontal fusion
        of siblings that share inputs and meet again at ``node``)."""
        for arg in node.all_input_nodes:
            other = group_of.get(arg)
            if other is None or other is target or not other.nodes:
                continue
            problem = merge_problem(target, other, node, depends_on, order)
            if problem:
                note(f"group {other.id} not merged into group {target.id} at {node.name}: {problem}")
                continue
            _absorb(target, other, group_of, depends_on, order)


def _absorb(target: Group, other: Group, group_of: dict, depends_on: Dependencies, order: dict) -> None:
    """Move ``other``'s nodes into ``target``; whatever depended on ``other`` now depends on it."""
    for member in other.nodes:
        group_of[member] = target
    depends_on.merged(target.id, other.id)
    target.merge(other, order)


def absorb_input_reshapes(graph: torch.fx.GraphModule, groups: list[Group]) -> int:
    """Move into its group each unit reshape outside every group whose users are all in that one
    group (a batch norm's per-channel ``view(weight, [C, 1, 1])``): the kernel then reads the
    reshape's input through the reshape's layout, and the host code makes no view for it. Pads of
    a value from outside (:func:`~passes.kernel_ir.nodes.input_padding`) join their users' group
    the same way: the kernel reads the value with a masked, shifted load. Returns how many moved."""
    group_of = {n: g for g in groups for n in g.nodes}
    order = {n: i for i, n in enumerate(graph.graph.nodes)}
    moved = 0
    for node in reversed(graph.graph.nodes):     # a chain of reshapes joins from its last one up
        pad = input_padding(node) is not None
        if node in group_of or not (pad or classify(node)[0] == "reshape") or not node.users:
            continue
        owners = {group_of.get(user) for user in node.users}
        if len(owners) != 1 or None in owners:
            continue
        group = owners.pop()
        if (input_pad_problem if pad else input_reshape_problem)(group, node) is None:
            group.nodes = sorted(group.nodes + [node], key=order.__getitem__)
            group.members.add(node)
            group_of[node] = group
            moved += 1
    return moved


def output_pad_group(node: torch.fx.Node, group_of: dict, depends_on: Dependencies) -> Group | None:
    """The group that takes ``node`` as an output pad (:data:`passes.kernel_ir.groups.PAD`), if any: a
    ``constant_pad_nd`` at the end of trailing dims of a contiguous full-domain value of a group
    that nothing else reads. Its kernel then writes that value straight into the padded buffer."""
    if end_padding(node) is None:
        return None
    source = node.args[0]
    group = group_of.get(source)
    if group is None or len(source.users) != 1 or creates_cycle(group, node, depends_on):
        return None
    value = meta_of(source)
    if tuple(value.shape) != tuple(group.domain) or not value.is_contiguous():
        return None
    if any(group.domain[axis] == 1 for axis in group.reduced):
        return None         # a reduced value could then have the domain's shape too
    return group


def rebuild(graph: torch.fx.GraphModule, groups: list[Group]) -> torch.fx.GraphModule:
    """A new graph where each group is one call of its FusedGroup, scheduled topologically."""
    group_of = {n: g for g in groups for n in g.nodes}
    nodes = list(graph.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    units: list = []
    unit_of: dict = {}
    for node in nodes:
        group = group_of.get(node)
        if group is None:
            unit_of[node] = node
            units.append(node)
        elif group not in unit_of:
            unit_of[group] = group
            units.append(group)
    for node, group in group_of.items():
        unit_of[node] = group

    def deps(unit) -> set:
        members = unit.nodes if isinstance(unit, Group) else [unit]
        out = set()
        for member in members:
            for arg in member.all_input_nodes:
                dep = unit_of[arg]
                if dep is not unit:
                    out.add(dep)
        return out

    remaining = {u: deps(u) for u in units}
    users: dict = {u: [] for u in units}
    for unit, ds in remaining.items():
        for d in ds:
            users[d].append(unit)
    ready = sorted([u for u, d in remaining.items() if not d], key=lambda u: _first(u, order))
    new_graph = torch.fx.Graph()
    env: dict = {}
    output_node = None
    while ready:
        unit = ready.pop(0)
        if isinstance(unit, Group):
            _emit_group(unit, new_graph, env, graph)
        elif unit.op == "output":
            output_node = unit
        else:
            env[unit] = new_graph.node_copy(unit, lambda n: env[n])
        for user in users[unit]:
            remaining[user].discard(unit)
            if not remaining[user]:
                ready.append(user)
                ready.sort(key=lambda u: _first(u, order))
    stuck = [u for u, d in remaining.items() if d]
    if stuck or output_node is None:
        names = ", ".join(f"group of {u.nodes[0].name}" if isinstance(u, Group) else u.name for u in stuck[:6])
        raise RuntimeError(f"fuse formed groups with a cyclic dependency; no order runs {names}. "
                           "This is a bug in fuse's legality checks: set fuse.horizontal: false or "
                           "fuse.max_group_size: 1 for this graph and report it.")
    new_graph.node_copy(output_node, lambda n: env[n])
    return torch.fx.GraphModule(graph, new_graph)


def _first(unit, order) -> int:
    return order[unit.nodes[0]] if isinstance(unit, Group) else order[unit]


def _emit_group(group: Group, new_graph: torch.fx.Graph, env: dict, graph: torch.fx.GraphModule) -> None:
    externals: list[torch.fx.Node] = []
    for node in group.nodes:
        for arg in node.all_input_nodes:
            if arg not in group.members and arg not in externals:
                externals.append(arg)
    outputs = [n for n in group.nodes if any(u not in group.members for u in n.users)]
    sub = torch.fx.Graph()
    sub_env: dict = {}
    for i, ext in enumerate(externals):
        placeholder = sub.placeholder(f"in{i}")
        placeholder.meta = dict(ext.meta)
        sub_env[ext] = placeholder
    for node in group.nodes:
        sub_env[node] = sub.node_copy(node, lambda n: sub_env[n])
    sub.output(tuple(sub_env[n] for n in outputs))
    name = f"fused_{group.id}"
    fused = FusedGroup(name=name, subgraph=torch.fx.GraphModule(graph, sub), domain=tuple(group.domain),
                       reduced=tuple(group.reduced))
    call = new_graph.call_function(fused, tuple(env[e] for e in externals))
    call.meta["val"] = tuple(meta_of(n) for n in outputs)
    call.meta["fused_group"] = fused
    for index, node in enumerate(outputs):
        item = new_graph.call_function(operator.getitem, (call, index))
        item.meta = dict(node.meta)
        env[node] = item
