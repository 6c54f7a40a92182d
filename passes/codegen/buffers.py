"""Buffers in the generated host code: which values alias which, which own their storage, and
where a kernel may write an output into a buffer that exists already.

- A pointwise kernel writes an output into an input that dies at the call when their layouts
  match, or into the graph input that output is only copied back into (``donors=``, see
  :func:`_donors`): one allocation fewer, and a write-back ``copy_`` of a tensor into itself,
  which ATen skips.
- :func:`reuse_buffers`: a kernel writes an output into the buffer of a tensor that died before
  the call with exactly that layout (``reuse=``).

The decisions are written into the kernel calls' keyword arguments, so a graph stored in the
compile cache keeps them.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from pipeline import compat
from passes.kernel_ir.groups import CompiledKernel, meta_of

aten = torch.ops.aten


# -- aliases and layouts ---------------------------------------------------------------------------
def _is_view_op(target: Any) -> bool:
    """An ATen operator whose result aliases its first argument without writing to it."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    returns = target._schema.returns
    if len(returns) != 1 or returns[0].alias_info is None or returns[0].alias_info.is_write:
        return False
    arguments = target._schema.arguments
    return bool(arguments) and arguments[0].alias_info is not None


def fresh(node: torch.fx.Node) -> bool:
    """The node's value is a tensor computed by the graph (not a graph input or a view of one),
    so its run-time layout is the one recorded in its example value."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        source = node.args[0]
        return isinstance(source, torch.fx.Node) and source.op == "call_function" \
            and not _is_list_view(source) and not _is_view_op(source.target)
    if isinstance(node.target, torch._ops.OpOverload):
        returns = node.target._schema.returns
        if len(returns) == 1 and returns[0].alias_info is not None and returns[0].alias_info.is_write:
            # an in-place write returns its first argument: as fresh as that is
            return isinstance(node.args[0], torch.fx.Node) and fresh(node.args[0])
        return all(r.alias_info is None for r in returns)
    return isinstance(node.target, CompiledKernel)


def _is_list_view(node: torch.fx.Node) -> bool:
    """split/unbind/chunk-like operators returning a list of views of their first argument."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    returns = node.target._schema.returns
    return len(returns) == 1 and returns[0].alias_info is not None and not returns[0].alias_info.is_write \
        and str(returns[0].type).startswith("List")


def view_source(node: torch.fx.Node) -> torch.fx.Node | None:
    """The tensor a view node aliases (for ``getitem`` of a split, the split's input)."""
    if node.op != "call_function":
        return None
    if _is_view_op(node.target):
        source = node.args[0]
    elif node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node) and _is_list_view(node.args[0]):
        source = node.args[0].args[0]
    else:
        return None
    return source if isinstance(source, torch.fx.Node) else None


def tensor_layout(value: Any) -> tuple | None:
    """(sizes, strides, storage offset, dtype) of a tensor example value; sizes may be SymInts."""
    if not isinstance(value, torch.Tensor) or value.is_conj() or value.is_neg():
        return None                     # as_strided would drop a lazy conjugate or negation bit
    try:
        return tuple(value.shape), tuple(value.stride()), value.storage_offset(), value.dtype
    except RuntimeError:        # sparse and other layouts without strides
        return None


# -- donors and reuse ------------------------------------------------------------------------------
def _owns_storage(node: torch.fx.Node) -> bool:
    """The node's value is a buffer of its own that nothing else refers to when it dies: the
    result of an ATen operator that returns a new tensor, or an output of a generated kernel whose
    group holds no view operator (whose eager fallback could then hand back an input's alias).
    Results of a call whose target says ``shares_results`` (it keeps them for later calls) are not."""
    if not fresh(node):
        return False
    if node.target in _UNANNOTATED_ALIASES:
        return False
    producer = node.args[0] if node.target is operator.getitem else node
    kernel = producer.target if isinstance(producer, torch.fx.Node) else None
    if getattr(kernel, "shares_results", False):     # kept by its producer for later calls
        return False
    if isinstance(kernel, CompiledKernel):
        return not any(_is_view_op(n.target) for n in kernel.group.subgraph.graph.nodes if n.op == "call_function")
    return True


# Operators whose result shares its input's storage although their schema does not say so.
_UNANNOTATED_ALIASES = {aten._unsafe_view.default}


