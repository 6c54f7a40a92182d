"""Corrections of torch bugs that capturing data-dependent sizes runs into, applied once in the
process by :func:`apply_data_dependent_fixes` (the first time a plan captures with
``capture.data_dependent``). Each names the torch behaviour it corrects; a torch release that
fixes it makes the correction a no-op."""
from __future__ import annotations

import threading

import torch

_applied = False
_lock = threading.Lock()


def apply_data_dependent_fixes() -> None:
    """Apply every correction below, once per process (later calls return at once)."""
    global _applied
    with _lock:
        if _applied:
            return
        _applied = True
        _masked_select_bound()


def _masked_select_bound() -> None:
    """``masked_select``'s fake kernel bounds the number of selected elements by ``self.numel()``;
    with a mask that broadcasts ``self`` to a larger shape the count can exceed it, and the
    runtime assertion Dynamo derives from the bound (``u0 <= numel``) fails on a correct call.
    The corrected kernel passes a stand-in of the broadcast shape, so the bound is its numel."""
    try:
        from torch._subclasses import fake_impls
    except ImportError:
        return
    table = getattr(fake_impls, "op_implementations_dict", None)
    op = torch.ops.aten.masked_select.default
    if not isinstance(table, dict) or op not in table:
        return
    original = table[op]

    def masked_select(fake_mode, func, self, mask):
        shape = torch.broadcast_shapes(self.shape, mask.shape)
        if tuple(shape) != tuple(self.shape):
            self = self.new_empty(shape)
        return original(fake_mode, func, self, mask)

    table[op] = masked_select
