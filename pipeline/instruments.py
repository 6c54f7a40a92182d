"""Instrumentation implemented as ordinary hook implementations, registered per compile:
pass timing, graph snapshots for ``verify: each``, source dumps (``PIPELINE_DUMP_DIR``) and the
per-pass sources of the compile report."""
from __future__ import annotations

import copy
import os
import re
import time
from pathlib import Path
from typing import Any

import torch.fx

from pipeline.hooks import hookimpl


def copy_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """An independent copy of a graph module (the graph is copied; tensors are shared)."""
    new = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    new.meta = dict(getattr(gm, "meta", {}))
    return new


class PassTimer:
    """Records each pass's wall time and node counts into the graph's record."""

    def __init__(self, record: Any):
        self.record = record
        self._start = 0.0
        self._nodes_before = 0

    @hookimpl
    def pipeline_before_pass(self, pass_: Any, graph: Any, context: Any) -> None:
        """Start the clock and count the nodes the pass receives."""
        self._nodes_before = len(graph.graph.nodes)
        self._start = time.perf_counter()

    @hookimpl
    def pipeline_after_pass(self, pass_: Any, graph: Any, context: Any) -> None:
        """Record the pass's time and the node counts before and after it."""
        seconds = time.perf_counter() - self._start
        self.record.passes.append({"pass": pass_.name, "seconds": seconds,
                                   "nodes_before": self._nodes_before,
                                   "nodes_after": len(graph.graph.nodes)})


class Snapshots:
    """Keeps a runnable copy of the graph after each pass, for ``verify: each``."""

    def __init__(self) -> None:
        self.items: list[tuple[str, torch.fx.GraphModule]] = []

    @hookimpl
    def pipeline_after_pass(self, pass_: Any, graph: Any, context: Any) -> None:
        """Keep a runnable copy of the graph the pass produced."""
        self.items.append((pass_.name, copy_graph(graph)))


class SourceDump:
    """Writes each graph's Python source after every pass under a directory."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)

    @hookimpl
    def pipeline_after_pass(self, pass_: Any, graph: Any, context: Any) -> None:
        """Write the graph's source after this pass to ``<dir>/<graph id>/<NN>-<pass>.py``."""
        safe_id = re.sub(r"[^A-Za-z0-9_.-]", "_", context.graph_id)
        folder = self.directory / safe_id
        folder.mkdir(parents=True, exist_ok=True)
        index = len(list(folder.glob("*.py")))
        (folder / f"{index:02d}-{pass_.name}.py").write_text(
            f"# graph {context.graph_id} after pass '{pass_.name}'\n{graph.code}")


class GraphSources:
    """Keeps each graph's Python source as captured and after every pass, for the compile report
    (only registered when a report is requested: ``PIPELINE_REPORT_DIR`` or ``report=``)."""

    def __init__(self, record: Any):
        self.record = record

    @hookimpl
    def pipeline_before_pass(self, pass_: Any, graph: Any, context: Any) -> None:
        """Keep the source as captured, before the first graph pass."""
        if not self.record.sources:
            self.record.sources.append({"stage": "captured", "code": graph.code})

    @hookimpl
    def pipeline_after_pass(self, pass_: Any, graph: Any, context: Any) -> None:
        """Keep the source after this pass."""
        self.record.sources.append({"stage": pass_.name, "code": graph.code})
