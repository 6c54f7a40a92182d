"""Rows over their padded extent: vector loads and stores for rows of odd length.

``pad-mm`` pads a matmul's N to a multiple of 8, so GPT-2's logits are rows of 50257 values in a
buffer whose rows are 50264 apart, and the gradient flowing back into the matmul is written into
such a padded buffer. A kernel masking every access at column 50257 leaves Triton unable to prove
that 8 neighbouring bf16 values are all in or all out, so every access is a scalar ``ld.b16`` /
``st.b16`` (``benchmarks/probes/ptx_vectors.py`` shows it on sm_90 PTX), and the cross-entropy
kernels stayed far from copy bandwidth (benchmarks/results/gpu-2026-11-29-f.md, gpu-2026-11-30-a.md).

A *pitched* nest iterates its last (contiguous) loop axis over the padded extent ``P`` (the rows'
pitch) instead of its size ``n``, and keeps ``i < n`` as a value-level predicate:
- a load whose rows are ``P`` apart (a *pitched* load) reads the padding too, masked only at the
  iteration's end, so it vectorizes; the padding's values are never used (reductions take their
  identity outside ``i < n``, stores select);
- an output pad (:data:`passes.kernel_ir.groups.PAD`) padding that axis by exactly ``P - n`` is stored over
  the whole padded row as ``where(i < n, value, pad value)``: the kernel writes the padding, so the
  separate fill of that region is dropped;
- every other access keeps the exact mask ``i < n``.

A pitched load reads ``P - n`` elements past each row, which is inside the buffer only when the
tensor's storage extends that far: true for a slice of a padded matmul result, not for an arbitrary
input with the same strides. Each pitched kernel therefore names, per pitched input, how many
elements its storage must hold past the tensor's offset (:attr:`Pitch.spans`); the kernel object
checks that on every call (a fraction of a microsecond) and runs the exact kernel when it does
not hold.
"""
from __future__ import annotations

from collections import Counter

import attrs
import torch.fx

from passes.kernel_ir.groups import REDUCTIONS, end_padding, meta_of, packet_name
from passes.kernel_ir.loops import LoopNest

MAX_PADDING = 64        # a pitch further than this past the row's end is not a padded row
VECTOR = 8              # the pitch must be a multiple of this many elements (16 bytes of bf16)


@attrs.frozen
class Pitch:
    """How a nest runs its last loop axis over a padded extent (see the module docstring)."""

    axis: int                   # the loop axis iterated over its padded extent
    size: int                   # its real size: ``i<axis> < size`` marks real elements
    extent: int                 # the padded extent (the rows' pitch)
    loads: frozenset            # keys of ``nest.loads`` read over the padded extent
    outputs: frozenset          # output pads written over the padded extent, padding included
    spans: tuple                # (placeholder position, elements its storage must hold past the offset)


def _full_level(nest: LoopNest, consumer: torch.fx.Node) -> bool:
    return nest.level.get(consumer) == "full" or packet_name(consumer.target) in REDUCTIONS


def _pitch_of(strides: tuple, axis: int, size: int) -> int | None:
    """The row pitch of an access walking ``axis`` contiguously whose other strides are whole
    rows, when it is a padded one (a multiple of :data:`VECTOR`, at most MAX_PADDING past ``size``)."""
    if strides[axis] != 1:
        return None
    others = [s for b, s in enumerate(strides) if b != axis and s != 0]
    if not others:
        return None
    pitch = min(others)
    if not (size < pitch <= size + MAX_PADDING) or pitch % VECTOR or any(s % pitch for s in others):
        return None
    return pitch


def _pads_axis(node: torch.fx.Node, size: int, extent: int) -> bool:
    """``node`` is an output pad whose last dim (``size`` long) it pads by exactly ``extent - size``."""
    padding = end_padding(node)
    if padding is None:
        return False
    regions, _ = padding
    rank = meta_of(node.args[0]).dim()
    return any(dim == rank - 1 and start == size and length == extent - size for dim, start, length in regions)


def pitch_nest(nest: LoopNest) -> LoopNest | None:
    """``nest`` iterating its last loop axis over the rows' padded extent, with the
    :class:`Pitch` that says how; None when no access has padded rows, or the nest is neither a
    reduction over that axis alone nor a pointwise nest whose outputs are all pitched pads (an
    exact output is stored contiguously, so vectorized, by the exact nest)."""
    sizes = nest.sizes
    if len(sizes) < 2 or getattr(nest, "pitch", None) is not None:
        return None
    if any(access.bounds or access.gather for access in nest.loads.values()):
        return None     # padded inputs are masked per element already; gathered ones read other rows
    axis = len(sizes) - 1
    size = sizes[axis]
    if size % VECTOR == 0:
        return None     # exact rows already vectorize
    reduction = bool(nest.group.reduced) or any(packet_name(n.target) in REDUCTIONS for n in nest.nodes)
    if reduction and tuple(nest.reduced) != (axis,):
        return None
    if not reduction and nest.outputs and min(nest.outputs[0][1].strides, key=abs) != nest.outputs[0][1].strides[axis]:
        return None     # the flat index would not walk this axis innermost
    loads = {key: _pitch_of(acc.strides, axis, size) for key, acc in nest.loads.items()
             if _full_level(nest, key[1]) and acc.strides[axis] != 0}
    outputs = {node: _pitch_of(acc.strides, axis, size) for node, acc in nest.outputs
               if nest.level[node] == "full" and acc.strides[axis] != 0}
    found = Counter(p for p in list(loads.values()) + list(outputs.values()) if p is not None)
    if not found:
        return None
    extent = found.most_common(1)[0][0]
    pitched_loads = frozenset(k for k, p in loads.items() if p == extent)
    pitched_outputs = frozenset(n for n, p in outputs.items() if p == extent and _pads_axis(n, size, extent))
    if not pitched_loads and not pitched_outputs:
        return None
    if not reduction and len(pitched_outputs) < len(outputs):
        return None     # an exact output stored from the padded iteration would lose its vector stores
    padded = tuple(extent if b == axis else s for b, s in enumerate(sizes))
    placeholders = [n for n in nest.group.subgraph.graph.nodes if n.op == "placeholder"]
    spans: dict[int, int] = {}
    for placeholder, consumer in pitched_loads:
        strides = nest.loads[(placeholder, consumer)].strides
        span = 1 + sum((s - 1) * abs(st) for s, st in zip(padded, strides))
        position = placeholders.index(placeholder)
        spans[position] = max(spans.get(position, 0), span)
    pitch = Pitch(axis=axis, size=size, extent=extent, loads=pitched_loads, outputs=pitched_outputs,
                  spans=tuple(sorted(spans.items())))
    return attrs.evolve(nest, sizes=padded, pitch=pitch)


def storage_covers(inputs: tuple, spans: tuple) -> bool:
    """True when each listed input's storage holds its span past the tensor's offset."""
    for position, span in spans:
        tensor = inputs[position]
        if tensor.untyped_storage().nbytes() < (tensor.storage_offset() + span) * tensor.element_size():
            return False
    return True
