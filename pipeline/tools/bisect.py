"""``pipeline bisect``: find the pass that makes a compiled model differ from eager.

The model is compiled with growing prefixes of the plan (capture alone, then capture + the first
graph pass, ...), each run on the same inputs and compared with eager PyTorch; the first prefix
whose output differs (or that raises) names the pass. Every prefix of a valid plan is itself
valid, and every intermediate graph runs, so each prefix is a real compile. When the named pass
supports fuel (``uses_fuel = True``: it asks :meth:`PassContext.use_fuel` before each rewrite),
bisect then halves the number of rewrites it may make to find the first rewrite that breaks it.

Each run starts from a deep copy of the model and copies of the inputs, and resets Dynamo's
caches (a debugging tool may; a compiled model in the same process recompiles afterwards).
"""
from __future__ import annotations

import copy
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

import attrs
import torch

from pipeline import compat
from pipeline.api import compile_under
from pipeline.compilation import Compilation
from pipeline.errors import PipelineError
from pipeline.graph_pass import Fuel
from pipeline.numerics import compare
from pipeline.plan.schema import Expectations, load_plan
from pipeline.registry import get_registry
from pipeline.verification import clone_inputs

DEFAULT_FACTORY = "model_and_inputs"


@attrs.frozen
class Step:
    """One compile of a plan prefix: how many passes it ran, the last one, and the outcome."""

    passes: int
    last_pass: str
    plugin: str
    outcome: str          # "match", "mismatch" or "error"
    detail: str = ""

    @property
    def position(self) -> int:
        """The last pass's index in the plan's pass list (0 is capture), as the verdict counts it."""
        return self.passes - 1


@attrs.frozen
class FuelResult:
    """The first rewrite of a fuel-supporting pass after which the output differs."""

    rewrite: int
    total: int
    description: str


@attrs.frozen
class BisectResult:
    """The verdict: the first pass whose prefix differs from eager (None when the whole plan
    matches) and its ``position`` (index in the plan's pass list, 0 being capture), the prefixes
    tried, and the first bad rewrite when the pass supports fuel."""

    plan: str
    culprit: str | None
    plugin: str | None
    position: int | None
    steps: tuple[Step, ...]
    fuel: FuelResult | None = None

    def __str__(self) -> str:
        # Passes are numbered as everywhere else (plan errors' passes[i], repro.json's position):
        # by their index in the plan's pass list, 0 being capture. Row i ran passes 0..i.
        lines = [f"{'pass':>4}  {'name':<20} outcome of the plan up to it"]
        for step in self.steps:
            lines.append(f"{step.position:>4}  {step.last_pass:<20} {step.outcome}"
                         + (f": {step.detail[:160]}" if step.detail else ""))
        if self.culprit is None:
            lines.append(f"plan '{self.plan}': the compiled model matches eager; nothing to bisect")
        else:
            lines.append(f"first bad pass: '{self.culprit}' (pass {self.position} of plan '{self.plan}', "
                         f"counting capture as 0; from plugin {self.plugin})")
            if self.fuel is not None:
                lines.append(f"first bad rewrite: {self.fuel.rewrite} of {self.fuel.total}: {self.fuel.description}")
        return "\n".join(lines)


def bisect(model: Any, *inputs: Any, plan: Any = "default", rtol: float | None = None,
           atol: float | None = None, use_fuel: bool = True, **overrides: Any) -> BisectResult:
    """Name the first pass of ``plan`` (with plan ``overrides``) after which ``model(*inputs)``
    differs from eager, and, if that pass supports fuel, its first bad rewrite."""
    resolved = load_plan(plan, overrides or None)
    resolved = attrs.evolve(resolved, verify="off", on_error="raise", expect=Expectations())
    expected = _call(copy.deepcopy(model), inputs)
    registry = get_registry()

    def run(count: int, fuel: Fuel | None = None) -> tuple[str, str]:
        prefix = attrs.evolve(resolved, passes=resolved.passes[:count])
        try:
            actual = _call(compile_under(copy.deepcopy(model), Compilation(prefix, registry, fuel=fuel)), inputs)
        except Exception as exc:  # noqa: BLE001 - a prefix that raises is as bad as one that differs
            return "error", f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        finally:
            compat.reset_dynamo()
        problem = compare(expected, actual, rtol=rtol, atol=atol)
        return ("mismatch", problem) if problem else ("match", "")

    def step(count: int) -> Step:
        spec = resolved.passes[count - 1]
        outcome, detail = run(count)
        return Step(count, spec.name, str(registry.passes[spec.name].plugin), outcome, detail)

    full = step(len(resolved.passes))
    if full.outcome == "match":
        return BisectResult(resolved.name, None, None, None, (full,))
    steps = []
    for count in range(1, len(resolved.passes)):
        steps.append(step(count))
        if steps[-1].outcome != "match":
            break
    else:
        steps.append(full)
    bad = steps[-1]
    position = bad.position
    fuel = None
    cls = registry.passes[bad.last_pass].cls
    if use_fuel and cls.uses_fuel:
        fuel = _bisect_fuel(lambda f: run(bad.passes, f), bad.last_pass)
    return BisectResult(resolved.name, bad.last_pass, bad.plugin, position, tuple(steps), fuel)


def _bisect_fuel(run: Callable[[Fuel], tuple[str, str]], name: str) -> FuelResult | None:
    """Smallest number of rewrites of ``name`` after which the output is bad."""
    counting = Fuel({name: None})
    if run(counting)[0] == "match":
        return None
    total = counting.used.get(name, 0)
    good, bad = 0, total
    if total == 0 or run(Fuel({name: 0}))[0] != "match":
        return None
    while bad - good > 1:
        middle = (good + bad) // 2
        if run(Fuel({name: middle}))[0] == "match":
            good = middle
        else:
            bad = middle
    spent = counting.spent.get(name, [])
    return FuelResult(rewrite=bad, total=total, description=spent[bad - 1] if bad <= len(spent) else "")


def _call(model: Any, inputs: tuple) -> Any:
    out = model(*clone_inputs(inputs))
    return torch.utils._pytree.tree_map(lambda v: v.detach() if isinstance(v, torch.Tensor) else v, out)


def load_target(target: str) -> tuple[Any, tuple]:
    """``(model, inputs)`` from ``path/to/file.py[:factory]`` or ``package.module[:factory]``:
    the factory (default ``model_and_inputs``) takes no arguments and returns ``(model, inputs)``,
    inputs being a tuple of positional arguments (or one tensor)."""
    ref, _, factory_name = target.partition(":")
    factory_name = factory_name or DEFAULT_FACTORY
    if ref.endswith(".py"):
        path = Path(ref)
        if not path.is_file():
            raise PipelineError(f"bisect target {ref} does not exist")
        spec = importlib.util.spec_from_file_location(f"_pipeline_bisect_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(ref)
        except ImportError as exc:
            raise PipelineError(f"bisect target: cannot import module '{ref}': {exc}") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise PipelineError(f"bisect target {ref} has no function '{factory_name}' returning (model, inputs)")
    made = factory()
    if not (isinstance(made, tuple) and len(made) == 2):
        raise PipelineError(f"{ref}:{factory_name}() must return (model, inputs), got {type(made).__name__}")
    model, inputs = made
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    return model, inputs


__all__ = ["bisect", "BisectResult", "Step", "FuelResult", "load_target", "DEFAULT_FACTORY"]
