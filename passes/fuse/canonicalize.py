"""Rewrites that make ops fusable, applied when ``fuse`` re-traces its graph.

- mean, var and var_mean become sums and pointwise ops, vector norms (ord 1, 2, inf, -inf) sums or
  extrema of ``|x|`` (weight norm, ``F.normalize``), and ``any``/``all`` become ``amax``/``amin``
  of 0/1 flags, so every reduction a kernel sees is a plain sum/amax/amin/argmax/argmin/prod (the
  safe softmax of attention's math path tests its rows with ``all``: its test joins the
  softmax's own kernel);
- a convolution's bias (on the devices ``fuse.conv_bias_apart`` names) is added after it, by the
  kernel that reads the convolution;
- ``full_like`` of a contiguous result becomes ``full`` (no longer reading, or keeping alive,
  the tensor it copies the shape of);
- an accumulating ``index_put`` along dim 0 (the embedding gradient) becomes ``index_add``;
- a *one-hot* scatter (one index per line along ``dim``) becomes a pointwise
  ``where(iota == index, value, self)`` that fuses with its fill and its consumers, as the
  backward of cross-entropy's ``gather`` needs (Inductor does the same)."""
from __future__ import annotations

import math

import torch
import torch.fx

aten = torch.ops.aten


def _norm_dims(x: torch.Tensor, dim) -> list[int]:
    if x.dim() == 0:
        return []           # dim 0 or -1 of a 0-d tensor: nothing to reduce
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.dim()))
    if isinstance(dim, int):
        dim = [dim]
    return sorted({d % max(x.dim(), 1) for d in dim})


def _count(x: torch.Tensor, dims: list[int]) -> int:
    return math.prod(x.shape[d] for d in dims) if dims else 1


def _accumulation_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def mean_dim(x, dim=None, keepdim=False, *, dtype=None):
    dims = _norm_dims(x, dim)
    source = x if dtype is None else x.to(dtype)
    acc = source.to(_accumulation_dtype(source))
    out = acc.sum(dims, keepdim=keepdim) / _count(x, dims)
    return out.to(source.dtype)


def mean_all(x, *, dtype=None):
    return mean_dim(x, None, False, dtype=dtype)


def _variance(x, dims, correction, keepdim):
    """Two-pass variance (sum, then sum of squared deviations) in the accumulation dtype; also
    returns the mean with reduced axes kept."""
    n = _count(x, dims)
    corr = 1 if correction is None else correction
    acc = x.to(_accumulation_dtype(x))
    mean_keep = acc.sum(dims, keepdim=True) / n
    centered = acc - mean_keep
    return (centered * centered).sum(dims, keepdim=keepdim) / max(n - corr, 0), mean_keep


def var_correction(x, dim=None, *, correction=None, keepdim=False):
    var, _ = _variance(x, _norm_dims(x, dim), correction, keepdim)
    return var.to(x.dtype)


def var_mean_correction(x, dim=None, *, correction=None, keepdim=False):
    dims = _norm_dims(x, dim)
    var, mean_keep = _variance(x, dims, correction, keepdim)
    mean = mean_keep if keepdim or not dims else mean_keep.squeeze(dims)
    return var.to(x.dtype), mean.to(x.dtype)


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """``linalg_vector_norm`` for ord 2 (``sqrt(sum(x * x))``), 1, inf and -inf, in the accumulation
    dtype of ``x`` (or ``dtype``), for floating point ``x`` with static sizes and a non-empty domain."""
    if not x.dtype.is_floating_point or not all(type(s) is int for s in x.shape) or x.numel() == 0:
        return NotImplemented
    if ord not in (1, 2, math.inf, -math.inf):
        return NotImplemented
    dims = _norm_dims(x, dim)
    source = x if dtype is None else x.to(dtype)
    acc = source.to(_accumulation_dtype(source)).abs()
    if not dims:                # a 0-d tensor
        out = acc
    elif ord == 2:
        out = (acc * acc).sum(dims, keepdim=keepdim).sqrt()
    elif ord == 1:
        out = acc.sum(dims, keepdim=keepdim)
    else:
        out = (acc.amax if ord > 0 else acc.amin)(dims, keepdim=keepdim)
    return out.to(source.dtype)


