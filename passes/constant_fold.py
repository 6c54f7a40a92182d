"""``constant-fold``: compute, at compile time, values that depend on no graph input.

A node folds when it is a pure, deterministic call whose every input is a constant (a tensor
attribute of the graph, or another foldable node) and its result is a tensor no larger than
``max_bytes``. Lone factory calls (``full``, ``arange`` with no tensor input) are left in place:
a fused kernel can make them for free, while a folded copy costs memory traffic.

A larger result folds too, up to ``max_bytes_read_whole``, when every consumer left in the graph
is an operator that reads its operands from memory anyway (attention, matmuls, convolution,
embedding and index lookups): the value was going to be written out and read back on every call,
so keeping it costs memory but no traffic, and saves the kernels and host calls that made it.
The attention mask transformers builds from positions alone (GPT-2 prefill: ``cumsum``, two
``index`` gathers, ``cat``, five small kernels, a 4 MB bf16 mask) is such a value.

In a graph with symbolic sizes that mask depends on the sequence length, a graph input. Values
that depend on symbolic sizes and constants alone (``per_size``) are computed at run time once
per size seen instead: the subgraph that makes them becomes one :class:`PerSizeValues` call,
which runs it the first time a size is seen and returns the same tensors afterwards. The same
size limits apply, at the compile-time sizes; a value that reaches a graph output is left alone
(the caller would hold the shared tensor). An attention call reading such a mask looks at each
mask once and runs without it where it is the causal pattern or hides nothing
(:mod:`passes.per_size_attention`)."""
from __future__ import annotations

import operator
from typing import Any

import attrs
import torch
import torch.fx
import torch.utils._pytree as pytree

from pipeline import Pass, PassContext, non_negative, option
from pipeline import compat
from pipeline.ir import dependencies, finish, has_side_effects, is_random, node_args_hashable, restore_order
from passes.per_size_attention import dispatch_per_size_masks


@attrs.frozen
class ConstantFoldOptions:
    max_bytes: int = option(1 << 20, "Largest folded result kept as a graph constant, in bytes.",
                            check=non_negative)
    max_bytes_read_whole: int = option(
        64 << 20, "Largest folded result kept when every remaining consumer is an attention, matmul, "
                  "convolution, embedding or index operator (which read it from memory anyway), in bytes.",
        check=non_negative)
    per_size: bool = option(
        True, "In graphs with symbolic sizes: compute values that depend on the sizes and constants alone "
              "(masks, position ids) once per size seen, at run time, instead of on every call.")
    per_size_entries: int = option(16, "Sizes whose per-size values are kept (the oldest is dropped).",
                                   check=non_negative)
    per_size_mask_forms: bool = option(
        True, "Attention whose mask is a per-size value looks at each mask once: one that is the causal pattern "
              "runs as is_causal=True without it, one that hides nothing runs without it (a dynamic decoder's "
              "causal mask).", tune=(True, False))


_READ_WHOLE = ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.convolution", "aten.embedding",
               "aten.index", "aten.index_select", "aten.scaled_dot_product_attention")


