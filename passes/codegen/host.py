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
  kernel's launch method, with the buffers it may write into (``donors=``, ``reuse=``: see
  :mod:`passes.codegen.buffers`).

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

from .buffers import fresh, kernel_kwargs, liveness, tensor_layout, view_source

aten = torch.ops.aten


# -- view folding --------------------------------------------------------------------------------

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
        source = view_source(node)
        if source is None:
            continue
        root = base.get(source, source)
        if not fresh(root):
            continue
        layout, root_layout = tensor_layout(meta_of(node)), tensor_layout(meta_of(root))
        if layout is None or root_layout is None or layout[3] != root_layout[3] or type(layout[2]) is not int:
            continue
        base[node] = root
        if all(view_source(user) is not None for user in node.users):
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
    if node.target is not aten.as_strided.default or node.kwargs or len(node.args) not in (3, 4):
        return None
    base = node.args[0]
    reinterpret = compat.reinterpret_tensor()
    if reinterpret is None or not isinstance(base, torch.fx.Node) or not fresh(base):
        return None
    size, stride, offset = (*node.args[1:], None)[:3]
    function = emitter.bind(reinterpret, "reinterpret_tensor")
    if offset is None:              # as_strided keeps the base's own storage offset
        return emitter.call(function, (base, size, stride, 0), {})
    if not isinstance(offset, int):
        return None
    if base.meta.get("val") is None:
        # A graph rebuilt from the compile cache has no example values: read the base's storage
        # offset at run time (a fresh tensor carries no lazy conjugate or negation bit).
        return (f"{function}({emitter.arg(base)}, {emitter.arg(size)}, {emitter.arg(stride)}, "
                f"{offset} - {emitter.arg(base)}.storage_offset())")
    layout = tensor_layout(meta_of(base))
    if layout is None or type(layout[2]) is not int:
        return None
    return emitter.call(function, (base, size, stride, offset - layout[2]), {})


def host_source(graph: torch.fx.Graph) -> tuple[str, dict[str, Any]]:
    """The generated ``boxed_forward(args)`` and ``forward(*inputs)`` of ``graph`` and the globals
    they run with. ``boxed_forward`` takes the inputs as a list it empties (AOTAutograd's boxed
    calling convention); values, inputs included, are dropped after their last use."""
    nodes = list(graph.nodes)
    emitter = _Emitter({n.name for n in nodes})
    last_use, order, roots, alias_end = liveness(nodes)
    dies_at: dict[torch.fx.Node, list[str]] = {}
    for value, user in last_use.items():
        dies_at.setdefault(user, []).append(value.name)
    params = [n.name for n in nodes if n.op == "placeholder"]
    # The body takes its inputs boxed: it empties the caller's list, so that each input (a saved
    # activation in a backward) is freed at its last use, as eager autograd frees them.
    lines = ["def boxed_forward(self, args):"]
    if params:
        unused = [n.name for n in nodes if n.op == "placeholder" and not n.users]
        lines.append(f"    {', '.join(params)}, = args; args.clear()" + (f"; del {', '.join(unused)}" if unused else ""))
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
            kwargs = kernel_kwargs(node, last_use, order, roots, alias_end)
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
    lines += ["", f"def forward(self{''.join(', ' + p for p in params)}):",
              f"    return self.boxed_forward([{', '.join(params)}])"]
    return "\n".join(lines) + "\n", emitter.globals


class HostGraphModule(torch.fx.GraphModule):
    """A GraphModule whose ``forward`` is :func:`host_source`'s code (regenerated by every
    ``recompile()``, so later passes may still edit the graph). ``code`` shows that source.
    ``boxed_forward(args)`` runs it on a list of inputs that it empties, so that a caller handing
    over its only references (AOTAutograd's backward, with the saved tensors) lets each input be
    freed at its last use."""

    def recompile(self):
        result = super().recompile()
        if supports(self.graph):
            source, namespace = host_source(self.graph)
            namespace = dict(namespace, __builtins__=__builtins__)
            exec(compile(source, f"<host {id(self):x}>", "exec"), namespace)    # noqa: S102 - our own generated source
            self._code = source
            type(self).forward = namespace["forward"]
            type(self).boxed_forward = namespace["boxed_forward"]
        return result


def to_host_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` as a :class:`HostGraphModule` (same graph and attributes), when its graph is plain."""
    if isinstance(gm, HostGraphModule) or not supports(gm.graph):
        return gm
    host = HostGraphModule(gm, gm.graph)
    host.meta = dict(getattr(gm, "meta", {}))
    return host