def _flag_reduction(x, dim, keepdim, reduce):
    """``reduce`` (amax: any; amin: all) of ``x != 0`` as float32 0/1 flags over ``dim``, as a
    bool. Not for symbolic sizes or an empty reduced domain (where the identity of amax/amin
    would answer, not False/True)."""
    dims = _norm_dims(x, dim)
    if not all(type(s) is int for s in x.shape) or x.numel() == 0:
        return NotImplemented
    flags = (x != 0).to(torch.float32)
    if not dims:            # a 0-d tensor
        return flags != 0
    return reduce(flags, dims, keepdim=keepdim) != 0


def any_dims(x, dim=None, keepdim=False):
    """``any`` over ``dim`` (every dim when None: ``any.default`` too)."""
    return _flag_reduction(x, dim, keepdim, torch.amax)


def all_dims(x, dim=None, keepdim=False):
    """``all`` over ``dim`` (every dim when None: ``all.default`` too)."""
    return _flag_reduction(x, dim, keepdim, torch.amin)


def full_like(x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """``full`` when the result is contiguous (as ``full``'s is); other layouts stay ``full_like``."""
    if layout not in (None, torch.strided) or memory_format not in (None, torch.preserve_format,
                                                                    torch.contiguous_format):
        return NotImplemented
    if memory_format != torch.contiguous_format and not x.is_contiguous():
        return NotImplemented       # preserve_format keeps x's strides
    return torch.full(x.shape, fill_value, dtype=dtype or x.dtype, device=device or x.device)


def _one_per_line(x: torch.Tensor, dim: int, index: torch.Tensor) -> int | None:
    """``dim`` normalized when ``scatter(x, dim, index, ...)`` writes exactly one element of every
    line of ``x`` along ``dim`` (index of size 1 there and of ``x``'s size elsewhere, static
    shapes), else None. Then no two writes meet, so the scatter is a pointwise select."""
    if x.dim() == 0 or index.dim() != x.dim() or x.numel() == 0:
        return None
    if not all(type(s) is int for s in tuple(x.shape) + tuple(index.shape)):
        return None
    dim %= x.dim()
    if index.shape[dim] != 1 or any(index.shape[d] != x.shape[d] for d in range(x.dim()) if d != dim):
        return None
    return dim


def _hits(x: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """Boolean mask of the elements ``index`` names: ``iota along dim == index`` (broadcast)."""
    ramp = torch.ops.prims.iota(x.shape[dim], start=0, step=1, dtype=index.dtype, device=x.device,
                                requires_grad=False)
    if dim != x.dim() - 1:
        ramp = ramp.view([x.shape[dim]] + [1] * (x.dim() - 1 - dim))
    return ramp == index


def scatter_value(x, dim, index, value):
    """One-hot ``scatter.value`` as ``where(iota == index, value, x)`` (value converted to x's
    dtype, as scatter converts it)."""
    dim = _one_per_line(x, dim, index)
    if dim is None or type(value) not in (bool, int, float):
        return NotImplemented
    if x.dtype == torch.bool:
        value = bool(value)
    elif not x.dtype.is_floating_point and not x.dtype.is_complex:
        value = int(value)
    return torch.where(_hits(x, dim, index), value, x)


def scatter_src(x, dim, index, src):
    """One-hot ``scatter.src`` as ``where(iota == index, src[:index.shape], x)``."""
    dim = _one_per_line(x, dim, index)
    if dim is None or src.dtype != x.dtype:
        return NotImplemented
    if tuple(src.shape) != tuple(index.shape):
        src = src[tuple(slice(0, s) for s in index.shape)]
    return torch.where(_hits(x, dim, index), src, x)


def index_put_accumulate(x, indices, values, accumulate=False):
    """``index_put(x, [idx], v, accumulate=True)`` with one integer index tensor along dim 0 and no
    broadcasting of ``v`` (the embedding gradient) as ``index_add(x, 0, idx, v)``: one kernel of
    atomic adds where CUDA's index_put sorts the indices first (several launches and their
    host time per call). Negative indices wrap as index_put wraps them (a select that fuses
    into whatever kernel computes the index); index_add's own CUDA path takes care of
    deterministic mode."""
    if not accumulate or len(indices) != 1 or indices[0] is None or x.dim() == 0:
        return NotImplemented
    index = indices[0]
    if index.dtype not in (torch.int32, torch.int64) or tuple(values.shape) != tuple(index.shape) + tuple(x.shape[1:]):
        return NotImplemented
    flat = torch.where(index < 0, index + x.shape[0], index).reshape(-1)
    return torch.index_add(x, 0, flat, values.reshape(-1, *x.shape[1:]))


def without_conv_bias(devices: list[str]):
    """A decomposition of ``aten.convolution`` on ``devices``: the convolution without its bias,
    then ``+ bias`` per channel, an elementwise add that joins the kernel reading the result."""
    def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
        if bias is None or x.device.type not in devices:
            return NotImplemented
        out = torch.ops.aten.convolution.default(x, weight, None, stride, padding, dilation, transposed,
                                                 output_padding, groups)
        return out + bias.view([1, -1] + [1] * (out.dim() - 2))
    return convolution


FUSION_DECOMPOSITIONS = {
    aten.mean.dim: mean_dim,
    aten.mean.default: mean_all,
    aten.var.correction: var_correction,
    aten.var_mean.correction: var_mean_correction,
    aten.full_like.default: full_like,
    aten.linalg_vector_norm.default: vector_norm,
    aten.any.dim: any_dims,
    aten.any.dims: any_dims,
    aten.any.default: any_dims,
    aten.all.dim: all_dims,
    aten.all.dims: all_dims,
    aten.all.default: all_dims,
    aten.scatter.value: scatter_value,
    aten.scatter.src: scatter_src,
    aten.index_put.default: index_put_accumulate,
}


#: The operators of :data:`FUSION_DECOMPOSITIONS` that become reductions.
REDUCING = frozenset({aten.mean.dim, aten.mean.default, aten.var.correction, aten.var_mean.correction,
                      aten.linalg_vector_norm.default, aten.any.dim, aten.any.dims, aten.any.default,
                      aten.all.dim, aten.all.dims, aten.all.default})


MAX_COPIED_EXPRESSION = 8   # most nodes of an index expression copied into each kernel reading it


def split_shared_sources(graph, fusable, elementwise=lambda node: False) -> int:
    """Give every fusable user of a fill, an index ramp, or an *index expression* (elementwise
    work or views computed from those and 0-d graph inputs alone, at most
    ``MAX_COPIED_EXPRESSION`` nodes: a cat's ``iota < offset`` masks, or the scalar a dynamic
    graph computes from a float Dynamo passes as an input) its own copy of it, so each
    consumer's kernel computes the value in
    registers instead of one user's kernel absorbing it and the others reading it from memory, or
    a kernel or an ATen call making it on the device every call. Users that cannot fuse share the
    original. ``fusable(node)`` says whether a user can fuse; ``elementwise(node)`` whether a node
    is elementwise work or a view (it may be part of an index expression). Returns the number of
    copies made (of whole expressions)."""
    from passes.kernel_ir.groups import SOURCES, meta_of, packet_name
    nodes = list(graph.graph.nodes)
    size: dict = {}     # index expression -> its node count (sources: 1)
    scalars = {n for n in nodes if n.op == "placeholder" and isinstance(meta_of(n), torch.Tensor)
               and meta_of(n).dim() == 0}      # read by an expression, never copied
    for node in nodes:
        if node.op != "call_function":
            continue
        if packet_name(node.target) in SOURCES and not node.all_input_nodes:
            size[node] = 1
        elif node.all_input_nodes and elementwise(node) \
                and all(a in size or a in scalars for a in node.all_input_nodes):
            total = 1 + sum(size.get(a, 0) for a in set(node.all_input_nodes))
            if total <= MAX_COPIED_EXPRESSION:
                size[node] = total
    made = 0
    for node in reversed(nodes):        # consumers first: a copied expression's inputs are copied with it
        if node not in size or len(node.users) < 2:
            continue
        users = list(node.users)
        keep_original = [u for u in users if not fusable(u)]
        copied = [u for u in users if fusable(u)]
        if not keep_original:
            copied = copied[1:]         # the original goes to the first fusable user
        for user in copied:
            with graph.graph.inserting_before(user):
                user.replace_input_with(node, _copy_expression(graph.graph, node, size))
            made += 1
    if made:
        graph.recompile()
    return made


def _copy_expression(graph, node, expression: dict):
    """A copy of the index expression ``node`` and everything it is computed from."""
    copies: dict = {}

    def copy(n):
        if n not in copies:
            args = torch.fx.node.map_arg(n.args, lambda a: copy(a) if a in expression else a)
            kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: copy(a) if a in expression else a)
            copies[n] = graph.call_function(n.target, args, kwargs)
            copies[n].meta = dict(n.meta)
        return copies[n]
    return copy(node)


MAX_FOLDED_RAMP = 1 << 16   # most elements of an index ramp outside kernels stored as a constant


def fold_lone_sources(graph) -> int:
    """Replace each one-element fill, and each 1-D integer index ramp of at most
    ``MAX_FOLDED_RAMP`` elements, that no kernel absorbed (it feeds extern calls, or kernels that
    take it as an input) by a stored constant: as an ATen call it would allocate on the device and
    launch a fill (a ramp: an ``arange``) on every run (a mixture-of-experts layer's inverse
    permutation scatters ``arange(tokens)``). Values the graph returns stay calls, since the
    caller may write into what it gets. Returns the number folded."""
    from passes.kernel_ir.groups import CONSTANTS, IOTAS, constant_value, iota_of, meta_of, packet_name
    output = next(n for n in graph.graph.nodes if n.op == "output")
    returned = set(output.all_input_nodes)
    folded = 0
    for node in list(graph.graph.nodes):
        if node.op != "call_function" or node in returned:
            continue
        name = packet_name(node.target)
        value = meta_of(node)
        if name not in CONSTANTS | IOTAS or not isinstance(value, torch.Tensor) \
                or not all(type(s) is int for s in value.shape):
            continue
        if name in CONSTANTS and value.numel() == 1:
            stored = torch.full(tuple(value.shape), constant_value(node), dtype=value.dtype, device=value.device)
        elif name in IOTAS and iota_of(node) is not None and 1 < value.numel() <= MAX_FOLDED_RAMP:
            ramp = iota_of(node)
            stored = torch.arange(ramp.start, ramp.start + ramp.step * value.numel(), ramp.step,
                                  dtype=value.dtype, device=value.device)
        else:
            continue
        attribute = f"_fill_{folded}_{node.name}"
        while hasattr(graph, attribute):
            attribute += "_"
        graph.register_buffer(attribute, stored)
        with graph.graph.inserting_before(node):
            constant = graph.graph.get_attr(attribute)
        constant.meta = dict(node.meta)
        node.replace_all_uses_with(constant)
        graph.graph.erase_node(node)
        folded += 1
    if folded:
        graph.recompile()
    return folded


def drop_identity_copies(graph) -> int:
    """Replace ``clone(x)`` by ``x`` where the copy has ``x``'s shape, strides and dtype and
    nothing can tell the two apart: ``x`` is computed by the graph (neither an input nor a view of
    one, which the caller owns) and the copy is not returned (the caller may write into what it
    gets). Models write such copies (``.contiguous()`` of a tensor that already is, ``.clone()``
    before an in-place op that functionalization removed); as kernels they would read and write
    the tensor once more. Returns the number dropped."""
    from pipeline.compat import same_sizes
    from passes.kernel_ir.groups import meta_of
    output = next(n for n in graph.graph.nodes if n.op == "output")
    returned = set(output.all_input_nodes)
    dropped = 0
    for node in list(graph.graph.nodes):
        if node.op != "call_function" or node.target is not aten.clone.default or node in returned:
            continue
        source = node.args[0]
        if not isinstance(source, torch.fx.Node) or _input_based(source):
            continue
        before, after = meta_of(source), meta_of(node)
        if not (isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor)) \
                or before.dtype != after.dtype or before.device != after.device \
                or not same_sizes(before.shape, after.shape) or not same_sizes(before.stride(), after.stride()):
            continue
        node.replace_all_uses_with(source)
        graph.graph.erase_node(node)
        dropped += 1
    if dropped:
        graph.recompile()
    return dropped


def _input_based(node: torch.fx.Node) -> bool:
    """True when ``node`` is a graph input or a constant, or a view of one (through any chain of
    operators whose result aliases their first argument)."""
    from pipeline.compat import is_view_op
    while node.op == "call_function" and (is_view_op(node.target) or node.target is aten._unsafe_view.default) \
            and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node.op in ("placeholder", "get_attr")
