"""View motion: move reshapes across pointwise nodes so that the pointwise work lands in the shape
of the kernel it can join.

A reshape between a pointwise node and a reduction stops fusion: the reduction iterates the new
shape, the pointwise node the old one. GPT-2's loss is the example: the bf16 logits ``[b, s, V]``
are converted to fp32 (pointwise), reshaped to ``[b*s, V]`` and reduced by ``log_softmax``; its
backward computes ``[b*s, V]`` and converts the reshaped ``[b, s, V]`` result back to bf16. With
the reshape in between, each conversion is a kernel of its own writing an fp32 copy of the logits.

First, ``unsqueeze``/``squeeze`` are spelled as views and a view of a view becomes one view, so a
chain of reshapes moves as one (eval-mode batch norm reaches its kernel through two ``unsqueeze`` calls
of per-channel values). Then two rewrites, both exact for elementwise ops (an elementwise op
commutes with any reshape of all its same-shaped operands):

- **hoist**: ``view(f(a, b))`` becomes ``f(view(a), view(b))`` when ``f``'s operands come from
  outside any kernel (graph inputs, extern calls, or pointwise nodes that are hoisted in turn) and
  the view feeds a kernel: ``f`` then joins that kernel as its prologue.
- **sink**: ``f(view(y))`` becomes ``view(f(y))`` when ``y`` is computed by a kernel and ``f``'s
  result leaves (a graph output or an extern call): ``f`` joins ``y``'s kernel as an epilogue.

Only views that are valid on every moved operand's layout are moved (checked on the operands'
example values), only to static shapes (a new view's shape is written into the graph), and only
elementwise nodes with operands of one shape (or 0-d) are crossed.
All hoists run first, then all sinks, so the two never undo each other.

A regrouping view that a reduction reads also moves above elementwise work with other users or
broadcast operands (:func:`_hoist_shared`): the work is computed in the reduction's shape, its
broadcast operands viewed to match, and its other users read it viewed back (a free view).

Permutes hoist too (:func:`hoist_permutes`): ``permute(f(a, b))`` becomes ``f(permute(a),
permute(b'))`` when ``f``'s operands come from outside kernels (``b'`` a broadcast operand viewed
to the result's rank), also after the re-trace that adds convolution biases apart, so a bias joins
the kernel that reads the convolution through a permute (ConvNeXt's layer norm over channels).

A view of one symbolic size is written with -1 (:func:`symbolic_views`), so it too joins the
kernel reading it instead of taking sizes computed in the graph.

A third rewrite moves pads (:func:`hoist_pads`): ``pad(view(y))`` becomes ``view(pad(y))`` when
the view leaves the padded trailing dims alone, so that the pad meets the kernel computing ``y``
and becomes that kernel's padded output (:data:`passes.kernel_ir.groups.PAD`).
"""
from __future__ import annotations

import torch
import torch.fx
import torch.utils._pytree as pytree

from pipeline import compat
from passes.kernel_ir.groups import end_padding, meta_of, packet_name
from passes.kernel_ir.nodes import call_with_value, static_sizes

from .canonicalize import REDUCING
from .legality import classify

aten = torch.ops.aten
VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
MAX_ROUNDS = 16


# Size-1 axes added or dropped: always a view, whatever the layout.
UNIT_VIEWS = (aten.unsqueeze.default, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)


def move_views(graph: torch.fx.GraphModule) -> int:
    """Spell unit reshapes as views and merge chains of views, then hoist, then sink, reshapes
    across elementwise nodes in ``graph`` (in place); returns how many nodes moved. New nodes
    carry example values derived from the old ones; the caller re-traces the graph for exact
    ones."""
    return rewrite_in_rounds(graph, (_as_one_view, _hoist, _hoist_shared, _hoist_permute, _sink))


def hoist_permutes(graph: torch.fx.GraphModule) -> int:
    """Only the permute hoist of :func:`move_views`, for a graph whose decompositions have just
    added elementwise work (a convolution's bias, added apart); returns how many moved."""
    return rewrite_in_rounds(graph, (_hoist_permute,))


