"""Topic logs through the standard :mod:`logging` module, like ``TORCH_LOGS``.

Each topic is a logger named ``pipeline.<topic>``. ``PIPELINE_LOGS=passes,+fusion`` (read when
``pipeline`` is imported) or :func:`set_logs` turns topics on: ``topic`` at INFO, ``+topic`` at
DEBUG (more detail: guard lists, kernel source), ``all`` / ``+all`` for every topic; the records
go to standard error. Without it nothing is configured and the loggers follow the application's
own logging setup (``logging.getLogger("pipeline.fusion").setLevel(logging.INFO)`` works too).

Passes log through :meth:`pipeline.PassContext.note` (which also records the note for the
compile report) or :func:`get_logger`; a plugin may use its own topic names.
"""
from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Iterable

from pipeline.errors import nearest

ROOT = "pipeline"
ENV = "PIPELINE_LOGS"

#: Built-in topics and what each one logs.
TOPICS: dict[str, str] = {
    "passes": "each pass's time and node counts per graph; notes of passes without their own topic",
    "fusion": "fusion decisions: groups formed and every rejected candidate with its reason",
    "codegen": "generated kernels (backend, group) and, at DEBUG, their source",
    "graph_breaks": "every graph break with Dynamo's reason and the user source line",
    "recompiles": "every recompile with the guard that failed",
    "guards": "guards installed for each captured graph (count at INFO, each guard at DEBUG)",
    "cudagraphs": "whether each graph runs under a CUDA graph, and why not",
    "cache": "compile-cache hits and misses",
}


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the record (so redirection works)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


_handler: logging.Handler | None = None
_configured: set[str] = set()


def get_logger(topic: str) -> logging.Logger:
    """The logger of ``topic`` (``pipeline.<topic>``): for passes and plugins that log beyond
    :meth:`pipeline.PassContext.note`."""
    return logging.getLogger(f"{ROOT}.{topic}")


def parse_spec(spec: str | Iterable[str]) -> dict[str, int]:
    """``"passes,+fusion"`` to ``{"passes": INFO, "fusion": DEBUG}``; ``all`` stands for every topic."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    levels: dict[str, int] = {}
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        level = logging.DEBUG if item.startswith("+") else logging.INFO
        name = item.lstrip("+-").strip()
        names = list(TOPICS) if name == "all" else [name]
        for topic in names:
            if topic not in TOPICS:
                guess = nearest(topic, TOPICS)
                if guess is not None:
                    warnings.warn(f"{ENV}: unknown log topic '{topic}'; did you mean '{guess}'? "
                                  f"(topics: {', '.join(TOPICS)})", stacklevel=3)
            levels[topic] = min(level, levels.get(topic, logging.INFO))
    return levels


def set_logs(spec: str | Iterable[str] | None) -> dict[str, int]:
    """Turn topic logs on (``"passes,+fusion"``, a list of such items) or, with None or ``""``,
    back off. Enabled topics print to standard error and do not propagate to the root logger
    (as ``TORCH_LOGS`` does), so records are not printed twice. Returns the levels applied."""
    global _handler
    parent = logging.getLogger(ROOT)
    for topic in _configured:
        get_logger(topic).setLevel(logging.NOTSET)
    _configured.clear()
    if _handler is not None:
        parent.removeHandler(_handler)
        parent.propagate = True
        _handler = None
    levels = parse_spec(spec) if spec else {}
    if not levels:
        return {}
    _handler = _StderrHandler()
    _handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    parent.addHandler(_handler)
    parent.propagate = False
    for topic, level in levels.items():
        get_logger(topic).setLevel(level)
        _configured.add(topic)
    return levels


def configure_from_env() -> dict[str, int]:
    """Apply ``PIPELINE_LOGS`` if it is set (called when ``pipeline`` is imported)."""
    spec = os.environ.get(ENV, "")
    return set_logs(spec) if spec.strip() else {}


__all__ = ["TOPICS", "get_logger", "set_logs", "parse_spec", "configure_from_env"]
