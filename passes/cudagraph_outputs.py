"""Outputs of a CUDA-graph replay handed to the caller without a copy (``cudagraphs: {clone_outputs:
false}``), under torch's reduce-overhead contract: what a call returns stays valid until the same
graph replays again; then whatever the caller still holds of it (the tensors and every view of
them) raises on access, naming the graph, instead of showing the next call's values.

Each call's outputs are new storages on the recorded output buffers' memory (one per buffer, so
outputs that were views of one another still are), tracked by weak reference. The recordings of
one graph (every size it was recorded at) draw on a memory pool of their own: no other graph's
replay writes into what they handed out.
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from pipeline import compat

_support = compat.storage_handout()


def supported() -> bool:
    """Whether this torch can mark handed-out storages unreadable (CUDA builds can)."""
    return _support is not None


class HandOuts:
    """What the recordings of one graph handed out, and the memory pool they record into."""

    def __init__(self, graph_id: str):
        self.graph_id = graph_id
        self.message = (f"this tensor is an output of CUDA-graph replay of graph {graph_id}, overwritten "
                        "by a later call of the same graph (cudagraphs: {clone_outputs: false}, as torch's "
                        "mode='reduce-overhead'): clone it before calling again, or use clone_outputs: true")
        self.refs: list = []
        self._pool: Any = None
        self._lock = threading.Lock()

    def pool(self) -> Any:
        """The graph's own memory pool (made on the first recording)."""
        with self._lock:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            return self._pool

    def invalidate(self) -> int:
        """Before a replay: make what earlier calls handed out and the caller still holds
        unreadable. Returns how many storages were still held."""
        refs, self.refs = self.refs, []
        return sum(_support.invalidate(ref, self.message) for ref in refs)

    def hand_out(self, outputs: tuple, returns: tuple) -> tuple:
        """This call's outputs: each ``"hand out"`` output as a tensor on a new storage aliasing its
        recorded buffer, the others as they are."""
        storages: dict[int, torch.UntypedStorage] = {}
        result = []
        for value, how in zip(outputs, returns):
            if how != "hand out":
                result.append(value)
                continue
            buffer = value.untyped_storage()
            storage = storages.get(buffer.data_ptr())
            if storage is None:
                storage, ref = _support.alias(buffer)
                storages[buffer.data_ptr()] = storage
                self.refs.append(ref)
            result.append(value.new_empty(0).set_(storage, value.storage_offset(), value.shape, value.stride()))
        return tuple(result)