def drop_leading_units(graph: torch.fx.GraphModule) -> int:
    """``f(view(a), b)`` becomes ``f(a, b)`` where the view only puts size-1 axes in front of ``a``
    (``bias.unsqueeze(0)``) and ``f`` is a broadcasting pointwise node with another operand of at
    least the view's rank: broadcasting aligns shapes from the right, so the leading 1s change
    nothing, and the kernel computing ``a`` can then grow into ``f``'s (a reshape between them
    stops fusion: Swin's and T5's relative position biases added to the scores). Returns how many
    operands were replaced."""
    replaced = 0
    for node in list(graph.graph.nodes):
        values = [meta_of(n) for n in (node, *node.all_input_nodes)]
        if not all(isinstance(v, torch.Tensor) and static_sizes(v.shape) for v in values) \
                or not _broadcast_elementwise(node):
            continue        # (symbolic sizes: comparing them would guard on them)
        for arg in list(node.all_input_nodes):
            if arg.op != "call_function" or arg.target not in VIEWS + (aten.unsqueeze.default,) \
                    or not isinstance(arg.args[0], torch.fx.Node) or not isinstance(meta_of(arg.args[0]), torch.Tensor):
                continue
            shape, inner = tuple(meta_of(arg).shape), tuple(meta_of(arg.args[0]).shape)
            lead = len(shape) - len(inner)
            if lead <= 0 or shape[lead:] != inner or any(size != 1 for size in shape[:lead]):
                continue
            others = [meta_of(a).dim() for a in node.all_input_nodes if a is not arg]
            if not others or max(others) < len(shape):
                continue            # the view's rank sets the result's: keep it
            node.replace_input_with(arg, arg.args[0])
            replaced += 1
    if replaced:
        graph.graph.eliminate_dead_code()
        graph.recompile()
    return replaced


def rewrite_in_rounds(graph: torch.fx.GraphModule, rewrites: tuple) -> int:
    """Apply each rewrite (``rewrite(graph, node) -> 0 | 1``) to every node, in rounds until none
    applies (at most ``MAX_ROUNDS``), one rewrite after the other; returns how many applied."""
    moved = 0
    for rewrite in rewrites:
        for _ in range(MAX_ROUNDS):
            changed = sum(rewrite(graph.graph, node) for node in list(graph.graph.nodes)
                          if node.graph is graph.graph)
            moved += changed
            if not changed:
                break
    if moved:
        graph.graph.eliminate_dead_code()
        graph.recompile()
    return moved


LAYOUT_FREE = (None, torch.preserve_format, torch.contiguous_format)


def _elementwise(node: torch.fx.Node) -> bool:
    """A pointwise node whose tensor operands all have its shape (or are 0-d), and that asks for
    no rank-specific layout (a ``clone`` to ``channels_last`` cannot move to another rank)."""
    if node.op != "call_function" or classify(node)[0] != "pointwise":
        return False
    if node.kwargs.get("memory_format") not in LAYOUT_FREE:
        return False
    shape = tuple(meta_of(node).shape)
    for arg in node.all_input_nodes:
        value = meta_of(arg)
        if not isinstance(value, torch.Tensor) or (value.dim() and tuple(value.shape) != shape):
            return False
    return True


def _viewable(value: torch.Tensor, shape: list) -> bool:
    """True when ``value``'s layout allows ``view(shape)`` without a copy."""
    probe = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    try:
        probe.view(shape)
    except (RuntimeError, ValueError):      # eager raises RuntimeError, the meta reference ValueError
        return False
    return True


def _in_kernel(node: torch.fx.Node) -> bool:
    """Computed by a fusable node (so a kernel, after ``fuse``; a gather too)."""
    return classify(node)[0] in ("pointwise", "reduction", "gather")


def _feeds_kernel(node: torch.fx.Node) -> bool:
    return any(classify(user)[0] in ("pointwise", "reduction") for user in node.users)


def _only_kernels_use(node: torch.fx.Node) -> bool:
    return all(classify(user)[0] in ("pointwise", "reduction") for user in node.users)


