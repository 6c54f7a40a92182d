"""Instrumentation implemented as ordinary hook implementations, registered per compile:
pass timing, graph snapshots for ``verify: each``, and source dumps (``PIPELINE_DUMP_DIR``)."""
from __future__ import annotations

import copy
import os
import re
import time
from pathlib import Path
from typing import Any

import torch.fx

from .hooks import hookimpl


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
        self._nodes_before = len(graph.graph.nodes)
        self._start = time.perf_counter()

    @hookimpl
    def pipeline_after_pass(self, pass_: Any, graph: Any, context: Any) -> None:
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
        self.items.append((pass_.name, copy_graph(graph)))


class SourceDump:
    """Writes each graph's Python source after every pass under a directory."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)

    @hookimpl
    def pipeline_after_pass(self, pass_: Any, graph: Any, context: Any) -> None:
        safe_id = re.sub(r"[^A-Za-z0-9_.-]", "_", context.graph_id)
        folder = self.directory / safe_id
        folder.mkdir(parents=True, exist_ok=True)
        index = len(list(folder.glob("*.py")))
        (folder / f"{index:02d}-{pass_.name}.py").write_text(
            f"# graph {context.graph_id} after pass '{pass_.name}'\n{graph.code}")
