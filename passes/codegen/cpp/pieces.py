"""Pieces of a pointwise loop nest: index ranges over which every select on the index is decided.

A concatenation read by its consumer's kernel is a select on the position along the cat's dim
(passes/fuse/cats.py)::

    where(i < 128, a(pad(x)), b(pad(y)))     # each pad: a masked load of its piece

Evaluated as written, every element computes both branches (a GELU and its derivative, each with
an ``exp``) and takes one. Over ``i < 128`` the select is known to take ``a`` and ``y``'s pad is
known to read nothing, so the kernel instead runs one loop per piece, each computing only what its
piece keeps: the same values, with the work of one branch.

:func:`pieces` finds the cut points on each loop axis (where a comparison of an index ramp with a
constant changes, or where a padded load's bounds begin and end), splits the nest into the
ranges between them, and for each range names the comparisons it decides and the nodes still
needed. It declines (None) unless some select is decided somewhere, when an axis or a bound is
symbolic, or when there would be more than :data:`MAX_PIECES` pieces.
"""
from __future__ import annotations

import itertools
import math
import operator
from typing import Any

import attrs
import torch.fx

from passes.kernel_ir.groups import packet_name
from passes.kernel_ir.loops import LoopNest
from passes.kernel_ir.nodes import UNIT_RESHAPES

MAX_PIECES = 16
_COMPARE = {"aten.lt": operator.lt, "aten.le": operator.le, "aten.gt": operator.gt, "aten.ge": operator.ge,
            "aten.eq": operator.eq, "aten.ne": operator.ne}
_FLIPPED = {"aten.lt": "aten.gt", "aten.le": "aten.ge", "aten.gt": "aten.lt", "aten.ge": "aten.le",
            "aten.eq": "aten.eq", "aten.ne": "aten.ne"}
_LOGICAL = {"aten.logical_and": all, "aten.bitwise_and": all, "aten.logical_or": any, "aten.bitwise_or": any}
_NOT = ("aten.logical_not", "aten.bitwise_not")


@attrs.frozen
class Piece:
    """One range of the nest: ``ranges`` maps each split axis to ``(lo, hi)``; ``known`` maps
    the comparisons (and logic on them) decided there to their value; ``live`` is the set of
    nodes the piece computes."""

    ranges: dict
    known: dict
    live: frozenset


def _number(arg: Any) -> bool:
    return isinstance(arg, (int, float)) and not isinstance(arg, bool) and math.isfinite(arg)


def _ramp_comparison(node: torch.fx.Node, nest: LoopNest) -> tuple | None:
    """``(axis, start, step, name, constant)`` for a comparison of an index ramp along a loop axis
    with a constant, read as ``start + step * i<axis> <name> constant``; None otherwise."""
    name = packet_name(node.target)
    if name not in _COMPARE or len(node.args) != 2:
        return None
    for position, flipped in ((0, name), (1, _FLIPPED[name])):
        ramp, other = nest.ramps.get(node.args[position]), node.args[1 - position]
        if ramp is None or ramp.axis is None or not _number(other):
            continue
        if isinstance(ramp.start, int) and isinstance(ramp.step, int):
            return ramp.axis, ramp.start, ramp.step, flipped, other
    return None


def _decided(comparison: tuple, lo: int, hi: int) -> bool | None:
    """The comparison's value over ``lo <= i < hi`` when it is the same everywhere there (the
    ramp is monotone, so the ends decide lt/le/gt/ge; eq/ne are decided away from the constant)."""
    _, start, step, name, constant = comparison
    first, last = start + step * lo, start + step * (hi - 1)
    at_first, at_last = _COMPARE[name](first, constant), _COMPARE[name](last, constant)
    if name in ("aten.eq", "aten.ne"):
        inside = min(first, last) <= constant <= max(first, last)
        if lo + 1 == hi or not inside:
            return at_first
        return None
    return at_first if at_first == at_last else None


def _cuts(nest: LoopNest, comparisons: dict) -> dict:
    """Per loop axis, the inner cut points (0 < cut < size) of the comparisons and padded loads."""
    cuts: dict = {}
    for axis, start, step, _, constant in comparisons.values():
        if step == 0:
            continue
        edge = (constant - start) / step
        cuts.setdefault(axis, set()).update({int(edge) - 1, int(edge), int(edge) + 1})
    for access in nest.loads.values():
        for axis, lo, hi in access.bounds:
            if not (isinstance(lo, int) and isinstance(hi, int)):
                return {}
            cuts.setdefault(axis, set()).update({lo, hi})
    out = {}
    for axis, points in cuts.items():
        size = nest.sizes[axis]
        if not isinstance(size, int):
            return {}
        inner = sorted(p for p in points if 0 < p < size)
        if inner:
            out[axis] = [0, *inner, size]
    return out