def _reads_whole(node: torch.fx.Node) -> bool:
    """Whether ``node`` is an operator that reads its tensor operands from memory (an extern call
    that no fused kernel computes its inputs into)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    name = node.target.name().replace("::", ".").split(".")
    name = ".".join(name[:2])
    return name in _READ_WHOLE or name.startswith("aten._scaled_dot_product")


def _is_symbolic(value) -> bool:
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


class ConstantFold(Pass):
    """Evaluate input-independent subgraphs once and store their results as graph constants."""

    name = "constant-fold"
    Options = ConstantFoldOptions
    version = "5"

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        values: dict[torch.fx.Node, object] = {}
        has_node_input: dict[torch.fx.Node, bool] = {}
        with compat.real_tensors(), torch.no_grad():
            for node in graph.graph.nodes:
                if node.op == "get_attr":
                    value = _attr(graph, node.target)
                    if isinstance(value, torch.Tensor) and not compat.is_fake(value):
                        values[node] = value
                        has_node_input[node] = True
                    continue
                if node.op != "call_function" or has_side_effects(node) or is_random(node):
                    continue
                inputs = [a for a in pytree.tree_leaves((node.args, node.kwargs))
                          if isinstance(a, torch.fx.Node)]
                if any(a not in values for a in inputs):
                    continue
                if any(_is_symbolic(a) for a in pytree.tree_leaves((node.args, node.kwargs))):
                    continue
                args, kwargs = pytree.tree_map_only(torch.fx.Node, values.__getitem__, (node.args, node.kwargs))
                try:
                    result = node.target(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - not foldable; the graph keeps the node
                    context.note(f"not folded {node.name}: {type(exc).__name__}: {exc}")
                    continue
                if not isinstance(result, torch.Tensor) or compat.is_fake(result):
                    continue
                values[node] = result
                has_node_input[node] = bool(inputs)
        folded = 0
        kept: list[tuple[str, torch.Tensor]] = []
        for node, value in values.items():
            if node.op == "get_attr" or not has_node_input.get(node):
                continue
            if all(user in values for user in node.users):
                continue
            size = value.numel() * value.element_size()
            read_whole = all(_reads_whole(user) for user in node.users if user not in values)
            limit = max(self.options.max_bytes, self.options.max_bytes_read_whole if read_whole else 0)
            if size > limit:
                which = "max_bytes_read_whole" if read_whole else "max_bytes"
                context.note(f"not folded {node.name}: {size} bytes > {which} {limit}")
                continue
            attr = _same_constant(kept, value)   # an equal value folded already (per-layer copies of a mask)
            if attr is None:
                attr = f"_folded_{len(kept)}_{node.name}"
                stored = value.contiguous()
                graph.register_buffer(attr, stored)
                kept.append((attr, stored))
            with graph.graph.inserting_before(node):
                new = graph.graph.get_attr(attr)
            new.meta = dict(node.meta)
            node.replace_all_uses_with(new)
            folded += 1
        if folded:
            context.note(f"folded {folded} constant subexpression(s)")
            for node in reversed(list(graph.graph.nodes)):
                if not node.users and not has_side_effects(node) and node in values:
                    graph.graph.erase_node(node)
        if self.options.per_size and self.options.per_size_entries:
            self._fold_per_size(graph, context, set(values))
        return finish(graph)

    def _limit(self, node: torch.fx.Node, inside: set) -> int:
        read_whole = all(_reads_whole(user) for user in node.users if user not in inside)
        return max(self.options.max_bytes, self.options.max_bytes_read_whole if read_whole else 0)

    def _fold_per_size(self, graph: torch.fx.GraphModule, context: PassContext, constants: set) -> None:
        determined = _size_determined(graph.graph, constants)
        merged = _merge_equal(graph.graph, determined)
        if merged:
            context.note(f"merged {merged} size-determined node(s) equal to an earlier one (per-layer copies "
                         "of a mask), so each value is computed and returned once per size")
        chosen = []
        for node in determined:
            value = node.meta.get("val")
            if (not isinstance(value, torch.Tensor) or not any(u not in determined for u in node.users)
                    or not any(isinstance(a, torch.fx.Node) and a in determined
                               and isinstance(a.meta.get("val"), torch.Tensor) for a in node.all_input_nodes)):
                continue        # a scalar, used only inside, or a lone factory (kernels make those for free)
            if _reaches_output(node):
                continue
            size = compat.size_hint(value.numel()) * value.element_size()
            if size > self._limit(node, determined):
                context.note(f"not folded per size {node.name}: {size} bytes at the compile-time sizes")
                continue
            chosen.append(node)
        if not chosen:
            return
        module, roots = _subgraph(graph, chosen)
        name = f"per_size_{chosen[0].name}"
        values = PerSizeValues(module, self.options.per_size_entries, name)
        with graph.graph.inserting_before(chosen[0]):     # restore_order moves it after its last size root
            call = graph.graph.call_function(values, tuple(roots))
        call.meta["val"] = tuple(n.meta["val"] for n in chosen)
        for index, node in enumerate(chosen):
            with graph.graph.inserting_after(call):
                item = graph.graph.call_function(operator.getitem, (call, index))
            item.meta = dict(node.meta)
            node.replace_all_uses_with(item, delete_user_cb=lambda user: user is not item)
        restore_order(graph.graph)
        for node in reversed(list(graph.graph.nodes)):
            if node in determined and not node.users and not has_side_effects(node):
                graph.graph.erase_node(node)
        if self.options.per_size_mask_forms:
            dispatched = dispatch_per_size_masks(graph.graph, set(call.users))
            if dispatched:
                context.note(f"{dispatched} attention call(s) read a per-size mask: each mask's form (causal, "
                             "hiding nothing, other) is found once and the call made without it where it can")
        context.note(f"folded per size: {len(chosen)} value(s) of {len(module.graph.nodes) - len(roots) - 1} "
                     f"node(s), computed once per size of {', '.join(str(r.meta['val']) for r in roots)}")


class PerSizeValues:
    """Tensors determined by symbolic sizes alone (a mask, position ids), computed once per size:
    called with the sizes' values it runs ``module`` on them the first time and returns the same
    tensors afterwards, keeping the last ``entries`` sizes (and, for good, those read while a CUDA
    graph was being recorded: the recording reads their memory). A pass re-tracing the graph
    records it as one call again; called with symbolic sizes otherwise (fake propagation) it runs
    the module. Its results are shared between calls: the graph must not write into them or hand
    their buffers to another value (``shares_results``)."""

    shares_results = True

    def __init__(self, module: torch.fx.GraphModule, entries: int, name: str):
        self.module = module
        self.entries = entries
        self.__name__ = name
        self.values: dict[tuple, tuple] = {}
        self.pinned: set[tuple] = set()     # sizes whose tensors a CUDA-graph recording reads: never dropped
        self.watch_capture = torch.cuda.is_available()

    def __call__(self, *sizes: int) -> tuple:
        if compat.tracing_now():        # a pass re-tracing the graph keeps this one call
            return compat.traced_as_one_call(self, sizes, lambda: tuple(self.module(*sizes)))
        if not all(type(s) is int for s in sizes):
            return tuple(self.module(*sizes))
        found = self.values.get(sizes)
        if found is None:
            with torch.no_grad():
                found = tuple(self.module(*sizes))
            for old in [k for k in self.values if k not in self.pinned][:max(0, len(self.values) - self.entries + 1)]:
                del self.values[old]
            self.values[sizes] = found
        if self.watch_capture and sizes not in self.pinned and compat.capturing_cuda_graph():
            self.pinned.add(sizes)      # a CUDA-graph recording reads this memory from now on
        return found

    def __repr__(self) -> str:
        return f"PerSizeValues({self.__name__}, {len(self.values)} size(s))"

    def to_data(self, codec: Any) -> dict:
        """The subgraph computing the values, for the compile cache (values are computed again)."""
        return {"module": codec.subgraph_to_data(self.module, self.__name__), "entries": self.entries,
                "name": self.__name__}

    @classmethod
    def from_data(cls, data: dict, codec: Any) -> "PerSizeValues":
        return cls(codec.subgraph_from_data(data["module"]), data["entries"], data["name"])


def _is_size_root(node: torch.fx.Node) -> bool:
    """A symbolic size the graph receives: a SymInt placeholder or a ``sym_size`` of an input."""
    if not _is_symbolic(node.meta.get("val")):
        return False
    return node.op == "placeholder" or (node.op == "call_function" and node.target in _SIZE_QUERIES)


_SIZE_QUERIES = {torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int, torch.ops.aten.sym_numel.default}


def _size_determined(graph: torch.fx.Graph, constants: set) -> dict:
    """Pure nodes whose value follows from symbolic sizes and constants (``constants``: nodes with
    values computable at compile time) alone, reading at least one size, in graph order, each
    mapped to True; size roots included."""
    determined: dict = {}
    constant: set = set()
    for node in graph.nodes:
        if _is_size_root(node):
            determined[node] = True
        elif node.op == "get_attr" or node in constants:
            constant.add(node)
        elif node.op == "call_function" and not has_side_effects(node) and not is_random(node):
            inputs = node.all_input_nodes
            if inputs and all(a in determined or a in constant for a in inputs) \
                    and any(a in determined for a in inputs):
                determined[node] = True
    return determined


def _merge_equal(graph: torch.fx.Graph, determined: dict) -> int:
    """Merge each node of ``determined``, and each pure node with no input, that applies the same
    operator to the same arguments as an earlier one into that one (``cse`` runs later: this makes
    the per-size subgraph return one mask where each layer built its own copy); returns how many."""
    seen: dict = {}
    merged = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or not (node in determined or (
                not node.all_input_nodes and not has_side_effects(node) and not is_random(node))):
            continue
        try:
            key = (node.target, node_args_hashable(node.args), node_args_hashable(node.kwargs))
            hash(key)
        except TypeError:
            continue
        first = seen.setdefault(key, node)
        if first is not node:
            node.replace_all_uses_with(first)
            graph.erase_node(node)
            determined.pop(node, None)
            merged += 1
    return merged


def _reaches_output(node: torch.fx.Node) -> bool:
    """Whether ``node``'s value, or a view of it, is a graph output."""
    pending, seen = [node], set()
    while pending:
        current = pending.pop()
        for user in current.users:
            if user.op == "output":
                return True
            if user not in seen and (user.target is operator.getitem or compat.is_view_op(user.target)):
                seen.add(user)
                pending.append(user)
    return False


