"""Online softmax statistics: a row's maximum and its sum of exponentials in one pass.

Cross-entropy's forward (and a softmax too long to keep in registers) computes ``m = amax(x)``,
then ``s = sum(exp(x - m))``: a looped kernel reads the row once per reduction. Over GPT-2's
50257 logits that is two passes over 412 MB per step. Keeping, per lane, the running maximum and
the sum scaled to it (``s = s * exp(m_old - m_new) + exp(x - m_new)``), then combining the lanes
(``S = sum(s_lane * exp(m_lane - M))``), gives both in the first pass.

The pair is recognized in a nest as ``sum(exp(sub(a, m)))`` with ``m = amax(a)`` of the same
``a``, all in float32/float64 (no rounding between the ops that the online form would skip), the
sum alone in its pass. Rows whose elements are all ``-inf`` give NaN, as eager's ``-inf - -inf``
does; NaN and ``+inf`` propagate as in eager.
"""
from __future__ import annotations

import torch
import torch.fx

from pipeline.fused import REDUCTIONS, UNIT_RESHAPES, meta_of, packet_name
from pipeline.loops import LoopNest

_EXACT = (torch.float32, torch.float64)


def _reduced_value(node, reductions: list):
    """The reduction ``node`` is, or reaches through size-1 reshapes, else None."""
    while isinstance(node, torch.fx.Node) and node not in reductions:
        if node.op != "call_function" or packet_name(node.target) not in UNIT_RESHAPES | {"aten.alias"}:
            return None
        node = node.args[0]
    return node if isinstance(node, torch.fx.Node) else None


def online_pairs(nest: LoopNest) -> dict:
    """``{amax node: sum node}`` for each maximum whose sum of exponentials can share its pass."""
    reductions = [n for n in nest.nodes if packet_name(n.target) in REDUCTIONS]
    pairs = {}
    for total in reductions:
        if packet_name(total.target) != "aten.sum" or total.kwargs.get("dtype") is not None:
            continue
        exp = total.args[0]
        if not isinstance(exp, torch.fx.Node) or exp.op != "call_function" or packet_name(exp.target) != "aten.exp":
            continue
        sub = exp.args[0]
        if not isinstance(sub, torch.fx.Node) or sub.op != "call_function" or packet_name(sub.target) != "aten.sub" \
                or len(sub.args) != 2 or sub.kwargs:
            continue
        source, peak = sub.args[0], _reduced_value(sub.args[1], reductions)
        if peak is None or packet_name(peak.target) != "aten.amax" or peak.args[0] is not source:
            continue
        if any(meta_of(n).dtype not in _EXACT for n in (source, sub, exp, total)):
            continue
        same_pass = [r for r in reductions if nest.pass_of[r] == nest.pass_of[total]]
        if nest.pass_of[total] == nest.pass_of[peak] + 1 and same_pass == [total] and peak not in pairs:
            pairs[peak] = total
    return pairs


def online_update(peak: torch.fx.Node, total: torch.fx.Node, value: str, mask: str | None) -> list[str]:
    """Lines after the maximum's accumulator update in the chunk loop (``value``: the chunk's
    tile of the maximum's source; ``prev_<sum>`` holds the lanes' maximum before the update)."""
    m, s = f"acc_{peak.name}", f"acc_{total.name}"
    term = f"tl.exp({value} - {m})"
    if mask:
        term = f"tl.where({mask}, {term}, 0.0)"
    return [f"{s} = tl.where({m} == -float('inf'), 0.0, {s} * tl.exp(prev_{total.name} - {m}) + {term})"]


def online_finish(peak: torch.fx.Node, total: torch.fx.Node) -> list[str]:
    """Lines combining the lanes into the sum's value ``v_<sum>`` (after ``v_<amax>`` is final)."""
    m, s, v = f"acc_{peak.name}", f"acc_{total.name}", f"v_{total.name}"
    return [f"{v} = tl.sum(tl.where({m} == -float('inf'), 0.0, {s} * tl.exp({m} - v_{peak.name})), 1, "
            "keep_dims=True)",
            f"{v} = tl.where(v_{peak.name} == -float('inf'), float('nan'), {v})"]
