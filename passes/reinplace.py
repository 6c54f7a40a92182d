"""``reinplace``: write into mutated graph inputs in place instead of rebuilding them.

Functionalization turns ``cache[layer][0].index_copy_(2, pos, k)`` into a chain of *functional*
operators that each return a whole new buffer, ending with one ``copy_`` of the final value back
into the input::

    ic  = index_copy(select(select(kv, 0, layer), 0, 0), 2, pos, k)   # new slice
    s1  = select_scatter(select(kv, 0, layer), ic, 0, 0)               # new layer
    kv1 = select_scatter(kv, s1, 0, layer)                             # new buffer
    ...                                                                # more writes, reads of kv1
    copy_(kv, kvN)                                                     # write-back

Run as written, each step copies the buffer (a KV cache of 600 MB, per layer). This pass turns such
a chain back into in-place writes when nothing reads an old version of the buffer after the write
that replaces it: the innermost functional write becomes its in-place form on a view of the input
(``index_copy_``, ``index_put_``, ``index_add_``, ``scatter_``, ``copy_``), the enclosing ``select_scatter`` /
``slice_scatter`` nodes disappear (their value *is* the input now), a scatter whose source was not
computed in place becomes a ``copy_`` into just the view it covers, and the write-back goes away.

An operator that returns new values of some of its arguments (a training batch norm's running
statistics) and whose in-place form writes them into those arguments is called in its in-place form
when each new value is only copied back into its argument.

Separately, a functional write whose input is a buffer allocated just for it (``index_put`` of
``zeros``: the embedding gradient) is done in place, skipping the copy of the whole buffer.

It works on whole chains: if one write of an input cannot be done in place (an old version is read
later, two writes branch from one version, an output aliases the buffer), that input keeps its
functional form and the report says why. Place it late (after ``fuse``): later passes must not move
reads of an input across writes of it, which is why it invalidates ``functional``.

Option ``share_cat_prefixes``: concatenations whose pieces begin with an earlier concatenation's
pieces (a DenseNet block) become copies of each piece into one buffer and views of its leading
parts (passes/cat_buffers.py).
"""
from __future__ import annotations

import operator
from typing import Any

import attrs
import torch
import torch.fx

from pipeline import Pass, PassContext, option
from pipeline import compat
from passes.cat_buffers import share_cat_prefixes
from passes.kernel_ir.groups import meta_of, packet_name
from pipeline.ir import finish, has_side_effects

aten = torch.ops.aten

# Functional writes whose in-place form writes into their first argument.
_IN_PLACE = {
    aten.index_copy.default: aten.index_copy_.default,
    aten.index_put.default: aten.index_put_.default,
    aten.index_add.default: aten.index_add_.default,
    aten.scatter.src: aten.scatter_.src,
    aten.scatter.value: aten.scatter_.value,
    aten.copy.default: aten.copy_.default,
}
# Functional operators returning new values of some arguments, and their in-place twins, which
# write those values into the arguments and return the other results: (twin, {result: argument}).
_FUNCTIONAL_TWINS = {
    aten._native_batch_norm_legit_functional.default: (aten._native_batch_norm_legit.default, {3: 3, 4: 4}),
}
# Functional writes of a whole view: (view operator, default arguments after the base).
_VIEW_SCATTERS = {
    aten.select_scatter.default: (aten.select.int, ()),
    aten.slice_scatter.default: (aten.slice.Tensor, (0, None, None, 1)),
}


@attrs.frozen
class _Step:
    """One write of a buffer: the outermost scatter producing the new version and its nest."""

    outer: torch.fx.Node
    actions: dict           # node -> "in-place" | "no-op" | "copy-into-view"
    first: int              # graph position of the earliest node of the nest (where the write happens)


@attrs.frozen
class ReinplaceOptions:
    share_cat_prefixes: bool = option(
        True, "Concatenations that extend an earlier concatenation along the same dim (its pieces first) "
              "share one buffer: each piece is copied into it once and each concatenation is a view of its "
              "leading part, instead of copying every piece again per concatenation.", tune=(True, False))


