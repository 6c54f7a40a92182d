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
``index`` gathers, ``cat``, five small kernels, a 4 MB bf16 mask) is such a value."""
from __future__ import annotations

import attrs
import torch
import torch.fx
import torch.utils._pytree as pytree

from pipeline import Pass, PassContext, non_negative, option
from pipeline import compat
from pipeline.ir import finish, has_side_effects, is_random


@attrs.frozen
class ConstantFoldOptions:
    max_bytes: int = option(1 << 20, "Largest folded result kept as a graph constant, in bytes.",
                            check=non_negative)
    max_bytes_read_whole: int = option(
        64 << 20, "Largest folded result kept when every remaining consumer is an attention, matmul, "
                  "convolution, embedding or index operator (which read it from memory anyway), in bytes.",
        check=non_negative)


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
    version = "2"

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
        return finish(graph)


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
