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
where it is a multiple of the alignment for every value of its symbols.
"""
from __future__ import annotations

import sympy
import torch
import torch.fx

from pipeline import compat
from passes.kernel_ir.groups import meta_of

aten = torch.ops.aten

ALIGNMENT = 16          # elements: a multiple of the 8 (16-bit) or 4 (32-bit) the kernels check

#: operator -> positions of the arguments whose every stride but the last must be a multiple of
#: ALIGNMENT (or 0, a broadcast), with a unit last stride
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


def _call(graph: torch.fx.Graph, target, args: tuple) -> torch.fx.Node:
    node = graph.call_function(target, args)
    node.meta["val"] = compat.example_value(node)
    return node


def _aligned_copy(graph: torch.fx.Graph, source: torch.fx.Node, value: torch.Tensor) -> torch.fx.Node:
    """Nodes computing ``source`` in an aligned layout (see the module docstring)."""
    shape = list(value.shape)
    node = source
    broadcast = [d for d, (size, step) in enumerate(zip(shape, value.stride())) if step == 0 and size != 1]
    for dim in broadcast:
        node = _call(graph, aten.slice.Tensor, (node, dim, 0, 1))
    last = shape[-1]
    padded = -(-last // ALIGNMENT) * ALIGNMENT
    node = _call(graph, aten.constant_pad_nd.default, (node, [0, padded - last], 0.0))
    node = _call(graph, aten.slice.Tensor, (node, -1, 0, last))
    if broadcast:
        node = _call(graph, aten.expand.default, (node, shape))
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
        args = list(node.args)
        for position in positions:
            source = args[position] if position < len(args) else None
            value = meta_of(source) if isinstance(source, torch.fx.Node) else None
            if not isinstance(value, torch.Tensor) or value.dim() == 0 or aligned(value):
                continue
            if source not in made:
                with graph.inserting_after(source):
                    made[source] = _aligned_copy(graph, source, value)
            args[position] = made[source]
        node.args = tuple(args)
    if made:
        gm.recompile()
    return len(made)
