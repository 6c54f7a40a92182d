"""``verify: final|each``: on a compiled graph's first call, run the graph as captured and the
graph after each pass on copies of the real inputs, and compare outputs and input mutations.
A mismatch names the first pass that changed the result and writes a reproducer
(:mod:`pipeline.repro`)."""
from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
import torch.fx

from . import compat
from .errors import VerificationError
from .numerics import compare


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


def random_ops(gm: torch.fx.GraphModule) -> list[str]:
    """Names of random operators in a graph (their outputs cannot be compared run to run)."""
    return sorted({compat.op_name(n.target) for n in gm.graph.nodes
                   if n.op == "call_function" and compat.is_nondeterministic(n.target)})


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

    ``steps`` are ``(pass name, graph after it, position of the pass in the plan)``; ``tags`` maps
    a position to the invariant tags the graph had before that pass (for the reproducer)."""

    def __init__(self, *, original: torch.fx.GraphModule, steps: list, compiled: Callable,
                 record: Any, plugins: dict, on_error: str, plan: Any, tags: dict, target: str):
        self.original = original
        self.steps = steps
        self.compiled = compiled
        self.record = record
        self.plugins = plugins
        self.on_error = on_error
        self.plan = plan
        self.tags = tags
        self.target = target
        self._run: Callable = self._verify

    def __call__(self, *args):
        return self._run(*args)

    def _verify(self, *args):
        self._run = self.compiled
        randoms = random_ops(self.original)
        if randoms:
            self.record.verified = f"skipped: the graph uses random operators ({', '.join(randoms)})"
            return self.compiled(*args)
        previous = self.original
        for pass_name, graph, position in self.steps:
            problem = run_and_compare(self.original, graph, list(args))
            if problem:
                return self._mismatch(pass_name, position, previous, problem, args)
            previous = graph
        self.record.verified = f"passed ({len(self.steps)} step(s) compared with the captured graph)"
        return self.compiled(*args)

    def _mismatch(self, pass_name: str, position: int, before: torch.fx.GraphModule, problem: str,
                  args: tuple):
        from .repro import Failure, write_reproducer
        plugin = self.plugins.get(pass_name, "?")
        repro = write_reproducer(graph_id=self.record.graph_id, position=position, plugin=plugin,
                                 received=before, args=list(args), plan=self.plan,
                                 failure=Failure(kind="mismatch", message=problem),
                                 tags=self.tags[position if self.plan.verify == "each" else 1],
                                 target=self.target, role=self.record.role,
                                 whole_prefix=self.plan.verify != "each")
        self.record.reproducer = repro
        if self.plan.verify == "each":
            blame = f"pass '{pass_name}' from plugin {plugin} changed the result"
        else:
            blame = (f"the graph after the last pass ('{pass_name}') differs from the captured graph "
                     f"(verify: final cannot tell which pass did it; rerun with verify: each)")
        message = (f"verification failed on graph {self.record.graph_id}: {blame}: {problem}. "
                   f"Reproducer: {repro}")
        self.record.verified = f"failed at pass '{pass_name}'"
        if self.on_error == "eager":
            self.record.fallback = message
            warnings.warn(f"pipeline: {message}; running graph {self.record.graph_id} eagerly "
                          f"(plan on_error: eager)", stacklevel=2)
            self._run = self.original
            return self.original(*args)
        raise VerificationError(message, pass_name=pass_name, plugin=plugin,
                                graph_id=self.record.graph_id, reproducer=repro)