class Reinplace(Pass):
    """Turn functional rewrites of mutated graph inputs back into in-place writes, where legal."""

    name = "reinplace"
    Options = ReinplaceOptions
    version = "4"
    requires = frozenset({"aten"})
    invalidates = frozenset({"functional"})
    uses_fuel = True

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        twins = _call_in_place_twins(graph.graph, context)
        if twins:
            context.note(f"{twins} operator(s) write their new argument values in place (their in-place "
                         "form), without write-back copies")
        done = 0
        for writeback in [n for n in graph.graph.nodes if _is_writeback(n)]:
            root = writeback.args[0]
            order = {n: i for i, n in enumerate(graph.graph.nodes)}   # rewrites of earlier inputs add nodes
            steps = _chain(writeback, order)
            if isinstance(steps, str):
                context.note(f"{root.name}: kept functional ({steps})")
                continue
            if not steps:
                continue
            if not context.use_fuel(f"write {root.name} in place ({len(steps)} write(s))"):
                continue
            for step in steps:
                _apply(graph.graph, step)
            writeback.replace_all_uses_with(root)
            graph.graph.erase_node(writeback)
            done += 1
            context.note(f"{root.name}: {len(steps)} write(s) in place, no whole-buffer copy")
        if done:
            _drop_unused_views(graph.graph)
        fresh = _write_fresh_buffers_in_place(graph.graph, context.use_fuel)
        if fresh:
            context.note(f"{fresh} write(s) into a buffer made just for them done in place, without copying it")
        if self.options.share_cat_prefixes:
            shared = share_cat_prefixes(graph, context.use_fuel)
            if shared:
                context.note(f"{shared} concatenation(s) that extend one another share buffers: each piece "
                             "is copied once")
        return finish(graph)


# Factories whose result is a new buffer nothing else refers to.
_ALLOCATIONS = {"aten.full", "aten.zeros", "aten.empty", "aten.empty_strided", "aten.new_zeros",
                "aten.new_full", "aten.new_empty", "aten.ones"}


def _write_fresh_buffers_in_place(graph: torch.fx.Graph, use_fuel) -> int:
    """``index_put(full(...), ...)`` and the other functional writes whose input is a freshly
    allocated buffer read by nothing else (as in the embedding gradient, ``index_put`` of
    ``zeros``) become their in-place form: the functional form copies the whole buffer first."""
    done = 0
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in _IN_PLACE or node.target is aten.copy.default:
            continue
        buffer = node.args[0]
        if (isinstance(buffer, torch.fx.Node) and buffer.op == "call_function"
                and packet_name(buffer.target) in _ALLOCATIONS and len(buffer.users) == 1
                and not has_side_effects(buffer) and use_fuel(f"write {node.name} into {buffer.name} in place")):
            node.target = _IN_PLACE[node.target]
            done += 1
    return done


def _call_in_place_twins(graph: torch.fx.Graph, context: PassContext) -> int:
    """A functional operator of :data:`_FUNCTIONAL_TWINS` whose every new argument value is only
    copied back into that argument (a graph input no one reads after the operator) becomes its
    in-place form, and the copies go: a batch norm in training updates its running statistics
    itself, as in eager, instead of returning them for two more copies."""
    done = 0
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    for node in nodes:
        twin = _FUNCTIONAL_TWINS.get(node.target) if node.op == "call_function" else None
        if twin is None:
            continue
        in_place, written = twin
        results = {u.args[1]: u for u in node.users if u.target is operator.getitem}
        writebacks = []
        for result, position in written.items():
            value, target = results.get(result), node.args[position] if position < len(node.args) else None
            if value is None or not isinstance(target, torch.fx.Node):
                break
            copies = _copies_back(value, target)
            if copies is None or target in node.args[:position] or target in node.args[position + 1:] \
                    or any(order[r] > order[node] and r not in copies for r in _aliases(target)):
                break
            writebacks.append([*reversed(copies), value])
        else:
            if not context.use_fuel(f"call {node.name} in place"):
                continue
            for chain in writebacks:
                for erased in chain:
                    graph.erase_node(erased)
            node.target = in_place
            if isinstance(node.meta.get("val"), (tuple, list)):
                node.meta["val"] = tuple(node.meta["val"][:len(in_place._schema.returns)])
            done += 1
    return done


def _copies_back(value: torch.fx.Node, target: torch.fx.Node) -> list | None:
    """The nodes that only copy ``value`` back into the graph input ``target`` (the write-back
    ``copy_``, after functionalization's ``copy`` into a new version of it), or None."""
    if len(value.users) != 1:
        return None
    (user,) = value.users
    if user.op == "call_function" and user.target is aten.copy.default and user.args[:2] == (target, value) \
            and len(user.users) == 1:
        rest = _copies_back(user, target)
        return None if rest is None else [user, *rest]
    if _is_writeback(user) and user.args[0] is target and user.args[1] is value and not user.users:
        return [user]
    return None


def _is_writeback(node: torch.fx.Node) -> bool:
    return (node.op == "call_function" and node.target is aten.copy_.default
            and isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "placeholder")


def _is_view(node: Any) -> bool:
    return (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and compat.is_view_op(node.target))


def _location(node: torch.fx.Node) -> tuple[torch.fx.Node, tuple]:
    """(the value a view chain starts from, the chain as comparable steps)."""
    path: list = []
    while _is_view(node):
        path.insert(0, (packet_name(node.target), _view_args(node.target, node.args[1:], node.kwargs)))
        node = node.args[0]
    return node, tuple(path)


