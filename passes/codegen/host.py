"""The host side of generated code: the straight-line Python that allocates, launches kernels and
calls extern ATen operators, and the graph rewrites that make it cheap per call.

Per-call host overhead decides small-batch and GPU-bound speed: a transformer layer's graph calls
a dozen view operators and a few matmuls around its kernels, and each Python-level call costs
microseconds. Three steps cut it, each visible in the generated code:

- :func:`fold_views`: a chain of view operators (view, permute, split + getitem, transpose...)
  whose base is a freshly computed tensor becomes one ``aten.as_strided`` with the layout the
  chain produces (the layout comes from the example values; symbolic sizes and strides are
  computed from the graph's size inputs). Views of graph inputs are left alone: their storage
  offset is only known at run time.
- :func:`lower_linear`: ``addmm(b, x, permute(w, [1, 0]))`` becomes ``aten.linear(x, w, b)``,
  which ATen runs as that very addmm (same kernel, same numerics) in one call instead of two.
- :class:`HostGraphModule`: the graph's ``forward`` is our own generated source, calling each
  ATen operator's C++ entry point directly (no ``OpOverload.__call__`` frame, no attribute chain
  ``torch.ops.aten.x.y`` per call; the common extern operators through torch's unboxed Python
  bindings, :data:`FAST_BINDINGS`; folded views as ``reinterpret_tensor`` aliases) and each
  kernel's launch method. A pointwise kernel writes an output into an input that dies at the
  call when their layouts match (``donors=``, see :func:`_donors`): one allocation fewer.

The graph stays an ordinary FX graph of executable nodes: ``as_strided`` and ``linear`` are ATen
operators, so verification and printing work as after any other pass.
"""
from __future__ import annotations

import keyword
import math
import operator
import re
from typing import Any

import torch
import torch.fx

from pipeline import compat
from passes.kernel_ir.groups import CompiledKernel, meta_of
from pipeline.ir import transposed_matrix

aten = torch.ops.aten


# -- view folding --------------------------------------------------------------------------------
def _is_view_op(target: Any) -> bool:
    """An ATen operator whose result aliases its first argument without writing to it."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    returns = target._schema.returns
    if len(returns) != 1 or returns[0].alias_info is None or returns[0].alias_info.is_write:
        return False
    arguments = target._schema.arguments
    return bool(arguments) and arguments[0].alias_info is not None


def _fresh(node: torch.fx.Node) -> bool:
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
            return isinstance(node.args[0], torch.fx.Node) and _fresh(node.args[0])
        return all(r.alias_info is None for r in returns)
    return isinstance(node.target, CompiledKernel)


def _is_list_view(node: torch.fx.Node) -> bool:
    """split/unbind/chunk-like operators returning a list of views of their first argument."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    returns = node.target._schema.returns
    return len(returns) == 1 and returns[0].alias_info is not None and not returns[0].alias_info.is_write \
        and str(returns[0].type).startswith("List")


def _view_source(node: torch.fx.Node) -> torch.fx.Node | None:
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


def _layout(value: Any) -> tuple | None:
    """(sizes, strides, storage offset, dtype) of a tensor example value; sizes may be SymInts."""
    if not isinstance(value, torch.Tensor) or value.is_conj() or value.is_neg():
        return None                     # as_strided would drop a lazy conjugate or negation bit
    try:
        return tuple(value.shape), tuple(value.stride()), value.storage_offset(), value.dtype
    except RuntimeError:        # sparse and other layouts without strides
        return None


class _SizeNodes:
    """Graph values for symbolic sizes: each symbol is read from the placeholder Dynamo passes it
    in, and an expression of symbols (``768*s0``) becomes ``operator`` nodes, made once each."""

    def __init__(self, graph: torch.fx.Graph):
        self.graph = graph
        self.made: dict = {}
        for node in graph.find_nodes(op="placeholder"):
            value = node.meta.get("val")
            if isinstance(value, torch.SymInt) and value.node.expr.is_Symbol:
                self.made.setdefault(value.node.expr, node)

    def value(self, size: Any) -> Any:
        """An int, or a node computing the SymInt ``size`` (None when it cannot be written)."""
        if type(size) is int:
            return size
        if not isinstance(size, torch.SymInt):
            return None
        return self._expression(size.node.expr)

    def _expression(self, expr: Any) -> Any:
        if expr.is_Integer:
            return int(expr)
        if expr in self.made:
            return self.made[expr]
        combine = operator.add if expr.is_Add else operator.mul if expr.is_Mul else None
        if combine is None:
            return None
        terms = [self._expression(a) for a in expr.args]
        if any(t is None for t in terms):
            return None
        node = terms[0]
        for term in terms[1:]:
            node = self.graph.call_function(combine, (node, term))
        self.made[expr] = node
        return node

    def values(self, sizes: tuple) -> list | None:
        out = [self.value(s) for s in sizes]
        return None if any(v is None for v in out) else out


