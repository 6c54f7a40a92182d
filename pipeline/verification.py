"""``verify: final|each``: on a compiled graph's first call, run the graph as captured and the
graph after each pass on copies of the real inputs, and compare outputs and input mutations.
A mismatch names the first pass that changed the result and writes a reproducer
(:mod:`pipeline.tools.repro`)."""
from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
import torch.fx

from pipeline import compat
from pipeline.errors import VerificationError
from pipeline.numerics import compare
from pipeline.reproducer import Failure, write_reproducer


def clone_inputs(args: tuple | list) -> list:
    """Copies of the tensor arguments (same strides), so a mutating graph cannot touch the originals."""
    out = []
    for value in args:
        if isinstance(value, torch.Tensor):
            copy = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)
            copy.copy_(value.detach())
            out.append(copy)
        else:
            out.append(value)
    return out


def random_ops(gm: torch.fx.GraphModule, args: list | None = None) -> list[str]:
    """Names of random operators a graph runs (their outputs cannot be compared run to run).

    With ``args``, the graph is traced to ATen on fake copies of them first, so that a call that
    is random only in some modes counts only when it is random here: ``dropout`` in eval mode (or
    with ``p=0``) runs no random operator."""
    def found(graph: torch.fx.GraphModule) -> set[str]:
        return {compat.op_name(n.target) for n in graph.graph.nodes
                if n.op == "call_function" and compat.is_nondeterministic(n.target)}

    captured = found(gm)
    if args is None:
        return sorted(captured)
    try:
        traced = found(compat.retrace(gm, compat.fake_copies(list(args))))
    except Exception:  # noqa: BLE001 - a graph that cannot be traced here is judged as captured
        return sorted(captured)
    return sorted(traced | captured) if traced else []


def run_and_compare(reference: Callable, candidate: Callable, args: list) -> str | None:
    """None when ``candidate`` matches ``reference`` on ``args`` (outputs and mutated inputs)."""
    with torch.no_grad():
        ref_args = clone_inputs(args)
        expected = reference(*ref_args)
        cand_args = clone_inputs(args)
        actual = candidate(*cand_args)
    problem = compare(expected, actual, what="output")
    if problem:
        return problem
    for index, (e, a) in enumerate(zip(ref_args, cand_args)):
        if isinstance(e, torch.Tensor):
            problem = compare(e, a, what=f"input {index} after the call (in-place update)")
            if problem:
                return problem
    return None


class FirstCallVerifier:
    """Callable standing in for a compiled graph: verifies on the first call, then runs directly.

    A graph that fails verification is never run again: under ``on_error: raise`` every later
    call raises the same :class:`VerificationError`; under ``on_error: eager`` it runs the graph
    as captured, with the reason in the graph's record. ``on_verified`` runs once the compiled
    graph matched (the compile cache stores only verified graphs).

    ``steps`` are ``(pass name, graph after it, position of the pass in the plan)``; ``tags`` maps
    a position to the invariant tags the graph had before that pass (for the reproducer)."""

    def __init__(self, *, original: torch.fx.GraphModule, steps: list, compiled: Callable,
                 record: Any, plugins: dict, on_error: str, plan: Any, tags: dict, target: str,
                 on_verified: Callable[[], None] | None = None):
        self.original = original
        self.steps = steps
        self.compiled = compiled
        self.record = record
        self.plugins = plugins
        self.on_error = on_error
        self.plan = plan
        self.tags = tags
        self.target = target
        self.on_verified = on_verified
        self.failure: VerificationError | None = None
        self._run: Callable = self._verify

    def __call__(self, *args):
        return self._run(*args)

    def _verify(self, *args):
        randoms = random_ops(self.original, list(args))
        if randoms:
            self.record.verified = f"skipped: the graph uses random operators ({', '.join(randoms)})"
            return self._accept(*args)
        previous = self.original
        for pass_name, graph, position in self.steps:
            problem = run_and_compare(self.original, graph, list(args))
            if problem:
                return self._mismatch(pass_name, position, previous, problem, args)
            previous = graph
        self.record.verified = f"passed ({len(self.steps)} step(s) compared with the captured graph)"
        return self._accept(*args)

    def _accept(self, *args):
        self._run = self.compiled
        if self.on_verified is not None:
            self.on_verified()
        return self.compiled(*args)

    def _raise_again(self, *args):
        failure = self.failure
        raise VerificationError(str(failure), pass_name=failure.pass_name, plugin=failure.plugin,
                                graph_id=failure.graph_id, reproducer=failure.reproducer)

    def _mismatch(self, pass_name: str, position: int, before: torch.fx.GraphModule, problem: str,
                  args: tuple):
        each = self.plan.verify == "each"
        plugin = self.plugins.get(pass_name, "?")
        repro = write_reproducer(graph_id=self.record.graph_id, position=position, plugin=plugin,
                                 received=before, args=list(args), plan=self.plan,
                                 failure=Failure(kind="mismatch", message=problem),
                                 tags=self.tags[position if each else 1],
                                 target=self.target, role=self.record.role,
                                 whole_prefix=not each)
        self.record.reproducer = repro
        if each:
            blame = f"pass '{pass_name}' from plugin {plugin} changed the result"
        else:
            blame = (f"the graph after the last pass ('{pass_name}') differs from the captured graph "
                     f"(verify: final cannot tell which pass did it; rerun with verify: each)")
        message = (f"verification failed on graph {self.record.graph_id}: {blame}: {problem}. "
                   f"Reproducer: {repro}")
        self.record.verified = f"failed at pass '{pass_name}'" if each else "failed (verify: final)"
        if self.on_error == "eager":
            self.record.fallback = message
            warnings.warn(f"pipeline: {message}; running graph {self.record.graph_id} eagerly "
                          f"(plan on_error: eager)", stacklevel=2)
            self._run = self.original
            return self.original(*args)
        # verify: final compares the whole plan at once: no single pass or plugin is to blame.
        self.failure = VerificationError(message, pass_name=pass_name if each else None,
                                         plugin=plugin if each else None,
                                         graph_id=self.record.graph_id, reproducer=repro)
        self._run = self._raise_again
        raise self.failure
