"""What a compile keeps per captured graph, read by the compile report, ``explain`` and expectations."""
from __future__ import annotations

import attrs


@attrs.define(eq=False)
class GraphRecord:
    """What happened to one captured graph."""

    graph_id: str
    role: str
    nodes_in: int
    passes: list = attrs.field(factory=list)
    notes: list = attrs.field(factory=list)
    tags: list = attrs.field(factory=list)
    fallback: str | None = None
    verified: str = "not requested"
    seconds: float = 0.0
    final_code: str = ""
    metrics: dict = attrs.field(factory=dict)    # registered metric name -> its value for the final graph
    sources: list = attrs.field(factory=list)    # {"stage", "code"}: as captured, then after each pass
    reproducer: str | None = None
    cache: dict = attrs.field(factory=dict)      # the compile cache's outcome (graph_cache.Probe.summary)
    saved: dict | None = None   # backward graphs: what the forward saved for it (ir.saved_for_backward)

    def __getattr__(self, name: str):
        """A registered metric's value by name (``record.kernels``)."""
        if not name.startswith("_"):
            metrics = object.__getattribute__(self, "metrics")
            if name in metrics:
                return metrics[name]
        raise AttributeError(f"graph record has no field or metric '{name}'")


__all__ = ["GraphRecord"]