def _alias_roots(nodes: list) -> dict:
    """view node -> the tensor it aliases at the root of its chain."""
    roots: dict = {}
    for node in nodes:
        source = view_source(node)
        if source is not None:
            roots[node] = roots.get(source, source)
    return roots


def _donors(node: torch.fx.Node, last_use: dict, order: dict, roots: dict, alias_end: dict) -> tuple | None:
    """For a generated kernel's call: per output, the index of an input whose buffer it can take
    (-1: allocate), or None when no output can. An input qualifies when this call is its last use,
    it owns its storage, no alias of it is read here or later, it is passed once, and its shape,
    strides, dtype and device are the output's, which covers the kernel's whole domain."""
    kernel = node.target
    values = node.meta.get("val")
    if not isinstance(kernel, CompiledKernel) or not kernel.writes_inputs_safely() or not isinstance(values, tuple):
        return None
    args = list(node.args)
    aliased_here = {roots[a] for a in args if isinstance(a, torch.fx.Node) and a in roots}
    written_back = _written_back(node, order, aliased_here, alias_end)
    donors, taken = [], set()
    for k, value in enumerate(values):
        pick = -1
        if isinstance(value, torch.Tensor) and compat.same_sizes(value.shape, kernel.group.domain):
            if k in written_back and _same_layout(meta_of(args[written_back[k]]), value):
                pick = written_back[k]
                taken.add(pick)
            for i, arg in enumerate(args if pick < 0 else ()):
                if i in taken or not isinstance(arg, torch.fx.Node) or last_use.get(arg) is not node:
                    continue
                if args.count(arg) > 1 or arg in aliased_here or alias_end.get(arg, -1) >= order[node]:
                    continue
                if _same_layout(meta_of(arg), value) and _owns_storage(arg):
                    pick = i
                    taken.add(i)
                    break
        donors.append(pick)
    return tuple(donors) if any(d >= 0 for d in donors) else None


def _same_layout(held: Any, value: torch.Tensor) -> bool:
    return (isinstance(held, torch.Tensor) and compat.same_sizes(held.shape, value.shape)
            and compat.same_sizes(held.stride(), value.stride()) and held.dtype == value.dtype
            and held.device == value.device)


def _written_back(node: torch.fx.Node, order: dict, aliased_here: set, alias_end: dict) -> dict:
    """{output index: argument position} for outputs of the kernel call ``node`` whose only use is
    the write-back ``copy_`` of a graph input that the kernel reads, once, with nothing reading
    the input or an alias of it between the kernel and the copy. Written into that input (a donor),
    the output makes the copy a no-op (``copy_`` of a tensor into itself returns at once; a kernel
    that allocates anyway, falling back to eager, still gets its output copied)."""
    args = list(node.args)
    picks = {}
    for value in node.users:
        if value.target is not operator.getitem or len(value.users) != 1:
            continue
        (copy,) = value.users
        graph_input = copy.args[0] if copy.target is aten.copy_.default and copy.args[1] is value else None
        if not isinstance(graph_input, torch.fx.Node) or graph_input.op != "placeholder" or copy.users \
                or args.count(graph_input) != 1 or graph_input in aliased_here \
                or alias_end.get(graph_input, -1) >= order[node] \
                or any(order[node] < order[u] and u is not copy for u in graph_input.users):
            continue
        picks[value.args[1]] = args.index(graph_input)
    return picks


def kernel_kwargs(node: torch.fx.Node, last_use: dict, order: dict, roots: dict, alias_end: dict) -> dict:
    """The keyword arguments of a generated kernel's call, ``donors`` included (:func:`_donors`).
    The decision is written into the node's kwargs, so that a graph stored in the compile cache
    keeps it: rebuilt from the cache, a graph has no example values to decide again with, and
    is the very graph the decision was made on."""
    if node.meta.get("val") is None:
        return dict(node.kwargs)
    kwargs = {k: v for k, v in node.kwargs.items() if k != "donors"}    # a planned ``reuse`` stays
    donors = _donors(node, last_use, order, roots, alias_end)
    if donors is not None:
        kwargs["donors"] = donors
    node.kwargs = kwargs
    return kwargs


def liveness(nodes: list) -> tuple[dict, dict, dict, dict]:
    """(last use of each value, graph position of each node, view -> aliased root, root -> position
    of the last use of any alias of it)."""
    last_use: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in nodes:
        for used in node.all_input_nodes:
            last_use[used] = node
    order = {n: i for i, n in enumerate(nodes)}
    roots = _alias_roots(nodes)
    alias_end: dict = {}
    for alias, root in roots.items():
        if alias in last_use:
            alias_end[root] = max(alias_end.get(root, -1), order[last_use[alias]])
    return last_use, order, roots, alias_end


