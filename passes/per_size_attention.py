"""Attention whose mask is a per-size value: its form is checked once per mask, and a mask that
hides nothing or is the causal pattern is not passed to the kernel.

In a graph with symbolic sizes a decoder's causal mask depends on the sequence length, so it
cannot be evaluated when the graph is captured (:mod:`passes.attention_masks` does that for
static graphs) and stays an attention bias: the kernel reads an ``L x S`` mask (on CUDA the
memory-efficient kernel also gets an aligned copy of it on every call) where with ``is_causal``
it reads none and skips the hidden blocks. ``constant-fold`` computes such a mask once per size
seen (:class:`passes.constant_fold.PerSizeValues`), so the same tensor comes back for every call
at one size. :class:`PerSizeMaskAttention` takes the attention call's place: it looks at each
mask it is given once (one read of its values, never while a CUDA graph is being recorded),
keeps the answer while the mask lives, and calls the same attention operator with
``is_causal=True`` and no mask, with no mask, or with the mask (in the aligned layout the
operator needs, made once per mask).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.utils.weak import WeakIdKeyDictionary

from pipeline import compat
from passes.attention_masks import constant_form, visible_keys
from passes.kernel_ir.extern_layouts import ALIGNED_INPUTS, aligned, aligned_copy

MASK_NAMES = ("attn_mask", "attn_bias")
FORMS = ("causal", "none", "mask")


def _mask_name(op: Any) -> str | None:
    """The name of the mask argument of an attention operator (``query, key, value`` first, an
    ``is_causal`` flag), or None for any other operator."""
    if not isinstance(op, torch._ops.OpOverload):
        return None
    names = [a.name for a in op._schema.arguments]
    mask = [n for n in names if n in MASK_NAMES]
    if names[:3] != ["query", "key", "value"] or "is_causal" not in names or len(mask) != 1:
        return None
    return mask[0]


def _bound(node: torch.fx.Node) -> dict:
    """The node's arguments by schema name (those given)."""
    names = [a.name for a in node.target._schema.arguments]
    return {**dict(zip(names, node.args)), **node.kwargs}


class PerSizeMaskAttention:
    """``op(query, key, value, <mask>, **options)`` where the mask is one of a few tensors that
    come back call after call (a per-size value): each mask's form (``"causal"``, ``"none"`` or
    ``"mask"``) is found once and the call made accordingly (module docstring). ``forms`` counts
    the masks found of each form. What was found is shared by every such call (the layers of a
    model read one mask): kept per mask while it lives, by its query and key lengths and layout."""

    known: WeakIdKeyDictionary = WeakIdKeyDictionary()     # mask -> {(queries, keys, align): (form, passed)}

    def __init__(self, op: torch._ops.OpOverload, mask_name: str, options: dict):
        self.op = op
        self.mask_name = mask_name
        self.options = dict(options)
        self.calls = {False: self.options, True: {**self.options, "is_causal": True}}   # keywords but the mask
        self.align = op in ALIGNED_INPUTS
        self.forms = dict.fromkeys(FORMS, 0)
        self.__name__ = f"per_size_mask_{op._schema.name.split('::')[-1]}"
        # (mask, queries, keys, the call made for them) of the last call: calls at one size pass
        # the same mask, and then only compare. Keeps that one mask alive until the next size.
        self.last: tuple = (None, None, None, None)

    def __call__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> Any:
        last = self.last
        if mask is last[0] and query.shape[-2] == last[1] and key.shape[-2] == last[2]:
            return last[3](query, key, value)
        if compat.tracing_now():        # a pass re-tracing the graph keeps this one call
            return compat.traced_as_one_call(self, (query, key, value, mask),
                                             lambda: self._bound(mask, False)(query, key, value))
        by_shape = self.known.get(mask)
        shape = (query.shape[-2], key.shape[-2], self.align)
        known = by_shape.get(shape) if by_shape is not None else None
        if known is None:
            if compat.is_fake(mask) or compat.capturing_cuda_graph():   # no look at the values here
                copy = self._copy(mask)
                return self._bound(mask if copy is None else copy, False)(query, key, value)
            known = self._classify(query, key, mask)
            self.known.setdefault(mask, {})[shape] = known
        form, copy = known
        call = self._bound((mask if copy is None else copy) if form == "mask" else None, form == "causal")
        self.last = (mask, shape[0], shape[1], call)
        return call(query, key, value)

    def _classify(self, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor) -> tuple:
        """``(form, aligned copy or None)``; never the mask itself, which would keep its entry alive."""
        with torch.no_grad():
            visible = visible_keys(mask)
            form = (constant_form(visible, query.shape[-2], key.shape[-2]) if visible is not None else None) or "mask"
        self.forms[form] += 1
        return form, (self._copy(mask) if form == "mask" else None)

    def _copy(self, mask: torch.Tensor) -> torch.Tensor | None:
        """The mask's aligned copy where the operator needs one it lacks, else None."""
        return aligned_copy(mask) if self.align and mask.dim() and not aligned(mask) else None

    def _bound(self, mask: torch.Tensor | None, causal: bool) -> Callable:
        """The operator with every argument but ``query, key, value`` bound: ``mask`` (or none) and
        ``is_causal``."""
        return functools.partial(self.op, **self.calls[causal], **{self.mask_name: mask})

    def __repr__(self) -> str:
        return f"PerSizeMaskAttention({self.op}, {self.forms})"

    def to_data(self, codec: Any) -> dict:
        return {"op": str(self.op), "mask": self.mask_name, "options": self.options}

    @classmethod
    def from_data(cls, data: dict, codec: Any) -> "PerSizeMaskAttention":
        op = compat.resolve_op(data["op"])
        if op is None:
            raise ValueError(f"unknown attention operator {data['op']!r}")
        return cls(op, data["mask"], data["options"])


def dispatch_per_size_masks(graph: torch.fx.Graph, masks: set) -> int:
    """Make each attention call in ``graph`` whose mask is one of the nodes ``masks`` (per-size
    values) a :class:`PerSizeMaskAttention` call, where it is not causal already, drops nothing
    (dropout 0) and its other arguments are constants. Returns how many were made."""
    made = 0
    for node in list(graph.nodes):
        name = _mask_name(node.target) if node.op == "call_function" else None
        if name is None:
            continue
        bound = _bound(node)
        mask = bound.get(name)
        if not isinstance(mask, torch.fx.Node) or mask not in masks or bound.get("is_causal") or bound.get("dropout_p", 0.0) != 0.0:
            continue
        options = {k: v for k, v in bound.items() if k not in ("query", "key", "value", name)}
        if any(isinstance(v, torch.fx.Node) for v in pytree.tree_leaves(options)):
            continue
        node.args = (bound["query"], bound["key"], bound["value"], bound[name])
        node.kwargs = {}
        node.target = PerSizeMaskAttention(node.target, name, options)
        made += 1
    return made


__all__ = ["PerSizeMaskAttention", "dispatch_per_size_masks"]