def _subgraph(graph: torch.fx.GraphModule, outputs: list) -> tuple[torch.fx.GraphModule, list]:
    """The nodes ``outputs`` need, copied into a graph of their own whose placeholders are the
    size roots they read; returns it and those roots (nodes of ``graph``)."""
    needed = dependencies(outputs)
    sub = torch.fx.Graph()
    copied: dict = {}
    roots = [n for n in graph.graph.nodes if n in needed and _is_size_root(n)]
    for root in roots:
        copied[root] = sub.placeholder(root.name)
        copied[root].meta = dict(root.meta)
    attributes = {}
    for node in graph.graph.nodes:
        if node in needed and node not in copied:
            if node.op == "get_attr":
                attributes[node.target] = _attr(graph, node.target)
            copied[node] = sub.node_copy(node, copied.__getitem__)
    sub.output(tuple(copied[n] for n in outputs))
    return torch.fx.GraphModule(attributes, sub), roots


def _same_constant(kept: list[tuple[str, torch.Tensor]], value: torch.Tensor) -> str | None:
    """The attribute of a kept constant equal to ``value`` (shape, dtype, device and elements)."""
    for attr, other in kept:
        if (other.shape == value.shape and other.dtype == value.dtype and other.device == value.device
                and torch.equal(other, value)):
            return attr
    return None


def _attr(gm: torch.nn.Module, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj
