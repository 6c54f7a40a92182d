"""Hypothesis strategies that build random, valid FX graphs of the supported op set.

A drawn :class:`GraphCase` is a torch-level ``fx.GraphModule`` (what capture hands to the passes)
plus the specs of its inputs; ``case.make_inputs(seed)`` gives fresh random tensors (never zeros).
Graphs mix pointwise ops with broadcasting, reductions (sum, mean, amax, amin, var, argmax,
softmax, safe softmax, log_softmax, layer norm, vector norms), views (permute, transpose, reshape,
unsqueeze, expand, narrow) and their copying kin (concatenations, pads, gathers), permuted
(non-contiguous) inputs, constants, several dtypes, and optionally in-place updates.

Shapes: most cases keep every dimension in ``1..max_dim``, small graphs that run and shrink fast.
A share of them (``large_shapes``, 1 in 8 by default) is large instead: 10,000 to ``max_elements``
(65,536) elements, every size odd and often prime (``(7, 13, 509)``, ``(3, 16381)``), so that a
rewrite or a kernel that goes wrong only past a tile, a vector width, a block or a split threshold
(loop tails, partial blocks, multi-pass reductions) fails the test too. Bounding the share and the
elements keeps a property test's time close to that of small graphs alone: per example, compiling
kernels costs more than running them on 65,536 elements.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import attrs
import torch
import torch.fx
from hypothesis import strategies as st

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

UNARY = [torch.neg, torch.abs, torch.relu, torch.sigmoid, torch.tanh, torch.sin, torch.cos]
# Unary ops with a restricted domain get a guard node in front (see _safe_unary).
GUARDED_UNARY = ["exp", "sqrt", "log", "reciprocal"]
BINARY = [torch.add, torch.sub, torch.mul, torch.maximum, torch.minimum]
REDUCTIONS = ["sum", "mean", "amax", "amin", "var", "argmax", "softmax", "safe_softmax", "log_softmax",
              "layer_norm", "vector_norm"]
VIEWS = ["permute", "transpose", "reshape", "unsqueeze", "expand", "narrow", "cat", "pad", "gather"]

# Large shapes: the other axes take small odd sizes, one axis the rest of the element budget.
LARGE_MIN_ELEMENTS = 10_000
SMALL_ODD_SIZES = (1, 3, 5, 7, 11, 13, 31)
PRIMES = (61, 127, 251, 509, 1021, 1031, 2039, 4093, 8191, 16381, 32749, 65521)
SHARE_STEPS = 64    # large_shapes is drawn as an integer out of this many


@attrs.frozen
class TensorSpec:
    """Shape, dtype and memory layout of one graph input."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    permutation: tuple[int, ...] | None = None  # stored permuted in memory when set

    def make(self, generator: torch.Generator) -> torch.Tensor:
        """A fresh random tensor with this spec (normal floats, small non-zero integers)."""
        shape = self.shape if self.permutation is None else tuple(self.shape[p] for p in self.permutation)
        if self.dtype.is_floating_point:
            value = torch.randn(shape, generator=generator, dtype=torch.float32).to(self.dtype)
        elif self.dtype == torch.bool:
            value = torch.rand(shape, generator=generator) > 0.5
        else:
            value = torch.randint(1, 6, shape, generator=generator, dtype=self.dtype)
            signs = torch.randint(0, 2, shape, generator=generator, dtype=self.dtype) * 2 - 1
            value = value * signs
        if self.permutation is not None:
            inverse = [0] * len(self.permutation)
            for i, p in enumerate(self.permutation):
                inverse[p] = i
            value = value.permute(inverse)
        return value


@attrs.define(eq=False)
class GraphCase:
    """A random graph and how to make inputs for it."""

    gm: torch.fx.GraphModule
    inputs: list[TensorSpec]
    mutates_inputs: bool = False

    def make_inputs(self, seed: int = 0) -> list[torch.Tensor]:
        """Fresh random inputs for the graph, the same for the same ``seed``."""
        generator = torch.Generator().manual_seed(seed)
        return [spec.make(generator) for spec in self.inputs]

    def __repr__(self) -> str:
        specs = ", ".join(f"{list(s.shape)} {str(s.dtype).replace('torch.', '')}"
                          + (f" stored as permute{s.permutation}" if s.permutation else "")
                          for s in self.inputs)
        return f"GraphCase(inputs=[{specs}]){self.gm.code}"


_VIEW_TARGETS = {torch.permute, torch.transpose, torch.reshape, torch.unsqueeze, torch.narrow, "expand",
                 "transpose", "select", "narrow"}


class _Builder:
    """Grows a graph one op at a time, checking each op on small CPU probe tensors of the same shape and dtype (the meta device accepts ops that have no CPU kernel)."""

    def __init__(self, root: torch.nn.Module):
        self.root = root
        self.graph = torch.fx.Graph()
        self.values: list[tuple[torch.fx.Node, torch.Tensor]] = []
        self.protected: set[torch.fx.Node] = set()
        self.alias_root: dict[torch.fx.Node, torch.fx.Node] = {}  # whose storage a value aliases
        self.constants = 0

    def placeholder(self, name: str, spec: TensorSpec) -> None:
        node = self.graph.placeholder(name)
        self.values.append((node, torch.ones(spec.shape, dtype=spec.dtype)))
        self.protected.add(node)

    def call(self, target: Callable, *args: Any, method: bool = False, **kwargs: Any):
        """Add a call if it is valid on the operands' metadata; return (node, meta) or None."""
        meta_args = [_meta(a, self) for a in args]
        meta_kwargs = {k: _meta(v, self) for k, v in kwargs.items()}
        try:
            if method:
                result = getattr(meta_args[0], target)(*meta_args[1:], **meta_kwargs)
            else:
                result = target(*meta_args, **meta_kwargs)
        except (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError):
            return None
        if not isinstance(result, torch.Tensor):
            return None
        if method:
            node = self.graph.call_method(target, tuple(args), kwargs)
        else:
            node = self.graph.call_function(target, tuple(args), kwargs)
        self._metas[node] = result
        self.values.append((node, result))
        aliases = target in _VIEW_TARGETS or (method and str(target).endswith("_"))
        first = args[0] if args and isinstance(args[0], torch.fx.Node) else None
        self.alias_root[node] = self.alias_root.get(first, first) if aliases and first is not None else node
        return node, result

    @property
    def _metas(self) -> dict:
        if not hasattr(self, "_meta_map"):
            self._meta_map = {n: m for n, m in self.values}
        for n, m in self.values:
            self._meta_map.setdefault(n, m)
        return self._meta_map

    def constant(self, shape: tuple[int, ...], dtype: torch.dtype, seed: int):
        name = f"const{self.constants}"
        self.constants += 1
        generator = torch.Generator().manual_seed(seed)
        self.root.register_buffer(name, torch.randn(shape, generator=generator).to(dtype))
        node = self.graph.get_attr(name)
        self.protected.add(node)
        meta = torch.ones(shape, dtype=dtype)
        self._metas[node] = meta
        self.values.append((node, meta))
        return node, meta


def _meta(value: Any, builder: _Builder) -> Any:
    if isinstance(value, torch.fx.Node):
        return builder._metas[value]
    if isinstance(value, (list, tuple)):
        return type(value)(_meta(v, builder) for v in value)
    return value


def _broadcast_variant(draw, base: tuple[int, ...]) -> tuple[int, ...]:
    drop = draw(st.integers(0, max(len(base) - 1, 0)))
    shape = list(base[drop:])
    for i in range(len(shape)):
        if draw(st.booleans()) and draw(st.booleans()):
            shape[i] = 1
    return tuple(shape)


