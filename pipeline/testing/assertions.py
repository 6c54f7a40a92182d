"""Assertions that a pass or a plan preserves semantics against eager PyTorch."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.fx

from pipeline import compat
from pipeline.api import compile_with_plan
from pipeline.errors import PipelineError
from pipeline.graph_pass import Pass, PassContext
from pipeline.instruments import copy_graph
from pipeline.manager import BoundPass, PassManager
from pipeline.plan.schema import Plan
from pipeline.registry import PluginInfo, Registry, get_registry
from pipeline.verification import run_and_compare
from pipeline.testing.strategies import GraphCase

START_TAGS = frozenset({"captured"})


class SemanticsError(AssertionError):
    """A pass or plan changed what a graph computes; the message shows the graph and the diff."""


def _bind(subject: Any, registry: Registry) -> BoundPass:
    if isinstance(subject, Pass):
        instance = subject
    elif isinstance(subject, type) and issubclass(subject, Pass):
        instance = subject()
    elif isinstance(subject, str) and subject in registry.passes:
        instance = registry.passes[subject].cls()
    else:
        raise TypeError(f"expected a Pass class, instance or registered pass name, got {subject!r}")
    entry = registry.passes.get(instance.name)
    plugin = entry.plugin if entry is not None and entry.cls is type(instance) else PluginInfo(
        module=type(instance).__module__)
    return BoundPass(instance, plugin)


def prelude_for(pass_: Pass | type | str, registry: Registry | None = None) -> list[BoundPass]:
    """Registered passes (default options) that establish the tags ``pass_`` (a pass class,
    instance or registered name) requires, in order, starting from a freshly captured graph.
    Raises when no registered pass provides a tag."""
    registry = registry or get_registry()
    cls = type(_bind(pass_, registry).instance) if isinstance(pass_, str) else (
        pass_ if isinstance(pass_, type) else type(pass_))
    chain: list[BoundPass] = []
    tags = set(START_TAGS)

    def establish(tag: str, depth: int) -> None:
        if tag in tags:
            return
        if depth > 8:
            raise PipelineError(f"cannot order passes to provide '{tag}' (cycle in requires)")
        for name, entry in registry.passes.items():
            if entry.cls.stage == "graph" and tag in entry.cls.provided(entry.cls.Options()):
                for needed in sorted(entry.cls.requires):
                    establish(needed, depth + 1)
                bound = BoundPass(entry.cls(), entry.plugin)
                chain.append(bound)
                tags.update(entry.cls.provided(bound.instance.options))
                return
        raise PipelineError(f"no registered pass provides '{tag}', which {cls.name} requires")

    for tag in sorted(cls.requires):
        establish(tag, 0)
    return chain


def run_passes(passes: Sequence[Any], gm: torch.fx.GraphModule, example_inputs: list, *,
               registry: Registry | None = None, check_invariants: bool = True,
               tags: set | None = None) -> torch.fx.GraphModule:
    """Run passes (classes, instances, names or bound passes) over a copy of ``gm`` the way the
    engine does, with fake example inputs made from ``example_inputs``.

    The graph it returns remembers the invariant tags the passes left it with (:func:`tags_of`),
    so running more passes on it continues from them::

        before = run_passes(prelude_for(MyPass), case.gm, inputs)
        after = run_passes([MyPass()], before, inputs)

    ``tags`` overrides where the run starts from: by default the tags ``gm`` remembers, or a freshly
    captured graph's for a graph these helpers did not produce. A set given is updated in place."""
    registry = registry or get_registry()
    bound = [p if isinstance(p, BoundPass) else _bind(p, registry) for p in passes]
    context = PassContext(graph_id="test", target=_target(example_inputs),
                          example_inputs=compat.fake_copies(list(example_inputs)),
                          tags=tags if tags is not None else set(tags_of(gm)))
    manager = PassManager(bound, registry=registry, plugin_manager=registry.plugin_manager(),
                          check_invariants=check_invariants)
    result = manager.run(copy_graph(gm), context)
    result.meta[_TAGS_KEY] = frozenset(context.tags)
    return result