def _hoistable_operand(arg: torch.fx.Node, user: torch.fx.Node, shape: list, seen: dict) -> bool:
    """An operand that can take a view of ``shape``: produced outside kernels, or by an elementwise
    node used only here whose own operands are hoistable in turn (the next rounds hoist the view
    over it). The whole chain must qualify: a view hoisted only part of the way up a kernel's
    chain splits that kernel, which then writes every value the hoisted part still reads."""
    if arg in seen:
        return seen[arg]
    if arg.op == "placeholder" or not _in_kernel(arg):
        seen[arg] = True
        return True
    seen[arg] = False
    if not (_elementwise(arg) and len(arg.users) == 1 and next(iter(arg.users)) is user
            and packet_name(arg.target) != "aten.clone"):
        return False
    tensors = [a for a in arg.all_input_nodes if meta_of(a).dim()]
    seen[arg] = all(_viewable(meta_of(a), shape) and _hoistable_operand(a, arg, shape, seen) for a in tensors)
    return seen[arg]


def _as_one_view(graph: torch.fx.Graph, node: torch.fx.Node) -> int:
    """``unsqueeze``/``squeeze`` become ``view``, and ``view(view(x))`` whose inner view has no
    other user becomes one ``view(x)``, so that a chain of reshapes moves as one (a batch norm's
    per-channel values reach its kernel through two ``unsqueeze`` calls); 1 if rewritten."""
    if node.op != "call_function" or not isinstance(meta_of(node), torch.Tensor):
        return 0
    shape = list(meta_of(node).shape)
    if _whole_slice(node) and isinstance(node.args[0], torch.fx.Node) \
            and not any(user.op == "output" for user in node.users):
        node.replace_all_uses_with(node.args[0])       # the whole tensor: no view at all
        graph.erase_node(node)
        return 1
    if node.target in UNIT_VIEWS:
        source = node.args[0]
    elif node.target in VIEWS and isinstance(node.args[0], torch.fx.Node) \
            and node.args[0].op == "call_function" and node.args[0].target in VIEWS + UNIT_VIEWS \
            and len(node.args[0].users) == 1:
        source = node.args[0].args[0]
    else:
        return 0
    if not isinstance(source, torch.fx.Node) or not isinstance(meta_of(source), torch.Tensor):
        return 0
    if static_sizes(shape):
        if not _viewable(meta_of(source), shape):
            return 0
        written = shape
    elif not _unit_axes_apart(list(meta_of(source).shape), shape):
        return 0        # symbolic shapes: only a chain that adds or drops size-1 axes (a view on any layout)
    inner = node.args[0] if node.target in VIEWS else None
    with graph.inserting_before(node):
        if not static_sizes(shape):
            written = _with_one_inferred(shape) or _read_from(graph, source, shape)
        view = graph.call_function(aten.view.default, (source, written))
    view.meta = dict(node.meta)
    node.replace_all_uses_with(view)
    graph.erase_node(node)
    if inner is not None:
        graph.erase_node(inner)
    return 1


def symbolic_views(graph) -> int:
    """Write a view of symbolic sizes with its one symbolic size as -1 (``view(x, [1, -1, 64])`` of
    an ``[s, 64]`` matmul result) instead of a size computed in the graph, which a kernel cannot
    take: the view then joins the kernel reading it as an access pattern, as a static view does,
    and the host code makes no view for it (unless the kernel would then have no input of which
    each symbol is a whole size, see :func:`~.legality.input_reshape_problem`). Returns the
    number rewritten."""
    rewritten = 0
    for node in list(graph.graph.nodes):
        if node.op != "call_function" or node.target not in VIEWS or len(node.args) < 2 \
                or not isinstance(node.args[0], torch.fx.Node) \
                or not any(isinstance(a, torch.fx.Node) for a in pytree.tree_leaves(node.args[1])):
            continue
        value = meta_of(node)
        inferred = _with_one_inferred(list(value.shape)) if isinstance(value, torch.Tensor) else None
        if inferred is not None:
            node.args = (node.args[0], inferred, *node.args[2:])
            rewritten += 1
    if rewritten:
        graph.graph.eliminate_dead_code()       # the size nodes the views were written with
        graph.recompile()
    return rewritten


