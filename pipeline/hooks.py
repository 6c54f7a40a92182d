"""The plugin surface: pluggy markers for project ``"pipeline"`` and the hook specifications.

A plugin is a module (or object) with functions marked ``@pipeline.hookimpl``. Installed distributions
declare such a module in the entry-point group ``pipeline.plugins``; it is loaded at start unless
``PIPELINE_DISABLE_PLUGIN_AUTOLOAD=1``.
"""
from __future__ import annotations

from typing import Any

import pluggy

PROJECT = "pipeline"
ENTRY_POINT_GROUP = "pipeline.plugins"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class PipelineSpecs:
    """Hook specifications. Every hook is called with keyword arguments only."""

    @hookspec
    def pipeline_register_passes(self) -> list[type]:
        """Return the pass classes this plugin provides (subclasses of :class:`pipeline.Pass`).

        Called once per registry load for each plugin; all results are collected. A pass name that
        two plugins both register is an error naming both plugins.
        """

    @hookspec
    def pipeline_register_plans(self) -> list[str]:
        """Return paths of plan files (``*.yaml``) or folders holding them, so a plugin can ship
        plans that users then name like built-in ones. All results are collected."""

    @hookspec
    def pipeline_register_invariants(self) -> dict[str, Any]:
        """Return ``{tag: check}`` where ``check(graph_module)`` returns None when the graph has the
        invariant ``tag`` (as a pass's ``provides`` promises) or a message saying what breaks it.
        Checks run after every pass that claims the tag, when the plan's ``verify`` is not ``off``."""

    @hookspec
    def pipeline_register_metrics(self) -> list[Any]:
        """Return :class:`pipeline.Metric` objects: measurements of every compiled graph (kernels,
        CUDA graphs, ...) that land in the record and the report and that the plan's ``expect:``
        keys the metric declares are checked against. Names and ``expect`` keys must be unique."""

    @hookspec
    def pipeline_before_pass(self, pass_: Any, graph: Any, context: Any) -> None:
        """Called before every pass runs on a graph. ``pass_`` is the bound pass instance, ``graph``
        the ``fx.GraphModule`` it will receive, ``context`` the :class:`pipeline.PassContext`.
        Timing, dumps and verification snapshots are implemented as implementations of this hook
        and of :meth:`pipeline_after_pass`. Return values are ignored."""

    @hookspec
    def pipeline_after_pass(self, pass_: Any, graph: Any, context: Any) -> None:
        """Called after every pass returned, with the graph it produced. Return values are ignored;
        raising aborts the compile of this graph (and is reported naming the raising plugin)."""