_TAGS_KEY = "pipeline_testing_tags"


def tags_of(gm: torch.fx.GraphModule) -> frozenset[str]:
    """The invariant tags a graph returned by :func:`run_passes` has (a freshly captured graph's,
    ``captured``, for any other graph)."""
    return frozenset(getattr(gm, "meta", {}).get(_TAGS_KEY, START_TAGS))


def _target(inputs: list) -> str:
    return "cuda" if any(isinstance(v, torch.Tensor) and v.is_cuda for v in inputs) else "cpu"


def _is_plan(subject: Any, registry: Registry) -> bool:
    if isinstance(subject, (Plan, dict, Path)):
        return True
    if isinstance(subject, str):
        return subject in registry.plans or subject.endswith((".yaml", ".yml"))
    return False


def assert_preserves_semantics(subject: Any, case: GraphCase | torch.fx.GraphModule | Callable,
                               inputs: Sequence[Any] | None = None, *, seeds: Sequence[int] = (0, 1),
                               rtol: float | None = None, atol: float | None = None) -> None:
    """Assert that ``subject`` computes what eager PyTorch computes on ``case``.

    ``subject`` is a pass (class, instance or registered name: its required passes run first and
    the pass is compared with their output) or a plan (a Plan, plan name, path or dict: the case is
    compiled with ``compile_with_plan``). ``case`` is a :class:`GraphCase` (fresh random inputs for
    every seed), or a graph module / function with explicit ``inputs``. Outputs and any in-place
    updates of inputs are compared with dtype-aware tolerances.
    """
    registry = get_registry()
    input_sets = _input_sets(case, inputs, seeds)
    fn = case.gm if isinstance(case, GraphCase) else case
    if _is_plan(subject, registry):
        _check_plan(subject, fn, input_sets, case)
        return
    if not isinstance(fn, torch.fx.GraphModule):
        fn = torch.fx.symbolic_trace(fn)
    bound = _bind(subject, registry)
    prelude = prelude_for(bound.instance, registry)
    before = run_passes(prelude, fn, input_sets[0], registry=registry, tags=set(START_TAGS)) if prelude else fn
    after = run_passes([bound], before, input_sets[0], registry=registry, tags=set(tags_of(before)))
    for args in input_sets:
        for label, reference, candidate in (("prelude " + " -> ".join(b.name for b in prelude), fn, before),
                                            (f"pass '{bound.name}'", before, after)):
            if candidate is reference:
                continue
            problem = run_and_compare(reference, candidate, list(args))
            if problem:
                raise SemanticsError(f"{label} changed the result: {problem}\n"
                                     f"inputs: {_describe(args)}\n--- before ---{reference.code}\n"
                                     f"--- after ---{candidate.code}")


def _check_plan(plan: Any, fn: Callable, input_sets: list, case: Any) -> None:
    compiled = compile_with_plan(fn, plan)
    for args in input_sets:
        problem = run_and_compare(fn, compiled, list(args))
        if problem:
            raise SemanticsError(f"plan {plan!r} changed the result: {problem}\ninputs: {_describe(args)}\n"
                                 f"{case!r}")


def _input_sets(case: Any, inputs: Sequence[Any] | None, seeds: Sequence[int]) -> list:
    if inputs is not None:
        return [list(inputs)]
    if isinstance(case, GraphCase):
        return [case.make_inputs(seed) for seed in seeds]
    raise TypeError("give inputs=... when the case is not a GraphCase")


def _describe(args: Sequence[Any]) -> str:
    return ", ".join(f"{list(a.shape)} {a.dtype} stride {a.stride()}" if isinstance(a, torch.Tensor)
                     else repr(a) for a in args)