def _whole_slice(node: torch.fx.Node) -> bool:
    """``slice(x, dim, 0, end)`` with ``end`` past any size and step 1: the whole of ``x``."""
    if node.target is not aten.slice.Tensor or node.kwargs:
        return False
    defaults = [None, 0, None, None, 1]     # self, dim, start, end, step
    _, _, start, end, step = list(node.args) + defaults[len(node.args):]
    return (start in (None, 0) and step == 1
            and (end is None or type(end) is int and end >= 2 ** 62))


def _with_one_inferred(shape: list) -> list | None:
    """``shape`` with its one symbolic size written -1 (view infers it), or None when it has
    several, a size of unbacked symbols (maybe 0: nothing to infer from) or a static 0."""
    symbolic = [s for s in shape if not isinstance(s, int)]
    if len(symbolic) != 1 or not compat.is_backed(symbolic[0]) or 0 in shape:
        return None
    return [-1 if not isinstance(s, int) else s for s in shape]


def _read_from(graph: torch.fx.Graph, source: torch.fx.Node, shape: list) -> list:
    """``shape`` (``source``'s sizes apart from size-1 axes) with each symbolic size read from
    ``source`` by a ``sym_size`` node."""
    dims = [d for d, s in enumerate(meta_of(source).shape) if not (isinstance(s, int) and s == 1)]
    written, kept = [], iter(dims)
    for size in shape:
        if isinstance(size, int) and size == 1:
            written.append(1)
            continue
        dim = next(kept)
        if isinstance(size, int):
            written.append(size)
        elif source.target in VIEWS and isinstance(source.args[1][dim], torch.fx.Node):
            written.append(source.args[1][dim])     # the size node the source view was written with
        else:
            read = graph.call_function(aten.sym_size.int, (source, dim))
            read.meta["val"] = meta_of(source).shape[dim]
            written.append(read)
    return written


def _unit_axes_apart(a: list, b: list) -> bool:
    """The two shapes differ only by size-1 axes."""
    def kept(shape: list) -> list:
        return [s for s in shape if not (isinstance(s, int) and s == 1)]
    return compat.same_sizes(kept(a), kept(b))


def _hoist(graph: torch.fx.Graph, view: torch.fx.Node) -> int:
    """``view(f(args))`` -> ``f(view(args))``; 1 if rewritten."""
    if view.op != "call_function" or view.target not in VIEWS:
        return 0
    source = view.args[0]
    if not isinstance(source, torch.fx.Node) or not _elementwise(source) or len(source.users) != 1:
        return 0
    if not _feeds_kernel(view) or not _only_kernels_use(view):
        return 0        # a view an extern call reads is written anyway: its source kernel writes it
    shape = list(meta_of(view).shape)
    if not static_sizes(shape):
        return 0
    tensors = [a for a in source.all_input_nodes if meta_of(a).dim()]
    seen: dict = {}
    if not tensors or not all(_hoistable_operand(a, source, shape, seen) for a in tensors):
        return 0
    if not all(_viewable(meta_of(a), shape) for a in tensors):
        return 0
    with graph.inserting_before(source):
        viewed = {}
        for a in tensors:
            viewed[a] = graph.call_function(aten.view.default, (a, shape))
            viewed[a].meta["val"] = meta_of(a).view(shape)
        moved = graph.call_function(source.target, *_remap(source, viewed))
        moved.meta["val"] = meta_of(view)
    view.replace_all_uses_with(moved)
    graph.erase_node(view)
    graph.erase_node(source)
    return 1


