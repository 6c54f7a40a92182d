"""The exceptions users see. Each one names where the problem is (file, line, key, pass, plugin)
and what to do instead, so a user never has to read a traceback to fix their input."""
from __future__ import annotations

import difflib
from typing import Iterable


def nearest(name: str, choices: Iterable[str]) -> str | None:
    """The closest valid spelling of ``name`` among ``choices``, or None when nothing is close."""
    matches = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """A ``"; did you mean 'x'?"`` suffix, or a list of valid names when nothing is close."""
    choices = sorted({str(c) for c in choices})
    guess = nearest(name, choices)
    if guess is not None:
        return f"; did you mean '{guess}'?"
    if not choices:
        return ""
    shown = ", ".join(choices[:12]) + (", ..." if len(choices) > 12 else "")
    return f" (valid: {shown})"


class PipelineError(Exception):
    """Base class of every error this project raises on purpose."""


class PlanError(PipelineError):
    """A plan that cannot be loaded: the message names the file, the line and the key path."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 key: str | None = None):
        self.file = file
        self.line = line
        self.key = key
        self.reason = message
        super().__init__(self._format())

    def _format(self) -> str:
        where = self.file or "<plan>"
        if self.line is not None:
            where += f":{self.line}"
        head = f"{where}: "
        if self.key:
            head += f"{self.key}: "
        return head + self.reason


class RegistrationError(PipelineError):
    """A plugin registered something invalid; the message names its distribution and module."""


class PassFailure(PipelineError):
    """A pass raised while compiling a graph; names the pass, its plugin and the graph."""

    def __init__(self, message: str, *, pass_name: str, plugin: str, graph_id: str,
                 reproducer: str | None = None):
        self.pass_name = pass_name
        self.plugin = plugin
        self.graph_id = graph_id
        self.reproducer = reproducer
        super().__init__(message)


class VerificationError(PipelineError):
    """A pass changed what a graph computes (found by ``verify: final|each``)."""

    def __init__(self, message: str, *, pass_name: str | None, plugin: str | None,
                 graph_id: str, reproducer: str | None = None):
        self.pass_name = pass_name
        self.plugin = plugin
        self.graph_id = graph_id
        self.reproducer = reproducer
        super().__init__(message)


class GraphBreakError(PipelineError):
    """``fullgraph: true`` was requested but capture had to break the graph."""


class RecompileError(PipelineError):
    """A recompile happened where the plan forbids it (stance ``fail_on_recompile``, or the limit)."""


class ShapeError(PipelineError):
    """A call's input does not fit the plan's declared shape buckets (a size above the largest
    bucket, dimensions of one axis with different sizes); names the input, dimension and buckets."""


class ExpectationError(PipelineError):
    """A plan's ``expect:`` entry was missed; names the expectation and the measured value."""
