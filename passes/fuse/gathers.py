"""Gathers of elementwise results, rewritten to gather first (``fuse`` option ``sink_gathers``).

``gather(f(x, s), dim, index)`` reads a few elements of a tensor that ``f`` computes in full. When
every operand of ``f`` either has the full shape (it is gathered too) or has size 1 along ``dim``
and broadcasts along the others (a row statistic such as a max or a log-sum), the same values are
``f(gather(x, dim, index), s)``: ``f`` runs on the gathered elements only, and the full tensor is
no longer needed. The rewrite descends through chains of elementwise operators (ATen ops tagged
pointwise, and dtype conversions) as long as the condition holds, and gathers at the first node it
cannot pass.

Where it matters: a cross-entropy loss decomposes into ``log_softmax`` followed by
``gather(logp, 1, target)``. Computed as written, the log-softmax kernel writes the whole
``logp`` (GPT-2: 4096 x 50257 fp32, 824 MB) for the gather to read one element per row. Rewritten,
the kernel only produces the row max and log-sum, and the loss reads ``x[i, target[i]]``.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx

from passes.kernel_ir.groups import meta_of

aten = torch.ops.aten

MAX_GATHERS = 4   # most full-size operands one rewrite may gather (each is one more gather)
MAX_DEPTH = 16    # most elementwise nodes one rewrite passes through


def _elementwise(node: Any) -> bool:
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return False
    target = node.target
    if target is aten._to_copy.default:
        return set(node.kwargs) <= {"dtype", "memory_format"} and len(node.args) == 1
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags \
        and isinstance(meta_of(node), torch.Tensor)


def _sizes(node: Any, rank: int) -> tuple | None:
    """``node``'s sizes right-aligned to ``rank`` (leading 1s), or None for a non-tensor."""
    value = meta_of(node) if isinstance(node, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.dim() > rank:
        return None
    return (1,) * (rank - value.dim()) + tuple(value.shape)


class _Rewrite:
    def __init__(self, graph: torch.fx.Graph, dim: int, index: torch.fx.Node, full: tuple):
        self.graph, self.dim, self.index, self.full = graph, dim, index, full
        self.gathers = 0
        self.depth = 0
        self.made: dict[torch.fx.Node, torch.fx.Node | None] = {}

    def gathered(self, node: torch.fx.Node) -> torch.fx.Node | None:
        """A node computing ``gather(node, dim, index)``, or None when the budget is spent."""
        if node not in self.made:
            self.made[node] = self._gathered(node)
        return self.made[node]

    def _gathered(self, node: torch.fx.Node) -> torch.fx.Node | None:
        if _elementwise(node) and self.depth < MAX_DEPTH and self._passable(node):
            self.depth += 1
            args = [self._operand(a) for a in node.args]
            kwargs = {k: self._operand(v) for k, v in node.kwargs.items()}
            if any(a is None for a in args) or any(v is None for v in kwargs.values()):
                return None
            return self.graph.call_function(node.target, tuple(args), kwargs)
        self.gathers += 1
        if self.gathers > MAX_GATHERS:
            return None
        return self.graph.call_function(aten.gather.default, (node, self.dim, self.index))

    def _passable(self, node: torch.fx.Node) -> bool:
        """Every tensor operand is full-size (gathered) or size 1 along ``dim`` and broadcast-
        compatible with the index elsewhere (kept as it is)."""
        for arg in [*node.args, *node.kwargs.values()]:
            if not isinstance(arg, torch.fx.Node):
                if isinstance(arg, (list, tuple)) and any(isinstance(a, torch.fx.Node) for a in arg):
                    return False
                continue
            sizes = _sizes(arg, len(self.full))
            if sizes is None:
                return False
            if sizes == self.full:
                continue
            if sizes[self.dim] != 1 or any(s not in (1, f) for j, (s, f) in enumerate(zip(sizes, self.full))
                                           if j != self.dim):
                return False
        return True

    def _operand(self, arg: Any) -> Any:
        if isinstance(arg, torch.fx.Node) and _sizes(arg, len(self.full)) == self.full:
            return self.gathered(arg)
        return arg


def sink_gathers(graph: torch.fx.GraphModule) -> int:
    """Rewrite every ``gather`` of an elementwise result that qualifies (module docstring); returns
    how many were rewritten. The nodes it adds carry no metadata: ``fuse`` retraces next."""
    rewritten = 0
    for node in list(graph.graph.nodes):
        if node.op != "call_function" or node.target is not aten.gather.default or node.kwargs.get("sparse_grad"):
            continue
        if len(node.args) != 3:
            continue
        source, dim, index = node.args
        if not (_elementwise(source) and isinstance(index, torch.fx.Node)):
            continue
        full, positions = meta_of(source), meta_of(index)
        if not (isinstance(full, torch.Tensor) and isinstance(positions, torch.Tensor)) or full.dim() == 0:
            continue
        dim = dim % full.dim()
        if positions.dim() != full.dim() or any(p != f for j, (p, f) in enumerate(zip(positions.shape, full.shape))
                                                if j != dim):
            continue
        with graph.graph.inserting_before(node):
            rewrite = _Rewrite(graph.graph, dim, index, tuple(full.shape))
            replacement = rewrite.gathered(source)
        if replacement is None:
            continue   # over budget: the nodes made so far are dead and go with the next DCE
        node.replace_all_uses_with(replacement)
        graph.graph.erase_node(node)
        rewritten += 1
    if rewritten:
        graph.graph.eliminate_dead_code()
        graph.recompile()
    return rewritten


__all__ = ["sink_gathers"]
