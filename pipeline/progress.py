"""Progress lines for long compiles: once a compile has worked for more than a few seconds, one
line per graph pass (graph, pass number, pass, time so far) on standard error, so a user waiting on
a large model sees where it is rather than a silent prompt. Short compiles print nothing.

``PIPELINE_PROGRESS``: ``auto`` (default: only when standard error is a terminal), ``on``
(always, e.g. in CI logs) or ``off``. ``PIPELINE_PROGRESS_AFTER``: seconds of compile work
before lines appear (default 5). Like every environment variable of the project these change
what is printed, never what is compiled. Autotuning prints its own progress (codegen)."""
from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

from pipeline.hooks import hookimpl

ENV = "PIPELINE_PROGRESS"
ENV_AFTER = "PIPELINE_PROGRESS_AFTER"
DEFAULT_AFTER = 5.0


def progress_enabled(stream: TextIO | None = None) -> bool:
    """Whether progress lines are wanted: ``PIPELINE_PROGRESS`` on, or auto and a terminal."""
    mode = os.environ.get(ENV, "auto").strip().lower()
    if mode in ("0", "off", "false", "no"):
        return False
    if mode in ("1", "on", "true", "yes"):
        return True
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def progress_after() -> float:
    """Seconds of compile work before progress lines appear."""
    try:
        return max(float(os.environ.get(ENV_AFTER, DEFAULT_AFTER)), 0.0)
    except ValueError:
        return DEFAULT_AFTER


class Progress:
    """The progress display of one compilation (all its graphs); :meth:`for_graph` gives the hook
    implementation registered for one graph's passes."""

    def __init__(self, stream: TextIO | None = None, *, after: float | None = None,
                 enabled: bool | None = None):
        self.stream = stream
        self.after = progress_after() if after is None else after
        self.enabled = progress_enabled(stream) if enabled is None else enabled
        self.done = 0.0                      # compile seconds of the graphs finished before this one
        self.started: float | None = None    # when the current graph started compiling
        self.lines = 0

    def elapsed(self) -> float:
        """Seconds of compile work so far (earlier graphs plus the current one)."""
        return self.done + (0.0 if self.started is None else time.perf_counter() - self.started)

    def for_graph(self, graph_id: str, total: int, done_seconds: float) -> "GraphProgress":
        """The hook implementation reporting the passes of graph ``graph_id`` (``total`` passes),
        after ``done_seconds`` of compile work on earlier graphs."""
        self.done = done_seconds
        self.started = time.perf_counter()
        return GraphProgress(self, graph_id, total)

    def write(self, text: str) -> None:
        """Print one progress line (when enabled and past the threshold)."""
        if not self.enabled or self.elapsed() < self.after:
            return
        stream = self.stream if self.stream is not None else sys.stderr
        stream.write(f"pipeline: {text}\n")
        stream.flush()
        self.lines += 1


class GraphProgress:
    """Reports each pass of one graph as it starts."""

    def __init__(self, progress: Progress, graph_id: str, total: int):
        self.progress = progress
        self.graph_id = graph_id
        self.total = total
        self.index = 0

    @hookimpl
    def pipeline_before_pass(self, pass_: Any, graph: Any, context: Any) -> None:
        """One line: graph, pass number and name, compile time so far."""
        self.index += 1
        self.progress.write(f"{self.graph_id} [{self.index}/{self.total}] {pass_.name} "
                            f"({len(graph.graph.nodes)} nodes, {self.progress.elapsed():.1f} s of compile so far)")


class WarmupProgress:
    """One line per warmed-up bucket combination (buckets done, the combination, seconds so far,
    an estimate of the time left from the mean so far), under the same switches as compile
    progress: ``PIPELINE_PROGRESS`` and, for the first line, ``PIPELINE_PROGRESS_AFTER``."""

    def __init__(self, total: int, stream: TextIO | None = None, *, enabled: bool | None = None,
                 after: float | None = None):
        self.total = total
        self.stream = stream
        self.enabled = progress_enabled(stream) if enabled is None else enabled
        self.after = progress_after() if after is None else after
        self.start = time.perf_counter()
        self.lines = 0

    def line(self, done: int, combination: dict) -> str:
        """The line after ``done`` combinations, the last being ``combination``."""
        elapsed = time.perf_counter() - self.start
        left = elapsed / done * (self.total - done) if done else 0.0
        sizes = ", ".join(f"{axis} {size}" for axis, size in combination.items())
        return (f"warm-up {done}/{self.total} buckets ({sizes}), {elapsed:.1f} s so far"
                + (f", about {left:.0f} s left" if done < self.total else ""))

    def bucket_done(self, done: int, combination: dict) -> None:
        """Report that ``done`` combinations are compiled (printed once past the threshold)."""
        if not self.enabled or (not self.lines and time.perf_counter() - self.start < self.after):
            return
        stream = self.stream if self.stream is not None else sys.stderr
        stream.write(f"pipeline: {self.line(done, combination)}\n")
        stream.flush()
        self.lines += 1


__all__ = ["Progress", "GraphProgress", "WarmupProgress", "progress_enabled", "progress_after"]
