"""``compile_with_plan``: the front door."""
from __future__ import annotations

import functools
import os
from typing import Any

import torch

from pipeline.compilation import COMPILATION_ATTR as _ATTR, Compilation, compilation_of
from pipeline.errors import PlanError, did_you_mean
from pipeline.plan.schema import Plan, load_plan
from pipeline.registry import get_registry
from pipeline.serving import planned_variants, serve


def compile_with_plan(model: Any, plan: Any = "default", *, report: bool | str | os.PathLike | None = None,
                      mode: str | None = None, **overrides: Any) -> Any:
    """Compile ``model`` (an ``nn.Module`` or a function) with ``plan``.

    ``plan`` is a built-in or plugin plan name (``"debug"``), a path to a YAML file, a dict in the
    same format, or a :class:`Plan`. Keyword ``overrides`` use the plan's top-level keys, e.g.
    ``verify="each"`` or ``options={"capture": {"fullgraph": True}}``. The plan is validated
    completely before anything compiles; graphs compile lazily on the first call.

    ``report`` asks for the full compile report (each graph's source after every pass): ``True``
    keeps it in memory for :func:`pipeline.compile_report`; a folder also writes ``report.json``
    and ``report.html`` there after every call that compiled something. ``PIPELINE_REPORT_DIR``
    does the same for every compile without changing code.

    ``mode`` takes torch.compile's mode names as aliases of built-in plans (:data:`MODES`):
    ``compile_with_plan(model, mode="reduce-overhead")`` is ``compile_with_plan(model,
    "reduce-overhead")``; give either ``mode`` or ``plan``, not both.

    For a module the result is a shallow copy of it whose calls run compiled graphs: it is an
    instance of the same class, has the same state-dict keys (no ``_orig_mod.`` prefix), and shares
    parameters, buffers and submodules with ``model`` (updates to either are seen by both).
    """
    if mode is not None:
        plan = plan_for_mode(mode, plan)
    resolved = load_plan(plan, overrides or None)
    return compile_under(model, Compilation(resolved, get_registry(), report=report))


MODES = {"default": "default", "reduce-overhead": "reduce-overhead", "max-autotune": "max-autotune",
         "max-autotune-no-cudagraphs": "max-autotune-no-cudagraphs"}
"""torch.compile's ``mode=`` names and the built-in plans they stand for."""


def plan_for_mode(mode: str, plan: Any = "default") -> str:
    """The built-in plan a torch.compile ``mode`` name stands for; ``plan`` must be left at its
    default (a plan and a mode together would be ambiguous)."""
    if mode not in MODES:
        raise PlanError(f"unknown mode '{mode}'{did_you_mean(str(mode), MODES)}; modes are torch.compile's "
                        f"names for built-in plans ({', '.join(MODES)})")
    if not (isinstance(plan, str) and plan == "default"):
        raise PlanError(f"give a plan or a mode, not both (mode '{mode}' is the plan '{MODES[mode]}')")
    return MODES[mode]


def compile_under(model: Any, compilation: Compilation) -> Any:
    """Wrap ``model`` so its calls compile and run under ``compilation`` (what
    :func:`compile_with_plan` does once it has loaded the plan; ``bisect`` uses it with fuel)."""
    context = compilation.capture_context()
    context.planned_variants = planned_variants(compilation.plan.shapes)
    runner = compilation.capture.instance.capture(model, compilation.compile_graph, context)
    runner = serve(runner, model, compilation)   # the plan's shape buckets, warm-up and stance
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

        compiled = _shallow_copy(model)
        compiled._compiled_call_impl = call_compiled
        object.__setattr__(compiled, _ATTR, compilation)
        _bind_instance_methods(compiled, model, compilation.plan)
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


def _shallow_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A new instance of the module's class sharing its ``__dict__``'s values (parameters, buffers,
    submodules, hooks). Not ``copy.copy``: that goes through the class's pickling protocol, and
    DistributedDataParallel's refuses a non-default process group and, with the default one,
    builds a second gradient reducer for the copy."""
    compiled = object.__new__(type(module))
    compiled.__dict__.update(module.__dict__)
    return compiled


def _bind_instance_methods(compiled: torch.nn.Module, model: torch.nn.Module, plan: Plan) -> None:
    """What the compiled copy does differently from its class, set on the instance alone:

    - ``train(mode)`` (and so ``eval()``) sets the mode of ``model`` too, whose ``forward`` the
      compiled graphs trace and whose own ``training`` flag it reads (submodules are shared
      anyway), as torch.compile's wrapper does for its original module;
    - ``copy.copy``, ``copy.deepcopy``, ``pickle`` and ``torch.save`` copy ``model`` and the
      resolved plan, and the copy is compiled again (lazily, on its first call): a checkpoint of
      the whole compiled model, or an EMA copy of it, is a working compiled model."""
    def train(mode: bool = True) -> torch.nn.Module:
        type(model).train(model, mode)
        type(compiled).train(compiled, mode)
        return compiled

    def reduce_ex(protocol: int) -> tuple:
        return (_compiled_again, (model, plan.to_data()))

    compiled.__dict__["train"] = train
    compiled.__dict__["__reduce_ex__"] = reduce_ex


def _compiled_again(model: torch.nn.Module, plan: dict) -> torch.nn.Module:
    """A copied compiled module: ``model`` compiled with the plan the original was compiled with."""
    return compile_with_plan(model, plan)


def plan_of(compiled: Any) -> Plan:
    """The resolved plan a compiled model runs under."""
    return compilation_of(compiled).plan


__all__ = ["compile_with_plan", "compile_under", "compilation_of", "plan_of", "plan_for_mode", "MODES"]