def fold_views(gm: torch.fx.GraphModule) -> int:
    """Replace every view chain rooted in a computed tensor by one ``as_strided`` of that tensor;
    returns how many view nodes were replaced (the intermediate ones die). Symbolic sizes and
    strides are computed in the graph from the size placeholders (:class:`_SizeNodes`)."""
    graph = gm.graph
    base: dict[torch.fx.Node, torch.fx.Node] = {}
    sizes = _SizeNodes(graph)
    folded = 0
    for node in list(graph.nodes):
        source = _view_source(node)
        if source is None:
            continue
        root = base.get(source, source)
        if not _fresh(root):
            continue
        layout, root_layout = _layout(meta_of(node)), _layout(meta_of(root))
        if layout is None or root_layout is None or layout[3] != root_layout[3] or type(layout[2]) is not int:
            continue
        base[node] = root
        if all(_view_source(user) is not None for user in node.users):
            continue                       # only an intermediate step of a longer chain
        if node.target is aten.as_strided.default and node.args[0] is root:
            continue
        with graph.inserting_before(node):
            shape, stride = sizes.values(layout[0]), sizes.values(layout[1])
            if shape is None or stride is None:
                continue
            replacement = graph.call_function(aten.as_strided.default, (root, shape, stride, layout[2]))
        replacement.meta = dict(node.meta)
        node.replace_all_uses_with(replacement)
        base[replacement] = root
        folded += 1
    graph.eliminate_dead_code()
    gm.recompile()
    return folded


# -- linear --------------------------------------------------------------------------------------
def lower_linear(gm: torch.fx.GraphModule) -> int:
    """``addmm(b, x, w.T)`` and ``mm(x, w.T)`` with default scalars become ``linear(x, w[, b])``
    (ATen computes linear of 2-D operands with exactly that addmm/mm), and ``mm(x, w.T.T)`` reads
    ``w`` itself (a backward's product with a weight its forward transposed); returns the count."""
    graph = gm.graph
    lowered = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.kwargs:
            continue
        if node.target is aten.addmm.default and len(node.args) == 3:
            bias, x, transposed = node.args
        elif node.target is aten.mm.default and len(node.args) == 2:
            bias, (x, transposed) = None, node.args
        else:
            continue
        weight = transposed_matrix(transposed)
        x_value = meta_of(x)
        if weight is None or not isinstance(x_value, torch.Tensor) or x_value.dim() != 2:
            continue
        plain = transposed_matrix(weight)
        if plain is not None:       # the transpose of a transpose: the matrix itself, no view at all
            node.replace_input_with(transposed, plain)
            lowered += 1
            continue
        if bias is not None and (not isinstance(meta_of(bias), torch.Tensor) or meta_of(bias).dim() != 1):
            continue
        with graph.inserting_before(node):
            replacement = graph.call_function(aten.linear.default, (x, weight) + ((bias,) if bias is not None else ()))
        replacement.meta = dict(node.meta)
        node.replace_all_uses_with(replacement)
        lowered += 1
    graph.eliminate_dead_code()
    gm.recompile()
    return lowered


# -- generated host source -----------------------------------------------------------------------
_LITERALS = (bool, int, str, type(None))

# Extern operators called through torch's generated Python bindings (C++ argument parsing, unboxed
# call: 1-3 µs less per call than the boxed ``OpOverload`` entry point). Each binding takes the
# overload's arguments in the same order and names and dispatches to that very overload.
FAST_BINDINGS = {
    aten.addmm.default: torch.addmm,
    aten.mm.default: torch.mm,
    aten.bmm.default: torch.bmm,
    aten.baddbmm.default: torch.baddbmm,
    aten.linear.default: torch._C._nn.linear,
    aten.as_strided.default: torch.as_strided,
    aten.view.default: torch.Tensor.view,
    aten.permute.default: torch.permute,
    aten.embedding.default: torch.embedding,
    aten.cat.default: torch.cat,
}