def _hoist_shared(graph: torch.fx.Graph, view: torch.fx.Node) -> int:
    """``view(f(args))`` -> ``f'(view'(args))`` where a reduction over the view's shape reads it
    (directly or through elementwise nodes of that shape), ``f`` is elementwise with operands of
    its shape or broadcast to it, and the view regroups axes (each group of the old shape's axes is
    one group of the new shape's, :func:`_axis_groups`): each broadcast operand is viewed to the
    new shape's groups (size 1 where it broadcast). Unlike :func:`_hoist`, ``f`` may have other
    users and its operands may be computed by kernels: the others read ``f'`` viewed back to the
    old shape (a free view of the value the reduction's kernel then writes). A group norm's
    per-group statistics read the convolution output plus its bias, or the SiLU gradient, through
    a ``[N, C, H, W] -> [N, G, C/G, H*W]`` view: moved, that work joins the statistics' kernel
    instead of being a kernel of its own that writes a full-size tensor for it. 1 if rewritten."""
    if view.op != "call_function" or view.target not in VIEWS or view.meta.get("viewed_back"):
        return 0
    source = view.args[0]
    if not isinstance(source, torch.fx.Node) or not _broadcast_elementwise(source):
        return 0
    old, new = list(meta_of(source).shape), list(meta_of(view).shape)
    if not static_sizes(old) or not static_sizes(new) or old == new \
            or not all(_kernel_kind(u) in ("pointwise", "reduction") for u in view.users) \
            or not _reduction_reads(view, new):
        return 0
    groups = _axis_groups(old, new)
    if groups is None:
        return 0
    operands = {}
    for a in source.all_input_nodes:
        value = meta_of(a)
        if not isinstance(value, torch.Tensor) or not value.dim():
            continue
        shape = _regrouped(list(value.shape), old, new, groups)
        if shape is None or not static_sizes(value.shape) or not _viewable(value, shape):
            return 0
        operands[a] = shape
    if not operands:
        return 0
    with graph.inserting_before(source):
        viewed = {a: _view_of(graph, a, shape) for a, shape in operands.items()}
        moved = call_with_value(graph, source.target, *_remap(source, viewed))
        if not _viewable(meta_of(moved), old):
            for node in [moved, *viewed.values()]:
                graph.erase_node(node)
            return 0
        back = call_with_value(graph, aten.view.default, (moved, old))
        back.meta["viewed_back"] = True
    view.replace_all_uses_with(moved)
    graph.erase_node(view)
    for user in [u for u in source.users if u.target in VIEWS]:
        shape = list(meta_of(user).shape)
        if static_sizes(shape) and _viewable(meta_of(moved), shape):
            # a view of the old value: that view of the new one
            if shape == new:
                user.replace_all_uses_with(moved)
                graph.erase_node(user)
            else:
                user.args = (moved, shape)
    source.replace_all_uses_with(back)
    graph.erase_node(source)
    if not back.users:
        graph.erase_node(back)
    return 1


def _view_of(graph: torch.fx.Graph, value: torch.fx.Node, shape: list) -> torch.fx.Node:
    """``value`` viewed to ``shape``, a view of a view taken from the first view's source (which
    may already have ``shape``: an operand viewed back by an earlier hoist)."""
    if value.target in VIEWS and isinstance(value.args[0], torch.fx.Node) and _viewable(meta_of(value.args[0]), shape):
        value = value.args[0]
        if list(meta_of(value).shape) == shape:
            return value
    return call_with_value(graph, aten.view.default, (value, shape))


def _broadcast_elementwise(node: torch.fx.Node) -> bool:
    """A pointwise node asking for no rank-specific layout whose tensor operands have its shape or
    broadcast to it (at most its rank, each size its size or 1)."""
    if node.op != "call_function" or classify(node)[0] != "pointwise" \
            or node.kwargs.get("memory_format") not in LAYOUT_FREE or not isinstance(meta_of(node), torch.Tensor):
        return False
    shape = tuple(meta_of(node).shape)
    for arg in node.all_input_nodes:
        value = meta_of(arg)
        if not isinstance(value, torch.Tensor) or value.dim() > len(shape):
            return False
        if any(s not in (1, t) for s, t in zip(reversed(tuple(value.shape)), reversed(shape))):
            return False
    return True


