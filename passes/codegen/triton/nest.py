"""What the Triton backend decides for a loop nest on top of the shared kernel IR (which carries no
backend's fields): whether rows run over their padded extent, and whether row statistics follow
ATen's order."""
from __future__ import annotations

import attrs

from passes.kernel_ir.loops import LoopNest


@attrs.define(eq=False)
class TritonNest(LoopNest):
    """A loop nest with what the Triton backend decided for it on top of the shared kernel IR."""

    pitch: object = None             # pitch.Pitch: rows run over their padded extent
    aten_statistics: bool = False    # row variances in ATen's order (welford.py)

    @classmethod
    def of(cls, nest: LoopNest) -> "TritonNest":
        """``nest`` itself when it is one already, else a copy with no Triton decisions."""
        if isinstance(nest, cls):
            return nest
        return cls(**{f.name: getattr(nest, f.name) for f in attrs.fields(LoopNest)})
