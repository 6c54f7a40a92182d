"""What should fuse, among legal candidates: a swappable scoring object. No correctness rules
live here (see legality.py); a score of None declines a legal fusion."""
from __future__ import annotations

import attrs
import torch

from passes.kernel_ir.groups import meta_of


@attrs.frozen
class FusionScore:
    """Why a fusion is worth doing: the intermediate bytes it keeps out of memory."""

    bytes_saved: int
    reason: str


class FusionChoices:
    """Default heuristic: fuse whenever legal, preferring the candidate group that saves the most
    memory traffic (the intermediate is neither written nor read back)."""

    def __init__(self, max_group_size: int):
        self.max_group_size = max_group_size

    def score(self, group, node) -> FusionScore | None:
        if len(group.nodes) >= self.max_group_size:
            return None
        saved = 0
        for arg in node.all_input_nodes:
            value = meta_of(arg)
            if arg in group.members and isinstance(value, torch.Tensor):
                saved += 2 * value.numel() * value.element_size()
        return FusionScore(bytes_saved=saved, reason=f"keeps {saved} intermediate bytes in registers")

    def merge_independent(self, first, second) -> bool:
        """Whether two independent groups over the same domain (two reductions, or two pointwise
        groups reading a common input) should be one kernel: one launch instead of two (the bias
        and norm-weight gradient sums of a transformer's backward), while the merged group stays
        within the size limit."""
        return len(first.nodes) + len(second.nodes) <= self.max_group_size
