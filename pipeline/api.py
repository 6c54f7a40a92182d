"""``compile_with_plan``: the front door."""
from __future__ import annotations

import copy
import functools
import os
from typing import Any

import torch

from .compilation import Compilation
from .plan import Plan, load_plan
from .registry import get_registry

_ATTR = "__pipeline_compilation__"


def compile_with_plan(model: Any, plan: Any = "default", *, report: bool | str | os.PathLike | None = None,
                      **overrides: Any) -> Any:
    """Compile ``model`` (an ``nn.Module`` or a function) with ``plan``.

    ``plan`` is a built-in or plugin plan name (``"debug"``), a path to a YAML file, a dict in the
    same format, or a :class:`Plan`. Keyword ``overrides`` use the plan's top-level keys, e.g.
    ``verify="each"`` or ``options={"capture": {"fullgraph": True}}``. The plan is validated
    completely before anything compiles; graphs compile lazily on the first call.

    ``report`` asks for the full compile report (each graph's source after every pass): ``True``
    keeps it in memory for :func:`pipeline.compile_report`; a folder also writes ``report.json``
    and ``report.html`` there after every call that compiled something. ``PIPELINE_REPORT_DIR``
    does the same for every compile without changing code.

    For a module the result is a shallow copy of it whose calls run compiled graphs: it is an
    instance of the same class, has the same state-dict keys (no ``_orig_mod.`` prefix), and shares
    parameters, buffers and submodules with ``model`` (updates to either are seen by both).
    """
    resolved = load_plan(plan, overrides or None)
    return compile_under(model, Compilation(resolved, get_registry(), report=report))


def compile_under(model: Any, compilation: Compilation) -> Any:
    """Wrap ``model`` so its calls compile and run under ``compilation`` (what
    :func:`compile_with_plan` does once it has loaded the plan; ``bisect`` uses it with fuel)."""
    runner = compilation.capture.instance.capture(model, compilation.compile_graph,
                                                  compilation.capture_context())
    after_call = compilation.after_call
    after_failure = compilation.after_failure

    if isinstance(model, torch.nn.Module):
        def call_compiled(*args: Any, **kwargs: Any) -> Any:
            try:
                out = runner(*args, **kwargs)
            except BaseException:
                after_failure()
                raise
            after_call()
            return out

        compiled = copy.copy(model)
        compiled._compiled_call_impl = call_compiled
        object.__setattr__(compiled, _ATTR, compilation)
        return compiled

    if not callable(model):
        raise TypeError(f"compile_with_plan needs an nn.Module or a callable, got {type(model).__name__}")

    @functools.wraps(model)
    def compiled_fn(*args: Any, **kwargs: Any) -> Any:
        try:
            out = runner(*args, **kwargs)
        except BaseException:
            after_failure()
            raise
        after_call()
        return out

    setattr(compiled_fn, _ATTR, compilation)
    return compiled_fn


def compilation_of(compiled: Any) -> Compilation:
    """The :class:`Compilation` record behind a result of :func:`compile_with_plan`: its plan,
    graphs (with per-pass times and notes), graph breaks, recompiles and fallbacks."""
    found = getattr(compiled, _ATTR, None)
    if found is None:
        raise TypeError(f"{type(compiled).__name__} was not made by compile_with_plan")
    return found


def plan_of(compiled: Any) -> Plan:
    """The resolved plan a compiled model runs under."""
    return compilation_of(compiled).plan


__all__ = ["compile_with_plan", "compile_under", "compilation_of", "plan_of"]
