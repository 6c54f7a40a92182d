"""Grouped-query attention without repeated key and value heads, made before the graph is traced to ATen.

A decoder with fewer key/value heads than query heads (Llama, Mistral, Qwen2, Gemma, Mixtral)
repeats each key/value head for its group of query heads before attention: transformers'
``repeat_kv`` is ``x[:, :, None].expand(b, kv, rep, s, d).reshape(b, kv * rep, s, d)``, a copy of
the keys and of the values per layer whenever a mask is given. ``scaled_dot_product_attention``
takes the unrepeated heads itself with ``enable_gqa=True`` (each key/value head serves
``rep`` consecutive query heads, the order ``repeat_kv`` makes). On the CPU its fused kernel then
reads each head once: no copies, and the attention itself runs faster. On CUDA (torch 2.11, an
H100) cuDNN's fused kernel takes grouped heads with a boolean or float mask and without
(benchmarks/results/sdpa-gqa-2026-12-06-h100.txt; transformers keeps repeat_kv when a mask is
given, citing a math-path fallback that this torch version no longer takes). The capture option
that applies the rewrite (``capture.gqa_attention``) names the devices. Calls whose inputs
require gradients are left alone: the fused kernels' backward with grouped heads is not checked.
"""
from __future__ import annotations

import operator

import torch
import torch.fx

SDPA = torch.nn.functional.scaled_dot_product_attention
_RESHAPES = ("reshape", "view")


def _value(node: object) -> object:
    return node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None


def _is_method(node: torch.fx.Node, names: tuple) -> bool:
    return node.op == "call_method" and node.target in names


def _unrepeated(node: object) -> tuple[torch.fx.Node, int] | None:
    """``(heads, rep)`` when ``node`` is ``repeat_kv(heads)`` as transformers writes it (a unit axis
    inserted after the head axis, expanded ``rep`` times there, reshaped into the head axis), else
    None. Shapes are checked on Dynamo's example values."""
    if not isinstance(node, torch.fx.Node):
        return None
    if _is_method(node, ("contiguous",)):
        node = node.args[0]
    reshaped = node
    if not (_is_method(reshaped, _RESHAPES) or reshaped.op == "call_function" and reshaped.target is torch.reshape):
        return None
    expanded = reshaped.args[0]
    if not isinstance(expanded, torch.fx.Node) or not _is_method(expanded, ("expand",)):
        return None
    inserted = expanded.args[0]
    if not isinstance(inserted, torch.fx.Node):
        return None
    if inserted.op == "call_function" and inserted.target is operator.getitem:
        index = inserted.args[1]
        if not (isinstance(index, tuple) and len(index) >= 3 and index[2] is None
                and all(i == slice(None) for i in index[:2] + index[3:])):
            return None
    elif not ((_is_method(inserted, ("unsqueeze",)) or inserted.op == "call_function"
               and inserted.target is torch.unsqueeze) and list(inserted.args[1:]) == [2]):
        return None
    heads = inserted.args[0]
    values = [_value(n) for n in (heads, expanded, reshaped)]
    if not all(isinstance(v, torch.Tensor) for v in values) or values[0].dim() != 4:
        return None
    source, wide, out = values
    b, kv, s, d = source.shape
    if tuple(wide.shape) != (b, kv, wide.shape[2], s, d) or tuple(out.shape) != (b, kv * wide.shape[2], s, d):
        return None
    return heads, int(wide.shape[2])


def grouped_query_attention(gm: torch.fx.GraphModule, devices: list[str]) -> int:
    """Give every ``scaled_dot_product_attention`` call in ``gm`` (a torch-level graph whose nodes
    carry Dynamo's ``example_value``) whose key and value are ``repeat_kv`` of the same factor, on
    one of ``devices``, the unrepeated key and value with ``enable_gqa=True``. Returns how many
    calls were rewritten; repeats nothing else reads are removed."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not SDPA or len(node.args) < 3:
            continue
        if node.kwargs.get("enable_gqa") or len(node.args) > 3:
            continue
        query = _value(node.args[0])
        key, value = _unrepeated(node.args[1]), _unrepeated(node.args[2])
        if key is None or value is None or key[1] != value[1] or key[1] < 2:
            continue
        if not isinstance(query, torch.Tensor) or query.device.type not in devices:
            continue
        if any(getattr(_value(n), "requires_grad", True) for n in node.args[:3]):
            continue
        repeated = (node.args[1], node.args[2])
        node.args = (node.args[0], key[0], value[0])
        node.kwargs = {**node.kwargs, "enable_gqa": True}
        for dead in repeated:
            _erase_unused(gm.graph, dead)
        rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten


def _erase_unused(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """Erase ``node`` and then its inputs, as long as nothing reads them."""
    pending = [node]
    while pending:
        current = pending.pop()
        if current.users or current.op not in ("call_function", "call_method"):
            continue
        inputs = list(current.all_input_nodes)
        graph.erase_node(current)
        pending.extend(inputs)


__all__ = ["grouped_query_attention"]