def _kernel_kind(node: torch.fx.Node) -> str | None:
    """What ``node`` is to fusion: ``classify``'s kind, with the operators fuse rewrites into
    reductions before grouping (``var_mean``, ``mean``, norms: :data:`REDUCING`) as reductions."""
    if node.op == "call_function" and node.target in REDUCING:
        return "reduction"
    return classify(node)[0]


def _reduction_reads(view: torch.fx.Node, shape: list) -> bool:
    """A reduction reads ``view``'s value, directly or through elementwise nodes of ``shape``."""
    todo, seen = list(view.users), set()
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        kind = _kernel_kind(node)
        if kind == "reduction":
            return True
        if kind == "pointwise" and isinstance(meta_of(node), torch.Tensor) and list(meta_of(node).shape) == shape:
            todo.extend(node.users)
    return False


def _axis_groups(old: list, new: list) -> list | None:
    """The reshape ``old -> new`` as consecutive groups of axes ``((i, j), (k, l))``: old axes
    ``i..j-1`` hold the elements of new axes ``k..l-1`` (equal products, size-1 axes joining the
    group before them), or None when an axis is split across groups."""
    groups, i, k = [], 0, 0
    while i < len(old) or k < len(new):
        start_i, start_k = i, k
        p = q = 1
        if i < len(old):
            p, i = old[i], i + 1
        if k < len(new):
            q, k = new[k], k + 1
        while p != q:
            if p < q and i < len(old):
                p, i = p * old[i], i + 1
            elif q < p and k < len(new):
                q, k = q * new[k], k + 1
            else:
                return None
        while i < len(old) and old[i] == 1 and (k >= len(new) or new[k] != 1):
            i += 1
        while k < len(new) and new[k] == 1 and (i >= len(old) or old[i] != 1):
            k += 1
        groups.append(((start_i, i), (start_k, k)))
    return groups


def _regrouped(shape: list, old: list, new: list, groups: list) -> list | None:
    """The shape of an operand broadcast to ``old`` (``shape``) after the reshape to ``new``: per
    group, the new sizes where the operand has the old ones, 1s where it has 1s."""
    full = [1] * (len(old) - len(shape)) + shape
    out = []
    for (i, j), (k, l) in groups:
        if all(s == 1 for s in full[i:j]):
            out += [1] * (l - k)
        elif full[i:j] == old[i:j]:
            out += new[k:l]
        else:
            return None
    return out


def _hoist_permute(graph: torch.fx.Graph, permute: torch.fx.Node) -> int:
    """``permute(f(args), dims)`` -> ``f(permute(args', dims))`` for an elementwise ``f`` whose
    tensor operands come from outside kernels, each broadcast operand ``a`` first viewed to the
    result's rank (leading size-1 axes, a view on any layout): ``f`` then joins the kernel reading
    the permuted value (a convolution's bias, added apart, joins the layer norm over channels that
    reads the convolution through a permute). 1 if rewritten."""
    if permute.op != "call_function" or permute.target is not aten.permute.default:
        return 0
    source = permute.args[0]
    if not isinstance(source, torch.fx.Node) or source.op != "call_function" or len(source.users) != 1:
        return 0
    if classify(source)[0] != "pointwise" or source.kwargs.get("memory_format") not in LAYOUT_FREE:
        return 0
    if not _feeds_kernel(permute) or not _only_kernels_use(permute):
        return 0
    out = meta_of(source)
    dims = list(permute.args[1])
    tensors = [a for a in source.all_input_nodes if isinstance(meta_of(a), torch.Tensor) and meta_of(a).dim()]
    if not tensors or not static_sizes(out.shape):
        return 0
    for a in tensors:
        value = meta_of(a)
        if _in_kernel(a) or value.dim() > out.dim() or not static_sizes(value.shape):
            return 0
    with graph.inserting_before(source):
        moved_args = {}
        for a in tensors:
            value = meta_of(a)
            full = a
            if value.dim() < out.dim():
                full = call_with_value(graph, aten.view.default,
                                       (a, [1] * (out.dim() - value.dim()) + list(value.shape)))
            moved_args[a] = call_with_value(graph, aten.permute.default, (full, dims))
        args, kwargs = _remap(source, moved_args)
        moved = call_with_value(graph, source.target, args, kwargs)
    permute.replace_all_uses_with(moved)
    graph.erase_node(permute)
    graph.erase_node(source)
    return 1


