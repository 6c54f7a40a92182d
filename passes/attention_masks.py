"""Attention masks that the fused attention kernels accept, made before the graph is traced to ATen.

``scaled_dot_product_attention`` is a composite: tracing (Dynamo's graph to ATen, or AOTAutograd's
joint graph) picks its kernel on the traced shapes and strides, and the fused kernels (cuDNN, flash,
memory-efficient) need the mask's key axis at unit stride. A mask broadcast along that axis (an
``expand`` with stride 0 there, as the all-True masks transformers builds under tracing for ViT and
wav2vec2 are, strides ``(0, q, 1, 0)``, where eagerly the fused kernel runs) sends the call to the
math path: two float32 batched matmuls and a softmax per layer. :func:`dense_attention_masks` makes such a mask
dense once (``contiguous``), shared by every attention call that reads it, so tracing keeps the fused
kernel.
"""
from __future__ import annotations

import torch
import torch.fx

SDPA = torch.nn.functional.scaled_dot_product_attention


def _mask_of(node: torch.fx.Node) -> tuple[torch.fx.Node | None, str | int | None]:
    """The attention mask argument of an sdpa call and where it is (keyword name or position)."""
    if "attn_mask" in node.kwargs:
        return node.kwargs["attn_mask"], "attn_mask"
    if len(node.args) > 3:
        return node.args[3], 3
    return None, None


def _needs_dense(value: object, devices: list[str]) -> bool:
    return (isinstance(value, torch.Tensor) and value.device.type in devices and value.dim() >= 1
            and value.shape[-1] > 1 and value.stride(-1) != 1)


def dense_attention_masks(gm: torch.fx.GraphModule, devices: list[str]) -> int:
    """Give every ``scaled_dot_product_attention`` call in ``gm`` (a torch-level graph whose nodes
    carry Dynamo's ``example_value``) a mask with a unit-stride key axis, where it is on one of
    ``devices`` and had another stride. Returns how many masks were made dense."""
    dense: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not SDPA:
            continue
        mask, where = _mask_of(node)
        if not isinstance(mask, torch.fx.Node):
            continue
        if mask not in dense:
            value = mask.meta.get("example_value")
            if not _needs_dense(value, devices):
                continue
            with gm.graph.inserting_after(mask):
                made = gm.graph.call_method("contiguous", (mask,))
            made.meta.update({k: v for k, v in mask.meta.items() if k in ("stack_trace", "nn_module_stack")})
            made.meta["example_value"] = value.contiguous()
            dense[mask] = made
        if where == "attn_mask":
            node.kwargs = {**node.kwargs, "attn_mask": dense[mask]}
        else:
            node.args = node.args[:3] + (dense[mask],) + node.args[4:]
    if dense:
        gm.recompile()
    return len(dense)
