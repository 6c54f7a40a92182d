"""Gathers: indexing written as gathers (``fuse`` option ``gather_loads``), and gathers of
elementwise results rewritten to gather first (``fuse`` option ``sink_gathers``).

``x[idx]`` with one integer index tensor (``aten.index``), ``index_select`` and
``embedding(weight, idx)`` pick whole rows of ``x``. As ATen calls they are a kernel each, writing
the picked rows for the next kernel to read back. Written as ``gather(x, k, expand(idx))`` (negative indices wrapped as indexing wraps
them, by an elementwise select on the index), the kernel that consumes the rows reads them with
an indirect load (:func:`passes.kernel_ir.nodes.input_gather`), and the index's own elementwise
work joins that kernel too. Where it matters: a mixture-of-experts layer gathers each token's
hidden state for its experts (``x[token_of_slot]``) and each expert row back; a language model
reads its token embeddings straight into the first norm's kernel.

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
from passes.kernel_ir.nodes import static_sizes

from .legality import classify
from .views import VIEWS, call_with_value

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


def indexing(node: torch.fx.Node) -> tuple[torch.fx.Node, int, torch.fx.Node] | None:
    """``(x, k, idx)`` when ``node`` picks ``x``'s slices along ``k`` at the integer tensor
    ``idx`` (``index`` with one index tensor, ``index_select`` or ``embedding``), with static
    shapes; else None."""
    if node.op != "call_function":
        return None
    if node.target is aten.index.Tensor and len(node.args) == 2:
        x, indices = node.args
        picked = [(k, i) for k, i in enumerate(indices) if i is not None]
        if len(picked) != 1:
            return None
        k, idx = picked[0]
    elif node.target is aten.embedding.default:
        x, idx, k = node.args[0], node.args[1], 0
    elif node.target is aten.index_select.default and len(node.args) == 3 and type(node.args[1]) is int:
        x, k, idx = node.args[0], node.args[1], node.args[2]
        if not isinstance(meta_of(x), torch.Tensor) or meta_of(x).dim() == 0:
            return None
        k %= meta_of(x).dim()
    else:
        return None
    if not (isinstance(x, torch.fx.Node) and isinstance(idx, torch.fx.Node)):
        return None
    value, index = meta_of(x), meta_of(idx)
    if not (isinstance(value, torch.Tensor) and isinstance(index, torch.Tensor)) or value.dim() <= k:
        return None
    if index.dtype not in (torch.int32, torch.int64) or index.numel() == 0 or value.numel() == 0:
        return None
    if not static_sizes(tuple(value.shape) + tuple(index.shape) + tuple(value.stride())):
        return None
    return x, k, idx


def index_views(graph: torch.fx.GraphModule) -> int:
    """Rewrite ``view(x[idx])`` whose view only reshapes the indexed block of dims (a top-k
    layer's ``y[order].view(tokens, k, hidden)``) as ``x[idx.reshape(...)]``: the same values, the
    indexing now in the shape its readers use (a reduction over ``k`` is then a reduction over an
    index dim, which :mod:`.unroll` splits by slicing the index). Returns how many rewrote."""
    rewritten = 0
    for view in list(graph.graph.nodes):
        if view.op != "call_function" or view.target not in VIEWS or not isinstance(view.args[0], torch.fx.Node):
            continue
        node = view.args[0]
        found = indexing(node)
        if found is None or len(node.users) != 1 or node.target is aten.index_select.default:
            continue
        x, k, idx = found
        value, index, shape = meta_of(x), meta_of(idx), meta_of(view).shape
        block = len(shape) - (value.dim() - 1)
        if block < 1 or not static_sizes(shape) or list(shape[:k]) != list(value.shape[:k]) \
                or list(shape[k + block:]) != list(value.shape[k + 1:]) or list(shape[k:k + block]) == list(index.shape):
            continue
        with graph.graph.inserting_before(view):
            reshaped = call_with_value(graph.graph, aten.reshape.default, (idx, list(shape[k:k + block])))
            picked = call_with_value(graph.graph, aten.index.Tensor, (x, [None] * k + [reshaped]))
        view.replace_all_uses_with(picked)
        graph.graph.erase_node(view)
        graph.graph.erase_node(node)
        rewritten += 1
    if rewritten:
        graph.recompile()
    return rewritten


_UNIT_VIEWS = VIEWS + (aten.unsqueeze.default,)


def _unit_insert(node: torch.fx.Node) -> tuple[torch.fx.Node, list[int]] | None:
    """``(view, positions)`` when the only user of ``node`` is a view inserting size-1 axes into its
    result (``bias.unsqueeze(0)``): ``positions[i]`` is where ``node``'s axis ``i`` lands."""
    if len(node.users) != 1:
        return None
    view = next(iter(node.users))
    if view.op != "call_function" or view.target not in _UNIT_VIEWS or not isinstance(meta_of(view), torch.Tensor):
        return None
    shape, result = list(meta_of(view).shape), list(meta_of(node).shape)
    if not static_sizes(shape) or len(shape) <= len(result):
        return None
    positions = []
    for p, size in enumerate(shape):
        if len(positions) < len(result) and size == result[len(positions)]:
            positions.append(p)
        elif size != 1:
            return None
    return (view, positions) if len(positions) == len(result) else None


def _sole_permute(node: torch.fx.Node, positions: list[int]) -> tuple[torch.fx.Node, list[int]] | None:
    """``(permute, dims)`` when the only user of the indexing ``node`` is a ``permute`` whose result
    some kernel consumes and which keeps the index's dims (at ``positions`` of the result) in their
    order: the gather can then be made in the permuted shape, reading its source through the
    permuted view (T5's and Swin's relative position biases, ``table[idx].permute(2, 0, 1)``)."""
    if len(node.users) != 1:
        return None
    permute = next(iter(node.users))
    if permute.op != "call_function" or permute.target is not aten.permute.default:
        return None
    rank = meta_of(node).dim()
    dims = [d % rank for d in permute.args[1]]
    moved = [dims.index(p) for p in positions]
    if moved != sorted(moved) or not any(classify(user)[0] is not None for user in permute.users):
        return None
    return permute, dims


def index_as_gather(graph: torch.fx.GraphModule) -> int:
    """Rewrite indexing whose result some kernel consumes (directly, or through a permute that
    keeps the index's dims in order) as a gather (module docstring); returns how many were
    rewritten. New nodes carry example values.

    The gather is made in the result's own shape ``x[:k] + idx.shape + x[k+1:]`` (or in the shape
    of a sole view that inserts size-1 axes into it, or of a sole permute), so no reshape follows
    it: its source is ``x`` viewed to that rank (size-1 axes where the index has its leading dims,
    broadcast there by an expand) and its index is ``idx`` viewed into the gathered position and
    expanded."""
    rewritten = 0
    for node in list(graph.graph.nodes):
        found = indexing(node)
        if found is None:
            continue
        x, k, idx = found
        value, index = meta_of(x), meta_of(idx)
        permuted = _sole_permute(node, list(range(k, k + index.dim())))
        if permuted is None and not any(classify(user)[0] is not None for user in node.users):
            continue
        size = int(value.shape[k])
        shape = list(value.shape[:k]) + list(index.shape) + list(value.shape[k + 1:])
        dim = k + index.dim() - 1
        source_shape = list(value.shape[:k]) + [1] * (index.dim() - 1) + list(value.shape[k:])
        wide_source = list(shape[:dim]) + [size] + list(shape[dim + 1:])
        index_shape = [1] * len(shape)
        for d in range(index.dim()):
            index_shape[dim - index.dim() + 1 + d] = index.shape[d]
        replaced = node
        with graph.graph.inserting_before(node):
            source = x
            if source_shape != list(value.shape):
                source = call_with_value(graph.graph, aten.view.default, (x, source_shape))
            if wide_source != source_shape:
                source = call_with_value(graph.graph, aten.expand.default, (source, wide_source))
            if permuted is not None:    # the index's dims keep their order: a reshape of idx still
                replaced, dims = permuted
                source = call_with_value(graph.graph, aten.permute.default, (source, dims))
                shape, index_shape, dim = [shape[d] for d in dims], [index_shape[d] for d in dims], dims.index(dim)
            unit = _unit_insert(replaced) if permuted is not None or index.dim() == 1 else None
            if unit is not None:        # size-1 axes inserted after it: the gather is made in that shape
                replaced, positions = unit
                unit_shape = list(meta_of(replaced).shape)
                source_shape, unit_index = [1] * len(unit_shape), [1] * len(unit_shape)
                for axis, position in enumerate(positions):
                    source_shape[position] = meta_of(source).shape[axis]
                    unit_index[position] = index_shape[axis]
                source = call_with_value(graph.graph, aten.view.default, (source, source_shape))
                shape, index_shape, dim = unit_shape, unit_index, positions[dim]
            shaped = call_with_value(graph.graph, aten.reshape.default, (idx, index_shape))
            negative = call_with_value(graph.graph, aten.lt.Scalar, (shaped, 0))
            wrapped = call_with_value(graph.graph, aten.add.Tensor, (shaped, size))
            position = call_with_value(graph.graph, aten.where.self, (negative, wrapped, shaped))
            wide = call_with_value(graph.graph, aten.expand.default, (position, shape))
            picked = call_with_value(graph.graph, aten.gather.default, (source, dim, wide))
        replaced.replace_all_uses_with(picked)
        graph.graph.erase_node(replaced)        # the nodes it read from die too (below)
        rewritten += 1
    if rewritten:
        graph.graph.eliminate_dead_code()
        graph.recompile()
    return rewritten


__all__ = ["index_as_gather", "index_views", "indexing", "sink_gathers"]
