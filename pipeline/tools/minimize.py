"""Shrink a reproducer's graph while the failing pass keeps failing the same way (a mismatch stays
a mismatch; an exception stays an exception of the same type).

Two reductions, repeated until neither helps (or the check budget is spent):

- *truncate*: make one computed node the graph's only output (earliest first), dropping everything
  that no longer feeds it;
- *cut*: turn a computed value into a graph input carrying the very value it had, dropping the
  nodes that computed it (closest to the outputs first, which removes the most).

Every value keeps what it was in the original run (the graph is interpreted once on the saved
inputs), so failures that depend on particular values survive the cuts.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import attrs
import torch
import torch.fx
import yaml

from pipeline.errors import PipelineError
from pipeline.tools.repro import Failure, Reproducer, replay, write_folder
from pipeline.verification import clone_inputs

Check = Callable[[torch.fx.GraphModule, list], "Failure | None"]


@attrs.frozen
class Minimized:
    """The smallest graph found that still fails like the original, with its inputs."""

    graph: torch.fx.GraphModule
    inputs: list
    failure: Failure
    nodes_before: int
    nodes_after: int
    checks: int


def minimize(repro: Reproducer, *, max_checks: int = 400) -> Minimized:
    """Shrink the reproducer's graph; raises :class:`PipelineError` when the recorded failure no
    longer reproduces (nothing to minimize)."""
    seen = replay(repro)
    if not repro.failure.same_kind(seen):
        now = seen.describe() if seen is not None else "the pass now passes"
        raise PipelineError(f"{repro.directory}: the recorded failure ({repro.failure.describe()}) does not "
                            f"reproduce ({now}); nothing to minimize")
    return shrink(repro.graph, repro.inputs, lambda g, i: replay(repro, g, i), seen, max_checks=max_checks)


def shrink(graph: torch.fx.GraphModule, inputs: list, check: Check, want: Failure, *,
           max_checks: int = 400) -> Minimized:
    """Delta-debug ``graph``: the smallest subgraph on which ``check`` still reports a failure of
    the same kind as ``want``."""
    values = _values(graph, inputs)
    computed = [n for n in graph.graph.nodes
                if n.op in ("call_function", "call_method") and isinstance(values.get(n), torch.Tensor)]
    (out_node,) = [n for n in graph.graph.nodes if n.op == "output"]
    outputs = [n for n in _flat_nodes(out_node.args) if isinstance(values.get(n), torch.Tensor)]
    cut: frozenset = frozenset()
    best = (graph, list(inputs), want)
    checks = 0

    def attempt(new_outputs: list, new_cut: frozenset) -> bool:
        nonlocal best, checks
        checks += 1
        candidate, candidate_inputs = _subgraph(graph, values, new_outputs, new_cut)
        if len(candidate.graph.nodes) >= len(best[0].graph.nodes):
            return False
        seen = check(candidate, candidate_inputs)
        if want.same_kind(seen):
            best = (candidate, candidate_inputs, seen)
            return True
        return False

    progress = True
    while progress and checks < max_checks:
        progress = False
        reachable = _reachable(outputs, cut)
        for node in [n for n in computed if n in reachable]:
            if checks >= max_checks:
                break
            if outputs != [node] and attempt([node], cut):
                outputs, progress = [node], True
                break
        reachable = _reachable(outputs, cut)
        for node in reversed([n for n in computed if n in reachable and n not in outputs and n not in cut]):
            if checks >= max_checks:
                break
            if node in _reachable(outputs, cut) and attempt(outputs, cut | {node}):
                cut, progress = cut | {node}, True
    final, final_inputs, failure = best
    return Minimized(graph=final, inputs=final_inputs, failure=failure, nodes_before=len(graph.graph.nodes),
                     nodes_after=len(final.graph.nodes), checks=checks)


def write_minimized(repro: Reproducer, result: Minimized, folder: str | os.PathLike | None = None) -> Path:
    """Write the minimized graph as a reproducer folder (default ``<reproducer>/minimized``) that
    ``pipeline repro`` replays like the original."""
    out = Path(folder) if folder is not None else repro.directory / "minimized"
    info = dict(repro.info)
    info["failure"] = attrs.asdict(result.failure)
    info["minimized_from"] = str(repro.directory)
    plan = yaml.safe_load((repro.directory / "plan.yaml").read_text())
    write_folder(out, info, result.graph, result.inputs, plan=plan)
    return out


# -- helpers -------------------------------------------------------------------------------------
class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__(gm)
        self.values: dict = {}

    def run_node(self, node: torch.fx.Node):
        value = super().run_node(node)
        self.values[node] = value.clone() if isinstance(value, torch.Tensor) else value
        return value


def _values(graph: torch.fx.GraphModule, inputs: list) -> dict:
    """Every node's value when ``graph`` runs on (copies of) ``inputs``."""
    recorder = _Recorder(graph)
    with torch.no_grad():
        recorder.run(*clone_inputs(inputs))
    return recorder.values


def _flat_nodes(value) -> list:
    out: list = []
    torch.fx.node.map_arg(value, lambda n: out.append(n) or n)
    return out


def _reachable(outputs: list, cut: frozenset) -> set:
    """Nodes the outputs depend on, stopping at cut nodes (which become inputs)."""
    seen: set = set()
    stack = list(outputs)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node not in cut and node.op != "placeholder":
            stack.extend(node.all_input_nodes)
    return seen


def _subgraph(graph: torch.fx.GraphModule, values: dict, outputs: list,
              cut: frozenset) -> tuple[torch.fx.GraphModule, list]:
    """The graph computing ``outputs`` with ``cut`` nodes turned into inputs, and its inputs."""
    needed = _reachable(outputs, cut)
    new = torch.fx.Graph()
    env: dict = {}
    inputs = []
    order = [n for n in graph.graph.nodes if n in needed]
    for node in [n for n in order if n.op == "placeholder"] + [n for n in order if n in cut]:
        env[node] = new.placeholder(node.name)
        inputs.append(values[node])
    for node in order:
        if node not in env:
            env[node] = new.node_copy(node, lambda n: env[n])
    new.output(tuple(env[n] for n in outputs))
    gm = torch.fx.GraphModule(graph, new)
    return gm, inputs


__all__ = ["Minimized", "minimize", "shrink", "write_minimized"]