def _sink(graph: torch.fx.Graph, node: torch.fx.Node) -> int:
    """``f(view(y), ...)`` -> ``view(f(y, ...))``; 1 if rewritten."""
    if not _elementwise(node) or _only_kernels_use(node):
        return 0        # f joins its users' kernel instead
    tensors = [a for a in node.all_input_nodes if meta_of(a).dim()]
    if not tensors or not all(a.op == "call_function" and a.target in VIEWS for a in tensors):
        return 0
    sources = [a.args[0] for a in tensors]
    if not static_sizes(meta_of(node).shape) or not all(static_sizes(meta_of(s).shape) for s in sources):
        return 0
    shapes = {tuple(meta_of(s).shape) for s in sources}
    if len(shapes) != 1 or not any(_in_kernel(s) for s in sources):
        return 0
    if not all(meta_of(s).is_contiguous() for s in sources):
        return 0       # f's result is then contiguous too, so viewing it back is valid
    shape = list(meta_of(node).shape)
    with graph.inserting_before(node):
        moved = graph.call_function(node.target, *_remap(node, dict(zip(tensors, sources))))
        moved.meta["val"] = torch.empty_like(meta_of(sources[0]), dtype=meta_of(node).dtype)
        back = graph.call_function(aten.view.default, (moved, shape))
        back.meta["val"] = meta_of(node)
    node.replace_all_uses_with(back)
    graph.erase_node(node)
    return 1


def _remap(node: torch.fx.Node, mapping: dict) -> tuple[tuple, dict]:
    """``node``'s args and kwargs with the nodes in ``mapping`` replaced."""
    def swap(value):
        return mapping.get(value, value) if isinstance(value, torch.fx.Node) else value
    return (tuple(torch.fx.node.map_aggregate(node.args, swap)),
            dict(torch.fx.node.map_aggregate(node.kwargs, swap)))


def hoist_pads(graph: torch.fx.GraphModule) -> int:
    """``constant_pad_nd(view(y))`` -> ``view(constant_pad_nd(y))`` where the pad only appends to
    trailing dims that the view keeps and ``y`` is contiguous (the view then reshapes leading dims
    only, which stays valid on the padded tensor). Returns how many pads moved."""
    return rewrite_in_rounds(graph, (_hoist_pad,))


def _hoist_pad(graph: torch.fx.Graph, pad: torch.fx.Node) -> int:
    if end_padding(pad) is None:
        return 0
    view = pad.args[0]
    if view.op != "call_function" or view.target not in VIEWS or len(view.users) != 1:
        return 0
    source = view.args[0]
    if not isinstance(source, torch.fx.Node) or not isinstance(meta_of(source), torch.Tensor):
        return 0
    before, after = meta_of(source), meta_of(view)
    trailing = len(pad.args[1]) // 2
    if not before.is_contiguous() or before.dim() < trailing or after.dim() < trailing \
            or tuple(before.shape[before.dim() - trailing:]) != tuple(after.shape[after.dim() - trailing:]):
        return 0
    padded_shape = list(meta_of(pad).shape)
    shape = list(after.shape[:after.dim() - trailing]) + padded_shape[len(padded_shape) - trailing:]
    with graph.inserting_before(pad):
        moved = graph.call_function(pad.target, (source, *pad.args[1:]), dict(pad.kwargs))
        moved.meta["val"] = torch.constant_pad_nd(before, list(pad.args[1]))
        back = graph.call_function(aten.view.default, (moved, shape))
        back.meta["val"] = meta_of(pad)
    pad.replace_all_uses_with(back)
    graph.erase_node(pad)
    graph.erase_node(view)
    return 1