def _view_args(target: Any, args: tuple, kwargs: dict) -> tuple:
    if target is aten.slice.Tensor:
        names = ("dim", "start", "end", "step")
        values = list(args) + [kwargs.get(n, d) for n, d in zip(names[len(args):], (0, None, None, 1)[len(args):])]
        if values[2] is not None and values[2] >= 2 ** 62:   # "to the end" spelled as a huge number
            values[2] = None
        return ("slice", *values)
    return tuple(args) + tuple(sorted(kwargs.items()))


def _scatter_view(node: torch.fx.Node) -> tuple:
    """The view step a select_scatter / slice_scatter writes through, comparable with _location."""
    view_op, defaults = _VIEW_SCATTERS[node.target]
    rest = node.args[2:]
    if view_op is aten.slice.Tensor:
        return (packet_name(view_op), _view_args(view_op, rest, node.kwargs))
    return (packet_name(view_op), tuple(rest) + tuple(sorted(node.kwargs.items())))


def _is_write(node: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and (
        node.target in _IN_PLACE or node.target in _VIEW_SCATTERS)


def _chain(writeback: torch.fx.Node, order: dict) -> list[_Step] | str:
    """The writes that turn the input into the value ``writeback`` copies back, oldest first, or
    why they cannot be done in place."""
    root, final = writeback.args[0], writeback.args[1]
    outers: list[torch.fx.Node] = []
    value = final
    while value is not root:
        if not _is_write(value):
            return f"its final value comes from {value.name} ({compat.op_name(getattr(value, 'target', value))}), " \
                   f"not from a write into it"
        base, path = _location(value.args[0])
        if path:
            return f"{value.name} writes a view of a version, not a whole version"
        outers.append(value)
        value = base
    outers.reverse()
    versions = [root, *outers]
    steps = []
    for index, outer in enumerate(outers):
        actions: dict = {}
        _nest(outer, versions[index], (), actions)
        step = _Step(outer=outer, actions=actions, first=min(order[n] for n in actions))
        problem = _old_version_read_late(versions[index], step, order, writeback)
        if problem:
            return problem
        steps.append(step)
    for value in versions:
        if any(u.op == "output" for u in _aliases(value)):
            return f"a graph output aliases {value.name}"
    return steps


def _nest(write: torch.fx.Node, version: torch.fx.Node, path: tuple, actions: dict) -> None:
    """Mark what becomes of ``write`` (at ``path`` inside ``version``) and the writes nested in it."""
    if write.target in _IN_PLACE:
        actions[write] = "in-place"
        return
    inner_path = path + (_scatter_view(write),)
    source = write.args[1]
    if _is_write(source) and len(source.users) == 1 and _location(source.args[0]) == (version, inner_path):
        actions[write] = "no-op"
        _nest(source, version, inner_path, actions)
    else:
        actions[write] = "copy-into-view"


def _aliases(value: torch.fx.Node) -> list[torch.fx.Node]:
    """Nodes reading ``value`` directly or through views (the views themselves excluded)."""
    out, todo = [], list(value.users)
    while todo:
        node = todo.pop()
        if _is_view(node):
            todo.extend(node.users)
        elif node not in out:
            out.append(node)
    return out


def _old_version_read_late(version: torch.fx.Node, step: _Step, order: dict,
                           writeback: torch.fx.Node) -> str | None:
    """Whether something reads ``version`` after ``step`` has overwritten it."""
    for reader in _aliases(version):
        if reader in step.actions or reader is writeback:
            continue
        if _is_write(reader) and reader not in step.actions and _location(reader.args[0])[0] is version:
            return f"{reader.name} writes into {version.name} besides {step.outer.name}"
        if order[reader] > step.first:
            return (f"{reader.name} reads {version.name} after {step.outer.name} overwrote it "
                    f"(it would see the new values)")
    return None


def _apply(graph: torch.fx.Graph, step: _Step) -> None:
    for node, action in step.actions.items():
        base = node.args[0]
        if action == "in-place":
            node.target = _IN_PLACE[node.target]
            continue
        if action == "copy-into-view":
            view_op, _ = _VIEW_SCATTERS[node.target]
            with graph.inserting_before(node):
                view = graph.call_function(view_op, (base, *node.args[2:]), dict(node.kwargs))
                view.meta["val"] = view_op(meta_of(base), *node.args[2:], **node.kwargs)
                copy = graph.call_function(aten.copy_.default, (view, node.args[1]))
                copy.meta["val"] = meta_of(view)
        node.replace_all_uses_with(base)
        graph.erase_node(node)


def _drop_unused_views(graph: torch.fx.Graph) -> None:
    for node in reversed(list(graph.nodes)):
        if _is_view(node) and not node.users and not has_side_effects(node):
            graph.erase_node(node)


__all__ = ["Reinplace"]