def _large_shape(draw, rank: int, max_elements: int) -> tuple[int, ...]:
    """A shape of about ``LARGE_MIN_ELEMENTS`` to ``max_elements`` elements, every size odd."""
    shape = [draw(st.sampled_from(SMALL_ODD_SIZES)) for _ in range(rank)]
    long_axis = draw(st.integers(0, rank - 1))
    others = math.prod(shape[:long_axis] + shape[long_axis + 1:])
    high = max(max_elements // others, 1)
    low = min(max(LARGE_MIN_ELEMENTS // others, 1), high)
    primes = [p for p in PRIMES if low <= p <= high]
    if primes and draw(st.booleans()):
        size = draw(st.sampled_from(primes))
    else:
        size = draw(st.integers(low, high))
        if size % 2 == 0:
            size = size + 1 if size < high else size - 1
    shape[long_axis] = size
    return tuple(shape)


@st.composite
def graphs(draw, *, dtypes: Sequence[torch.dtype] = (torch.float32,), min_ops: int = 1, max_ops: int = 8,
           max_inputs: int = 3, max_rank: int = 3, max_dim: int = 6, reductions: bool = True,
           views: bool = True, mutation: bool = False, input_mutation: bool = False,
           constants: bool = True, permuted_inputs: bool = True, input_mutation_weight: int = 1,
           large_shapes: float = 1 / 8, max_elements: int = 1 << 16) -> GraphCase:
    """Draw a random valid graph. Keyword switches choose the op families (see module doc);
    ``input_mutation_weight`` makes writes into inputs that many times as likely as one family.
    ``large_shapes`` is the share of cases drawn with a large shape of odd sizes (at most
    ``max_elements`` elements; 0 keeps every case within ``max_dim``), see the module doc."""
    if not 0 <= large_shapes <= 1:
        raise ValueError(f"graphs(large_shapes={large_shapes!r}): a share, from 0 (never) to 1 (always)")
    if max_elements < LARGE_MIN_ELEMENTS and large_shapes > 0:
        raise ValueError(f"graphs(max_elements={max_elements!r}): large shapes have at least "
                         f"{LARGE_MIN_ELEMENTS} elements; give more, or large_shapes=0")
    rank = draw(st.integers(1, max_rank))
    large = draw(st.integers(0, SHARE_STEPS - 1)) >= SHARE_STEPS - round(large_shapes * SHARE_STEPS)
    if large:
        base = _large_shape(draw, rank, max_elements)
    else:
        base = tuple(draw(st.integers(1, max_dim)) for _ in range(rank))
    n_inputs = draw(st.integers(1, max_inputs))
    root = torch.nn.Module()
    builder = _Builder(root)
    specs = []
    for i in range(n_inputs):
        shape = base if i == 0 else _broadcast_variant(draw, base)
        dtype = draw(st.sampled_from(list(dtypes)))
        permutation = None
        if permuted_inputs and len(shape) > 1 and draw(st.integers(0, 3)) == 0:
            permutation = tuple(draw(st.permutations(range(len(shape)))))
        spec = TensorSpec(shape, dtype, permutation)
        specs.append(spec)
        builder.placeholder(f"x{i}", spec)
    families = ["unary", "guarded", "binary", "binary", "scalar"]
    if reductions:
        families += ["reduction", "reduction"]
    if views:
        families += ["view", "view"]
    if mutation:
        families += ["mutation"]
    if input_mutation:
        families += ["input_mutation"] * input_mutation_weight
    if constants:
        families += ["constant"]
    n_ops = draw(st.integers(min_ops, max_ops))
    mutated_input = False
    attempts = 0
    while len(builder.values) - n_inputs < n_ops and attempts < n_ops * 6:
        attempts += 1
        family = draw(st.sampled_from(families))
        added = _add_op(draw, builder, family, dtypes)
        if added == "input_mutation":
            mutated_input = True
    float_values = [(n, m) for n, m in builder.values if n.op in ("call_function", "call_method")]
    if not float_values:
        _add_op(draw, builder, "unary", dtypes, force=True)
        float_values = [(n, m) for n, m in builder.values if n.op in ("call_function", "call_method")]
    outputs = [float_values[-1][0]]
    for node, _ in float_values[:-1]:
        if not node.users and draw(st.integers(0, 2)) == 0:
            outputs.append(node)
    builder.graph.output(tuple(outputs))
    gm = torch.fx.GraphModule(root, builder.graph)
    return GraphCase(gm=gm, inputs=specs, mutates_inputs=mutated_input)


def _pick(draw, builder: _Builder, *, floating: bool = True, exclude_inputs: bool = False):
    candidates = [(n, m) for n, m in builder.values
                  if (m.dtype.is_floating_point or not floating)
                  and not (exclude_inputs and builder.alias_root.get(n, n) in builder.protected)]
    if not candidates:
        return None
    # Prefer recent values so graphs grow into chains rather than many shallow branches.
    index = draw(st.integers(0, len(candidates) - 1))
    index = max(index, draw(st.integers(0, len(candidates) - 1)))
    return candidates[index]


def _add_op(draw, builder: _Builder, family: str, dtypes: Sequence[torch.dtype], force: bool = False):
    picked = _pick(draw, builder, floating=family not in ("binary", "view"))
    if picked is None:
        picked = _pick(draw, builder, floating=False)
        if picked is None:
            return None
    node, meta = picked
    rank = meta.dim()
    if family == "unary" or force:
        return builder.call(draw(st.sampled_from(UNARY)), node)
    if family == "guarded":
        return _safe_unary(draw(st.sampled_from(GUARDED_UNARY)), builder, node)
    if family == "binary":
        other = _pick(draw, builder, floating=False)
        fn = draw(st.sampled_from(BINARY + ["where"]))
        if fn == "where":
            cond = builder.call(torch.gt, node, other[0])
            return cond and builder.call(torch.where, cond[0], node, other[0])
        return builder.call(fn, node, other[0])
    if family == "scalar":
        fn = draw(st.sampled_from([torch.add, torch.mul, torch.sub]))
        scalar = draw(st.sampled_from([0.5, 2.0, -1.5, 3]))
        return builder.call(fn, node, scalar)
    if family == "reduction" and rank > 0:
        return _reduction(draw, builder, node, meta)
    if family == "view" and rank > 0:
        return _view(draw, builder, node, meta)
    if family == "mutation":
        target = _pick(draw, builder, exclude_inputs=True)
        if target is None or any(st_ == 0 and sz > 1 for st_, sz in zip(target[1].stride(), target[1].shape)):
            return None
        method = draw(st.sampled_from(["add_", "mul_", "relu_"]))
        if target[1].dim() > 1 and draw(st.booleans()):
            view = builder.call("transpose", target[0], 0, target[1].dim() - 1, method=True)
            if view is None:
                return None
            target = view
        args = (target[0],) if method == "relu_" else (target[0], draw(st.sampled_from([0.5, 2.0])))
        return builder.call(method, *args, method=True)
    if family == "input_mutation":
        candidates = [(n, m) for n, m in builder.values if n.op == "placeholder" and m.dtype.is_floating_point]
        if not candidates:
            return None
        target, tmeta = draw(st.sampled_from(candidates))
        source = _pick(draw, builder)
        if source is not None and tmeta.dim() > 0 and draw(st.booleans()):
            return _partial_input_write(draw, builder, target, tmeta, source)
        try:
            torch.broadcast_shapes(tmeta.shape, source[1].shape)
            if torch.broadcast_shapes(tmeta.shape, source[1].shape) != tmeta.shape:
                return None
        except RuntimeError:
            return None
        if builder.call("add_", target, source[0], method=True) is None:
            return None
        return "input_mutation"
    if family == "constant":
        if draw(st.booleans()):
            const = builder.constant(tuple(meta.shape[-1:]) or (1,), meta.dtype, draw(st.integers(0, 99)))
            scaled = builder.call(torch.mul, const[0], 0.5)
            return scaled and builder.call(torch.add, node, scaled[0])
        full = builder.call(torch.full, tuple(meta.shape), draw(st.sampled_from([0.25, 1.5])), dtype=meta.dtype)
        return full and builder.call(torch.mul, node, full[0])
    return None


def _partial_input_write(draw, builder: _Builder, target: torch.fx.Node, tmeta: torch.Tensor, source):
    """Write into part of an input, as a KV-cache update does: ``x[i] = v``, ``x.narrow(...) *= 2``
    or ``x.index_copy_(d, idx, v)`` (``v`` is a value of the graph broadcast to the written part)."""
    dim = draw(st.integers(0, tmeta.dim() - 1))
    size = tmeta.shape[dim]
    kind = draw(st.sampled_from(["select", "narrow", "index_copy"]))
    if kind == "index_copy":
        count = draw(st.integers(1, min(size, 8)))
        index = sorted(draw(st.lists(st.integers(0, size - 1), min_size=count, max_size=count, unique=True)))
        picked = builder.call(torch.tensor, index)
        if picked is None:
            return None
        shape = list(tmeta.shape)
        shape[dim] = count
        values = builder.call("expand", source[0], shape, method=True)
        values = values and builder.call("contiguous", values[0], method=True)
        values = values and builder.call("to", values[0], tmeta.dtype, method=True)
        if values is None:
            return None
        done = builder.call("index_copy_", target, dim, picked[0], values[0], method=True)
        return done and "input_mutation"
    if kind == "select":
        part = builder.call("select", target, dim, draw(st.integers(0, size - 1)), method=True)
    else:
        start = draw(st.integers(0, size - 1))
        part = builder.call("narrow", target, dim, start, draw(st.integers(1, size - start)), method=True)
    if part is None:
        return None
    if draw(st.booleans()):
        done = builder.call("mul_", part[0], draw(st.sampled_from([0.5, 2.0])), method=True)
    else:
        done = builder.call("copy_", part[0], source[0], method=True)
    return done and "input_mutation"


def _safe_unary(name: str, builder: _Builder, node: torch.fx.Node):
    if name == "exp":
        bounded = builder.call(torch.tanh, node)
        return bounded and builder.call(torch.exp, bounded[0])
    positive = builder.call(torch.abs, node)
    if positive is None:
        return None
    shifted = builder.call(torch.add, positive[0], 1.0)
    if shifted is None:
        return None
    return builder.call({"sqrt": torch.sqrt, "log": torch.log, "reciprocal": torch.reciprocal}[name], shifted[0])


def _reduction(draw, builder: _Builder, node: torch.fx.Node, meta: torch.Tensor):
    rank = meta.dim()
    kind = draw(st.sampled_from(REDUCTIONS))
    dim = draw(st.integers(-rank, rank - 1))
    keepdim = draw(st.booleans())
    if kind in ("sum", "mean"):
        dims = sorted(set(draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank))))
        return builder.call(getattr(torch, kind), node, dims, keepdim)
    if kind in ("amax", "amin"):
        return builder.call(getattr(torch, kind), node, [dim], keepdim)
    if kind == "var":
        return builder.call(torch.var, node, [dim], correction=0, keepdim=keepdim)
    if kind == "argmax":
        return builder.call(torch.argmax, node, dim, keepdim)
    if kind == "softmax":
        return builder.call(torch.softmax, node, dim)
    if kind == "log_softmax":
        return builder.call(torch.log_softmax, node, dim)
    if kind == "vector_norm":
        order = draw(st.sampled_from([1, 2, math.inf]))
        return builder.call(torch.linalg.vector_norm, node, order, [dim], keepdim)
    if kind == "safe_softmax":      # attention's math path: softmax, zero where a row is all -inf (any/all)
        return builder.call(torch.ops.aten._safe_softmax.default, node, dim)
    return builder.call(torch.nn.functional.layer_norm, node, [meta.shape[-1]])


def _view(draw, builder: _Builder, node: torch.fx.Node, meta: torch.Tensor):
    rank = meta.dim()
    kind = draw(st.sampled_from(VIEWS))
    if kind == "permute":
        return builder.call(torch.permute, node, tuple(draw(st.permutations(range(rank)))))
    if kind == "transpose":
        return builder.call(torch.transpose, node, draw(st.integers(0, rank - 1)), draw(st.integers(0, rank - 1)))
    if kind == "reshape":
        numel = math.prod(meta.shape)
        if draw(st.booleans()) or rank == 1:
            return builder.call(torch.reshape, node, (numel,) if rank > 1 else (1, numel))
        return builder.call(torch.reshape, node, (-1, meta.shape[-1]))
    if kind == "unsqueeze":
        return builder.call(torch.unsqueeze, node, draw(st.integers(0, rank)))
    if kind == "expand":
        ones = [i for i, s in enumerate(meta.shape) if s == 1]
        if not ones:
            return builder.call(torch.unsqueeze, node, 0)
        sizes = list(meta.shape)
        sizes[draw(st.sampled_from(ones))] = draw(st.integers(2, 4))
        return builder.call("expand", node, *sizes, method=True)
    if kind == "cat":
        return _cat(draw, builder, node, meta)
    if kind == "gather":
        return _gather(draw, builder, node, meta)
    if kind == "pad":
        widths = draw(st.lists(st.integers(0, 3), min_size=2, max_size=2 * min(rank, 2)))
        if len(widths) % 2:
            widths.pop()
        return builder.call(torch.nn.functional.pad, node, widths, value=draw(st.sampled_from([0.0, 1.5])))
    dim = draw(st.integers(0, rank - 1))
    size = meta.shape[dim]
    start = draw(st.integers(0, max(size - 1, 0)))
    length = draw(st.integers(1, max(size - start, 1)))
    return builder.call(torch.narrow, node, dim, start, length)


def _gather(draw, builder: _Builder, node: torch.fx.Node, meta: torch.Tensor):
    """Slices along a random dim picked by an index computed from the value itself (a running count
    of its positive elements, wrapped into range; negative for ``x[idx]`` half the time, which
    wraps them back): ``index_select``, or ``x[idx]`` along dim 0."""
    if not meta.dtype.is_floating_point or meta.numel() == 0:
        return None
    dim = draw(st.integers(0, meta.dim() - 1))
    size = meta.shape[dim]
    picks = draw(st.integers(1, 6))
    flat = builder.call(torch.reshape, node, (-1,))
    positive = flat and builder.call(torch.gt, flat[0], 0)
    count = positive and builder.call(torch.cumsum, positive[0], 0)
    first = count and builder.call(torch.narrow, count[0], 0, 0, min(picks, meta.numel()))
    index = first and builder.call(torch.remainder, first[0], size)
    if not index:
        return None
    if dim == 0 and draw(st.booleans()):
        if draw(st.booleans()):
            index = builder.call(torch.sub, index[0], size)
        return index and builder.call(torch.ops.aten.index.Tensor, node, [index[0]])
    return builder.call(torch.index_select, node, dim, index[0])


def _cat(draw, builder: _Builder, node: torch.fx.Node, meta: torch.Tensor):
    """A concatenation along a random dim: the value's two parts swapped with one negated (a
    rotary embedding's ``rotate_half``), the value beside a function of itself, or two
    concatenations of which the second extends the first."""
    dim = draw(st.integers(0, meta.dim() - 1))
    size = meta.shape[dim]
    if size >= 2 and meta.dtype.is_floating_point and draw(st.booleans()):
        half = draw(st.integers(1, size - 1))
        first = builder.call(torch.narrow, node, dim, 0, half)
        second = first and builder.call(torch.narrow, node, dim, half, size - half)
        second = second and builder.call(torch.neg, second[0])
        return second and builder.call(torch.cat, [second[0], first[0]], dim)
    other = builder.call(torch.mul, node, 2) if draw(st.booleans()) else (node, meta)
    if other and meta.dtype.is_floating_point and draw(st.booleans()):
        return _growing_cat(builder, node, other[0], dim, size)
    return other and builder.call(torch.cat, [node, other[0]] * draw(st.integers(1, 3)), dim)


def _growing_cat(builder: _Builder, node: torch.fx.Node, other: torch.fx.Node, dim: int, size: int):
    """A dense block's concatenations: ``cat([a, b])``, then ``cat([a, b, c])`` with ``c`` computed
    from the first cat, so the second one's pieces begin with the first one's."""
    first = builder.call(torch.cat, [node, other], dim)
    part = first and builder.call(torch.narrow, first[0], dim, size, size)
    grown = part and builder.call(torch.sin, part[0])
    return grown and builder.call(torch.cat, [node, other, grown[0]], dim)


__all__ = ["graphs", "GraphCase", "TensorSpec", "FLOAT_DTYPES"]