class _Emitter:
    """Writes one graph as a Python function, binding every callable and non-literal constant as a
    global of the generated module."""

    def __init__(self, locals_: set[str]) -> None:
        self.globals: dict[str, Any] = {}
        self._ids: dict[int, str] = {}
        self._taken = set(locals_) | {"self"}

    def bind(self, value: Any, hint: str) -> str:
        if id(value) in self._ids:
            return self._ids[id(value)]
        name = re.sub(r"\W", "_", hint).strip("_") or "g"
        if keyword.iskeyword(name) or name[0].isdigit():
            name = "g_" + name
        stem, index = name, 1
        while name in self._taken:
            index += 1
            name = f"{stem}_{index}"
        self._taken.add(name)
        self.globals[name] = value
        self._ids[id(value)] = name
        return name

    def arg(self, value: Any) -> str:
        if isinstance(value, torch.fx.Node):
            return value.name
        if isinstance(value, _LITERALS):
            return repr(value)
        if isinstance(value, float):
            return repr(value) if math.isfinite(value) else self.bind(value, "float_" + repr(value).strip("-"))
        if isinstance(value, (list, tuple)):
            inner = ", ".join(self.arg(v) for v in value)
            if isinstance(value, tuple):
                return f"({inner},)" if len(value) == 1 else f"({inner})"
            return f"[{inner}]"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{self.arg(k)}: {self.arg(v)}" for k, v in value.items()) + "}"
        return self.bind(value, str(value).replace("torch.", ""))

    def call(self, function: str, args: tuple, kwargs: dict) -> str:
        parts = [self.arg(a) for a in args] + [f"{k}={self.arg(v)}" for k, v in kwargs.items()]
        return f"{function}({', '.join(parts)})"

    def callee(self, target: Any) -> str:
        if isinstance(target, torch._ops.OpOverload) and target in FAST_BINDINGS:
            return self.bind(FAST_BINDINGS[target], f"{target.namespace}_{target._schema.name.split('::')[-1]}")
        if isinstance(target, torch._ops.OpOverload):
            return self.bind(target._op, f"{target.namespace}_{target._schema.name.split('::')[-1]}_{target._overloadname}")
        if isinstance(target, CompiledKernel):
            return self.bind(target.__call__, target.__name__)
        return self.bind(target, getattr(target, "__name__", type(target).__name__))


def supports(graph: torch.fx.Graph) -> bool:
    """Whether :func:`host_source` can write this graph (plain positional placeholders, no pytree
    input/output handling)."""
    if type(graph._codegen) is not torch.fx.graph.CodeGen:
        return False
    return all(not str(n.target).startswith("*") and not n.args for n in graph.nodes if n.op == "placeholder")


def _alias_of_fresh_tensor(node: torch.fx.Node, emitter: _Emitter) -> str | None:
    """An ``as_strided`` of a tensor the graph computed (what :func:`fold_views` writes) as a call
    of ``reinterpret_tensor``: the same alias at half the cost per call. The graph runs inside
    compiled code, where no autograd view tracking is needed (AOTAutograd's compiled forward and
    backward run without grad; inference graphs take no input that requires grad)."""
    if node.target is not aten.as_strided.default or node.kwargs or len(node.args) != 4:
        return None
    base = node.args[0]
    reinterpret = compat.reinterpret_tensor()
    if reinterpret is None or not isinstance(base, torch.fx.Node) or not _fresh(base):
        return None
    size, stride, offset = node.args[1:]
    if not isinstance(offset, int):
        return None
    function = emitter.bind(reinterpret, "reinterpret_tensor")
    if base.meta.get("val") is None:
        # A graph rebuilt from the compile cache has no example values: read the base's storage
        # offset at run time (a fresh tensor carries no lazy conjugate or negation bit).
        return (f"{function}({emitter.arg(base)}, {emitter.arg(size)}, {emitter.arg(stride)}, "
                f"{offset} - {emitter.arg(base)}.storage_offset())")
    layout = _layout(meta_of(base))
    if layout is None or type(layout[2]) is not int:
        return None
    return emitter.call(function, (base, size, stride, offset - layout[2]), {})