def open_bounds(bounds: tuple, ranges: dict) -> tuple | None:
    """The bounds of a padded load still to test over ``ranges`` (those the ranges do not lie
    wholly inside), or None when the ranges lie wholly outside one: the load is its fill there."""
    left = []
    for axis, lo, hi in bounds:
        if axis in ranges:
            plo, phi = ranges[axis]
            if phi <= lo or plo >= hi:
                return None
            if lo <= plo and phi <= hi:
                continue
        left.append((axis, lo, hi))
    return tuple(left)


def _known(nest: LoopNest, comparisons: dict, ranges: dict) -> dict:
    known: dict = {}
    for node in nest.nodes:
        name = packet_name(node.target)
        if node in comparisons:
            axis = comparisons[node][0]
            if axis in ranges:
                value = _decided(comparisons[node], *ranges[axis])
                if value is not None:
                    known[node] = value
        elif name in UNIT_RESHAPES and node.args and node.args[0] in known:   # (a pad's fill is not)
            known[node] = known[node.args[0]]
        elif name in _NOT and node.args[0] in known:
            known[node] = not known[node.args[0]]
        elif name in _LOGICAL and len(node.args) == 2:
            values = [known.get(a, a if isinstance(a, bool) else None) for a in node.args]
            combine = _LOGICAL[name]
            if None not in values:
                known[node] = combine(values)
            elif combine is all and False in values:
                known[node] = False
            elif combine is any and True in values:
                known[node] = True
    return known


def _live(nest: LoopNest, known: dict) -> frozenset:
    """The nodes the outputs need when the selects ``known`` decides take one branch."""
    compute = set(nest.nodes)
    live, stack = set(), [node for node, _ in nest.outputs]
    while stack:
        node = stack.pop()
        if node in live or node not in compute:
            continue
        live.add(node)
        if node in known:
            continue
        if packet_name(node.target) == "aten.where" and node.args[0] in known:
            stack.append(node.args[1] if known[node.args[0]] else node.args[2])
        else:
            stack.extend(node.all_input_nodes)
    return frozenset(live)


def _decides_a_select(nest: LoopNest, known: dict) -> bool:
    return any(packet_name(n.target) == "aten.where" and n.args[0] in known for n in nest.nodes)


def pieces(nest: LoopNest) -> list[Piece] | None:
    """The pieces of a pointwise nest in loop order (see the module docstring), or None."""
    comparisons = {n: c for n in nest.nodes if (c := _ramp_comparison(n, nest)) is not None}
    cuts = _cuts(nest, comparisons)
    if not cuts:
        return None
    axes = sorted(cuts)
    intervals = {axis: list(zip(points, points[1:])) for axis, points in cuts.items()}
    if _count(intervals) > 8 * MAX_PIECES:
        return None

    def signature(ranges: dict) -> tuple:
        known = _known(nest, comparisons, ranges)
        loads = tuple(open_bounds(access.bounds, ranges) for access in nest.loads.values())
        return tuple(sorted((n.name, v) for n, v in known.items())), loads

    for axis in axes:       # merge neighbouring ranges that decide the same way everywhere
        others = [intervals[a] for a in axes if a != axis]
        merged = [intervals[axis][0]]
        for nxt in intervals[axis][1:]:
            joined = (merged[-1][0], nxt[1])
            same = all(signature(_ranges(axes, axis, merged[-1], rest)) == signature(_ranges(axes, axis, nxt, rest))
                       for rest in itertools.product(*others))
            merged[-1:] = [joined] if same else [merged[-1], nxt]
        intervals[axis] = merged
    axes = [a for a in axes if len(intervals[a]) > 1]
    if not axes or _count({a: intervals[a] for a in axes}) > MAX_PIECES:
        return None
    out = []
    for combo in itertools.product(*(intervals[a] for a in axes)):
        ranges = dict(zip(axes, combo))
        known = _known(nest, comparisons, ranges)
        out.append(Piece(ranges, known, _live(nest, known)))
    if not any(_decides_a_select(nest, piece.known) for piece in out):
        return None
    return out


def _ranges(axes: list, axis: int, interval: tuple, rest: tuple) -> dict:
    others = [a for a in axes if a != axis]
    return {axis: interval, **dict(zip(others, rest))}


def _count(intervals: dict) -> int:
    total = 1
    for ranges in intervals.values():
        total *= len(ranges)
    return total
