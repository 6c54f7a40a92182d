"""Inputs of extern kernels that need an aligned layout, given one before the host code calls them.

Tracing ``scaled_dot_product_attention`` to ATen records what the composite does to a mask
before a fused kernel reads it: the memory-efficient and cuDNN kernels need every stride of the
attention bias but the last to be a multiple of the vector width, and the composite pads the
key axis to 16 elements and slices it back (``constant_pad_nd`` + ``slice``), broadcasting over
heads with stride 0. Fusion is free to drop that padding (a pad sliced away is the identity) and
to write the mask into a dense buffer of its own, which at short sequences (one token: a
``[b, h, 1, 1]`` bias, head stride 1) the kernel refuses.

:data:`ALIGNED_INPUTS` names, per operator, the arguments that need such a layout;
:func:`align_extern_inputs` gives every one whose example value is not aligned a copy that is:
broadcast axes narrowed to one element, the last axis padded to :data:`ALIGNMENT` elements and
sliced back, the broadcast restored by ``expand`` (stride 0 again). The copy is one small ATen
call, made only where the layout needs it; a stride with symbolic sizes counts as aligned only
where it is a multiple of the alignment for every value of its symbols, and the padding of a
symbolic last axis is computed from the size the call sees.
"""
from __future__ import annotations

import operator

import sympy
import torch
import torch.fx

from .groups import meta_of
from .nodes import call_with_value

aten = torch.ops.aten

ALIGNMENT = 16          # elements: a multiple of the 8 (16-bit) or 4 (32-bit) the kernels check

#: operator -> positions (or keyword names) of the arguments whose every stride but the last must
#: be a multiple of ALIGNMENT (or 0, a broadcast), with a unit last stride
ALIGNED_INPUTS: dict = {
    aten._scaled_dot_product_efficient_attention.default: (3,),
    aten._scaled_dot_product_efficient_attention_backward.default: (4,),
    aten._scaled_dot_product_cudnn_attention.default: (3,),
    aten._scaled_dot_product_cudnn_attention_backward.default: (8,),
}


def _multiple(stride) -> bool:
    if isinstance(stride, int):
        return stride % ALIGNMENT == 0
    expr = getattr(getattr(stride, "node", None), "expr", None)
    if expr is None:
        return False
    return sympy.Mod(expr, ALIGNMENT) == 0


def aligned(value: torch.Tensor) -> bool:
    """Whether ``value``'s layout is one the fused attention kernels take as a bias: a unit last
    stride and every other stride 0 or a multiple of :data:`ALIGNMENT` (the kernels check the
    strides of size-1 axes too)."""
    stride = value.stride()
    return stride[-1] == 1 and all(isinstance(step, int) and step == 0 or _multiple(step) for step in stride[:-1])


def aligned_copy(value: torch.Tensor) -> torch.Tensor:
    """``value`` in the aligned layout, made eagerly the way :func:`align_extern_inputs` makes it
    in a graph (broadcast axes kept broadcast, the last axis padded and sliced back)."""
    base = value
    for dim, (size, step) in enumerate(zip(value.shape, value.stride())):
        if step == 0 and size != 1:
            base = base.narrow(dim, 0, 1)
    last = value.shape[-1]
    return torch.nn.functional.pad(base, (0, -last % ALIGNMENT))[..., :last].expand(value.shape)


def _size(graph: torch.fx.Graph, source: torch.fx.Node, value: torch.Tensor, dim: int) -> int | torch.fx.Node:
    """Axis ``dim`` of ``source``: an int, or a node reading a symbolic size from the tensor."""
    size = value.shape[dim]
    return size if type(size) is int else call_with_value(graph, aten.sym_size.int, (source, dim))


def _padded(graph: torch.fx.Graph, node: torch.fx.Node, amount: int | torch.fx.Node) -> torch.fx.Node:
    """``node`` with ``amount`` zeros appended to its last axis (a new contiguous tensor). With a
    symbolic amount the example value is made from the shape: ATen's ``constant_pad_nd`` takes
    no symbolic padding under a fake mode."""
    if type(amount) is int:
        return call_with_value(graph, aten.constant_pad_nd.default, (node, [0, amount], 0.0))
    padded = graph.call_function(aten.constant_pad_nd.default, (node, [0, amount], 0.0))
    value = meta_of(node)
    padded.meta["val"] = value.new_empty([*value.shape[:-1], value.shape[-1] + amount.meta["val"]])
    return padded


def _aligned_copy(graph: torch.fx.Graph, source: torch.fx.Node, value: torch.Tensor) -> torch.fx.Node:
    """Nodes computing ``source`` in an aligned layout (see the module docstring); symbolic sizes
    are read from ``source`` in the graph."""
    shape = list(value.shape)
    node = source
    broadcast = [d for d, (size, step) in enumerate(zip(shape, value.stride())) if step == 0 and size != 1]
    for dim in broadcast:
        node = call_with_value(graph, aten.slice.Tensor, (node, dim, 0, 1))
    last = _size(graph, source, value, len(shape) - 1)
    if type(last) is int:
        amount = -last % ALIGNMENT
    else:           # the same arithmetic on the size the call sees
        amount = call_with_value(graph, operator.mod, (call_with_value(graph, operator.neg, (last,)), ALIGNMENT))
    node = call_with_value(graph, aten.slice.Tensor, (_padded(graph, node, amount), -1, 0, last))
    if broadcast:
        sizes = [_size(graph, source, value, d) if d in broadcast else -1 for d in range(len(shape))]
        node = call_with_value(graph, aten.expand.default, (node, sizes))
    return node


def align_extern_inputs(gm: torch.fx.GraphModule) -> int:
    """Give each argument listed in :data:`ALIGNED_INPUTS` whose example value is not aligned an
    aligned copy (see the module docstring); returns how many were copied."""
    graph = gm.graph
    made: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in list(graph.nodes):
        positions = ALIGNED_INPUTS.get(node.target) if node.op == "call_function" else None
        if not positions:
            continue
        args, kwargs = list(node.args), dict(node.kwargs)
        for position in positions:
            if isinstance(position, str):
                given, source = kwargs, kwargs.get(position)
            else:
                given, source = args, args[position] if position < len(args) else None
            value = meta_of(source) if isinstance(source, torch.fx.Node) else None
            if not isinstance(value, torch.Tensor) or value.dim() == 0 or aligned(value):
                continue
            if source not in made:     # before its first reader: the nodes keep their order
                with graph.inserting_before(node):
                    made[source] = _aligned_copy(graph, source, value)
            given[position] = made[source]
        node.args, node.kwargs = tuple(args), kwargs
    if made:
        gm.recompile()
    return len(made)