def _size_key(size: Any) -> Any:
    """A size as a dictionary key: the int, or a symbolic size's expression (equal keys: equal
    sizes whatever the symbols' values)."""
    return size if type(size) is int else ("symbolic", str(size.node.expr))


def _layout_key(value: Any) -> tuple | None:
    layout = tensor_layout(value)
    if layout is None:
        return None
    shape, stride, offset, dtype = layout
    return (tuple(map(_size_key, shape)), tuple(map(_size_key, stride)), _size_key(offset), dtype, value.device)


def reuse_buffers(gm: torch.fx.GraphModule, devices: Any = ("cuda",)) -> int:
    """Let each generated kernel write an output into the buffer of a tensor that died before the
    call with exactly that output's layout (shape, strides, storage offset, dtype, device), instead
    of allocating: the kernel's ``reuse=(tensor or None, ...)`` argument, an edge of the graph, so
    the tensor lives until that call and a cached graph keeps the decision. A tensor qualifies when
    it owns its storage (:func:`_owns_storage`), no alias of it is read at or after the call, it
    was not handed to a kernel as a donor, and nothing wrote into it in place. Each allocation
    skipped saves the host an allocator call per run. Only tensors on ``devices`` (device types)
    are reused: on the CPU, malloc hands back the block freed last, still in cache, and writing
    into older, colder buffers made the C++ kernels slower (benchmarks/results/cpu-2026-11-29-e.md).
    Returns the number of outputs that reuse a buffer."""
    graph = gm.graph
    nodes = list(graph.nodes)
    last_use, order, roots, alias_end = liveness(nodes)
    frees_after: dict[int, list] = {}
    for value, user in last_use.items():
        key = _layout_key(meta_of(value))
        if user.op == "output" or key is None or key[-1].type not in devices or not _owns_storage(value):
            continue
        if any(_writes_in_place(u, value) for u in value.users):
            continue
        frees_after.setdefault(max(order[user], alias_end.get(value, -1)), []).append(value)
    donors_of = {n: _donors(n, last_use, order, roots, alias_end) or () for n in nodes
                 if isinstance(n.target, CompiledKernel)}
    pool: dict[tuple, list] = {}
    reused = 0
    for node in nodes:
        values = node.meta.get("val")
        kernel = node.target
        if isinstance(kernel, CompiledKernel) and kernel.accepts_reuse and isinstance(values, tuple) \
                and "reuse" not in node.kwargs:
            donors = donors_of[node]
            picks = []
            for k, value in enumerate(values):
                candidates = pool.get(_layout_key(value)) if not (donors and donors[k] >= 0) else None
                picks.append(candidates.pop() if candidates else None)
            if any(p is not None for p in picks):
                node.kwargs = {**node.kwargs, "reuse": tuple(picks)}
                reused += sum(p is not None for p in picks)
        for value in frees_after.get(order[node], ()):
            user = last_use[value]
            if any(d >= 0 and user.args[d] is value for d in donors_of.get(user, ())):
                continue                # its buffer became an output of the kernel that read it last
            pool.setdefault(_layout_key(meta_of(value)), []).append(value)
    if reused:
        gm.recompile()
    return reused


def drop_reuse(gm: torch.fx.GraphModule) -> set[str]:
    """Remove every kernel's ``reuse=`` (a pass that rewrites kernel calls re-plans afterwards with
    :func:`reuse_buffers` on the device types returned: those of the dropped buffers)."""
    devices = set()
    for node in gm.graph.nodes:
        if "reuse" in node.kwargs:
            devices |= {meta_of(b).device.type for b in node.kwargs["reuse"] if b is not None}
            node.kwargs = {k: v for k, v in node.kwargs.items() if k != "reuse"}
    return devices


def _writes_in_place(user: torch.fx.Node, value: torch.fx.Node) -> bool:
    """``user`` is an ATen operator writing into ``value`` (its result then lives in that storage)."""
    target = user.target
    if not isinstance(target, torch._ops.OpOverload) or not user.args or user.args[0] is not value:
        return False
    returns = target._schema.returns
    return bool(returns) and returns[0].alias_info is not None and returns[0].alias_info.is_write
