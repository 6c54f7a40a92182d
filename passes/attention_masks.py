"""Attention masks that the fused attention kernels accept, made before the graph is traced to ATen.

``scaled_dot_product_attention`` is a composite: tracing (Dynamo's graph to ATen, or AOTAutograd's
joint graph) picks its kernel on the traced shapes and strides, and the fused kernels (cuDNN, flash,
memory-efficient) need the mask's key axis at unit stride. A mask broadcast along that axis (an
``expand`` with stride 0 there, as the all-True masks transformers builds under tracing for ViT and
wav2vec2 are, strides ``(0, q, 1, 0)``, where eagerly the fused kernel runs) sends the call to the
math path: two float32 batched matmuls and a softmax per layer. :func:`dense_attention_masks` makes such a mask
dense once (``contiguous``), shared by every attention call that reads it, so tracing keeps the fused
kernel.

Masks built from index ramps alone (no input) are constants of the graph, and most of them say
something the call can say without a mask: ViT's hides nothing (every query sees every key), and
a decoder's called without a padding mask is the causal pattern. :func:`constant_attention_masks`
evaluates such a mask once when the graph is captured; one that hides nothing (all True, all zero
when additive) is dropped, and one that is the causal pattern (query ``i`` sees keys ``0..i``, as
``is_causal`` means) becomes ``is_causal=True``. The fused kernels then read no mask, and flash
attention, the fastest, runs.
"""
from __future__ import annotations

import operator

import torch
import torch.fx

from pipeline import compat

SDPA = torch.nn.functional.scaled_dot_product_attention


def _mask_of(node: torch.fx.Node) -> tuple[torch.fx.Node | None, str | int | None]:
    """The attention mask argument of an sdpa call and where it is (keyword name or position)."""
    if "attn_mask" in node.kwargs:
        return node.kwargs["attn_mask"], "attn_mask"
    if len(node.args) > 3:
        return node.args[3], 3
    return None, None


#: Most nodes a mask may be computed from for constant_attention_masks to evaluate it.
MAX_MASK_NODES = 64

#: Tensor methods that draw random numbers (a mask using one is never evaluated at capture).
RANDOM_METHODS = frozenset({"bernoulli", "bernoulli_", "uniform_", "normal_", "random_", "exponential_",
                            "geometric_", "cauchy_", "log_normal_"})


def _inputless(mask: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The nodes ``mask`` is computed from, in graph order, when none is an input (placeholder)
    or random and there are at most :data:`MAX_MASK_NODES`; else None."""
    seen: set = set()
    stack = [mask]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if len(seen) > MAX_MASK_NODES or node.op not in ("call_function", "call_method", "get_attr"):
            return None
        if node.op == "call_function" and compat.is_nondeterministic(node.target):
            return None
        if node.op == "call_method" and node.target in RANDOM_METHODS:
            return None
        stack.extend(node.all_input_nodes)
    return [n for n in mask.graph.nodes if n in seen]


def _evaluated(gm: torch.fx.GraphModule, nodes: list[torch.fx.Node]) -> object:
    """The value of the last of ``nodes`` (see :func:`_inputless`), computed on real tensors;
    None when a node cannot be computed so (the mask then stays as captured)."""
    values: dict = {}
    with compat.real_tensors(), torch.no_grad():
        for node in nodes:
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), values.__getitem__)
            try:
                if node.op == "get_attr":
                    values[node] = operator.attrgetter(node.target)(gm)
                elif node.op == "call_method":
                    values[node] = getattr(args[0], node.target)(*args[1:], **kwargs)
                else:
                    values[node] = node.target(*args, **kwargs)
            except Exception:  # noqa: BLE001 - an operator that needs the trace's context: keep the mask
                return None
    return values[nodes[-1]]


def visible_keys(value: object) -> torch.Tensor | None:
    """Which keys each query sees under a mask value (True where visible); None for a value that
    is not a real boolean mask or an additive one of zeros and exclusions (``-inf`` or the
    dtype's lowest value, as transformers writes them: a finite penalty such as ``-1e4`` changes
    the softmax, however little, so it is no exclusion)."""
    if not isinstance(value, torch.Tensor) or compat.is_fake(value) or value.dim() < 2:
        return None
    if value.dtype == torch.bool:
        return value
    if not value.is_floating_point():
        return None
    visible = value == 0
    excluded = (value == float("-inf")) | (value <= torch.finfo(value.dtype).min)
    return visible if bool((visible | excluded).all()) else None


def constant_form(visible: torch.Tensor, queries: int, keys: int) -> str | None:
    """"none" when every query sees every key, "causal" when query ``i`` sees exactly keys
    ``0..i`` (``is_causal``'s top-left pattern), else None."""
    try:
        visible = torch.broadcast_to(visible, (*visible.shape[:-2], queries, keys))
    except RuntimeError:
        return None
    if bool(visible.all()):
        return "none"
    causal = torch.ones(queries, keys, dtype=torch.bool, device=visible.device).tril()
    return "causal" if bool((visible == causal).all()) else None


def constant_attention_masks(gm: torch.fx.GraphModule, devices: list[str]) -> int:
    """Rewrite every ``scaled_dot_product_attention`` in ``gm`` (a torch-level graph whose nodes
    carry Dynamo's ``example_value``) on one of ``devices`` whose mask is computed from no input
    and hides nothing (dropped) or is the causal pattern (``is_causal=True`` instead), see the
    module docstring; the mask's nodes nothing else reads are removed. Returns how many calls
    were rewritten."""
    evaluated: dict[torch.fx.Node, torch.Tensor | None] = {}
    made: list[torch.fx.Node] = []
    rewritten = 0
    for node in list(gm.graph.nodes):
        if (node.op != "call_function" or node.target is not SDPA or node.kwargs.get("is_causal")
                or len(node.args) > 5):     # dropout_p, is_causal given by position
            continue
        mask, where = _mask_of(node)
        value = mask.meta.get("example_value") if isinstance(mask, torch.fx.Node) else None
        query, key = (a.meta.get("example_value") if isinstance(a, torch.fx.Node) else None for a in node.args[:2])
        if not all(isinstance(v, torch.Tensor) for v in (value, query, key)) or value.device.type not in devices:
            continue
        if mask not in evaluated:
            nodes = _inputless(mask)
            evaluated[mask] = visible_keys(_evaluated(gm, nodes)) if nodes is not None else None
            made += nodes or []
        if evaluated[mask] is None:
            continue
        form = constant_form(evaluated[mask], query.shape[-2], key.shape[-2])
        if form is None:
            continue
        kwargs = {k: v for k, v in node.kwargs.items() if k != "attn_mask"}
        if form == "causal":
            kwargs["is_causal"] = True
        node.args, node.kwargs = node.args[:3] + ((None,) if where == 3 else ()) + node.args[4:], kwargs
        rewritten += 1
    doomed = set(made)
    for node in reversed(list(gm.graph.nodes)):
        if node in doomed and not node.users:
            gm.graph.erase_node(node)
    if rewritten:
        gm.recompile()
    return rewritten


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