def _owns_storage(node: torch.fx.Node) -> bool:
    """The node's value is a buffer of its own that nothing else refers to when it dies: the
    result of an ATen operator that returns a new tensor, or an output of a generated kernel whose
    group holds no view operator (whose eager fallback could then hand back an input's alias).
    Results of a call whose target says ``shares_results`` (it keeps them for later calls) are not."""
    if not _fresh(node):
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
        source = _view_source(node)
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


def _kernel_kwargs(node: torch.fx.Node, last_use: dict, order: dict, roots: dict, alias_end: dict) -> dict:
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


def _liveness(nodes: list) -> tuple[dict, dict, dict, dict]:
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
    layout = _layout(value)
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
    last_use, order, roots, alias_end = _liveness(nodes)
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


def host_source(graph: torch.fx.Graph) -> tuple[str, dict[str, Any]]:
    """The generated ``forward`` of ``graph`` and the globals it runs with. Values are dropped
    after their last use, as FX's own code does."""
    nodes = list(graph.nodes)
    emitter = _Emitter({n.name for n in nodes})
    last_use, order, roots, alias_end = _liveness(nodes)
    dies_at: dict[torch.fx.Node, list[str]] = {}
    for value, user in last_use.items():
        dies_at.setdefault(user, []).append(value.name)
    params = [n.name for n in nodes if n.op == "placeholder"]
    lines = [f"def forward(self, {', '.join(params)}):" if params else "def forward(self):"]
    for node in nodes:
        note = ""
        if node.op == "placeholder":
            continue
        if node.op == "output":
            lines.append(f"    return {emitter.arg(node.args[0])}")
            break
        if node.op == "get_attr":
            expr = "self." + ".".join(node.target.split("."))
        elif node.op == "call_module":
            expr = emitter.call("self." + node.target, node.args, node.kwargs)
        elif node.op == "call_method":
            expr = emitter.call(f"{emitter.arg(node.args[0])}.{node.target}", node.args[1:], node.kwargs)
        elif node.target is operator.getitem and not node.kwargs:
            expr = f"{emitter.arg(node.args[0])}[{emitter.arg(node.args[1])}]"
        elif (alias := _alias_of_fresh_tensor(node, emitter)) is not None:
            expr = alias
        elif isinstance(node.target, CompiledKernel):
            kwargs = _kernel_kwargs(node, last_use, order, roots, alias_end)
            launch = node.target.launcher(kwargs)
            if launch is None:
                expr = emitter.call(emitter.callee(node.target), node.args, kwargs)
            else:       # the call site's keywords are built into its launcher: shown as a comment
                expr = emitter.call(emitter.bind(launch, launch.__name__), node.args, {})
                note = "  # " + ", ".join(f"{k}={emitter.arg(v)}" for k, v in kwargs.items()) if kwargs else ""
        else:
            expr = emitter.call(emitter.callee(node.target), node.args, node.kwargs)
        line = f"    {node.name} = {expr}" if node.users else f"    {expr}"
        if node in dies_at:
            line += f"; del {', '.join(dies_at[node])}"
        lines.append(line + note)
    return "\n".join(lines) + "\n", emitter.globals


class HostGraphModule(torch.fx.GraphModule):
    """A GraphModule whose ``forward`` is :func:`host_source`'s code (regenerated by every
    ``recompile()``, so later passes may still edit the graph). ``code`` shows that source."""

    def recompile(self):
        result = super().recompile()
        if supports(self.graph):
            source, namespace = host_source(self.graph)
            namespace = dict(namespace, __builtins__=__builtins__)
            exec(compile(source, f"<host {id(self):x}>", "exec"), namespace)    # noqa: S102 - our own generated source
            self._code = source
            type(self).forward = namespace["forward"]
        return result


def to_host_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` as a :class:`HostGraphModule` (same graph and attributes), when its graph is plain."""
    if isinstance(gm, HostGraphModule) or not supports(gm.graph):
        return gm
    host = HostGraphModule(gm, gm.graph)
    host.meta = dict(getattr(gm, "meta", {}))
    return host
