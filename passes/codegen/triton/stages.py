"""Staged reductions: a reduction group that would launch few programs and needs several passes over
its rows, or writes full-level outputs, runs as one group per pass plus a pointwise group.

A training batch norm is one group: the per-channel mean (pass 1), the variance around it (pass
2), then the normalized, scaled and activated output (a full-level output, pass 3); its backward
sums two per-channel reductions and writes the input gradient. Over 64 channels of 32 x 112 x
112 elements, one kernel runs one program per channel (or a few channels), each looping over
400 000 elements, on a GPU of 132 SMs. :mod:`.split` cuts such a reduction's rows into chunks,
but only a one-pass group without full-level outputs (a chunk's program cannot finish the second
pass before every chunk finished the first).

Staged, the group becomes (each an ordinary :class:`FusedGroup` over the same domain, generated
like any other, so a reduction stage is split when it has few programs):
- stage ``p`` (one per pass that reduces): the group's reductions of pass ``p``, the full-level
  nodes they read (recomputed from the group's inputs), and the outer-level nodes available after
  them (a mean, a reciprocal standard deviation, running statistics), whose values later stages
  or the group's outputs need as its outputs;
- a last, pointwise stage (when the group has full-level outputs): those outputs, recomputed from
  the group's inputs and the earlier stages' outer values over the whole domain.

The staged groups read the group's inputs once per pass, as the one kernel does; the outer values
between them are small. :class:`StagedKernel` calls the stages' kernels in order and is what the
graph calls.
"""
from __future__ import annotations

from typing import Any, Callable

import attrs
import torch
import torch.fx

from passes.kernel_ir.groups import REDUCTIONS, CompiledKernel, FusedGroup, packet_name
from passes.kernel_ir.loops import LoopNest, UnsupportedGroup

Source = tuple      # ("in", i): the group's input i; ("stage", k, j): output j of stage k


@attrs.frozen
class Stage:
    """One stage: its group and, per input of the group, where the value comes from."""

    group: FusedGroup
    sources: tuple


def stage_groups(group: FusedGroup, nest: LoopNest) -> tuple[list[Stage], tuple]:
    """The stages of ``group`` (see the module docstring) and, per output of the group, its
    source. Raises :class:`UnsupportedGroup` when an output is an input of the group or a stage
    would need a value of a later one."""
    graph = group.subgraph.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    outputs = list(next(n for n in graph.nodes if n.op == "output").args[0])
    # Reductions and outer values belong to the stage of their pass (those of the inputs alone to
    # the first: the pointwise stage cannot hold a value of the reduced shape); full-level nodes
    # are recomputed by each stage that needs them (full-level outputs by the last).
    owner = {node: max(1, nest.pass_of[node]) for node in nest.nodes
             if packet_name(node.target) in REDUCTIONS or nest.level[node] == "outer"}
    last = max(owner.values(), default=0) + 1          # the pointwise stage
    if any(o.op == "placeholder" for o in outputs):
        raise UnsupportedGroup("an output of the group is one of its inputs")
    roots: dict = {}
    for o in outputs:       # a full-level output may also feed a reduction: computed where needed
        roots.setdefault(owner.get(o, last), []).append(o)
    members: dict = {}
    inputs: dict = {}
    for stage in range(last, 0, -1):        # later stages first: they say what earlier ones export
        if stage not in roots:
            continue
        inside, needed = set(), []
        stack = list(roots[stage])
        while stack:
            node = stack.pop()
            if node in inside:
                continue
            inside.add(node)
            for arg in node.all_input_nodes:
                if arg.op == "placeholder" or owner.get(arg, stage) < stage:
                    if arg not in needed:
                        needed.append(arg)
                    if arg.op != "placeholder" and arg not in roots.setdefault(owner[arg], []):
                        roots[owner[arg]].append(arg)
                elif owner.get(arg, stage) > stage:
                    raise UnsupportedGroup(f"{arg.name} is needed before its pass")
                else:
                    stack.append(arg)
        members[stage] = [n for n in graph.nodes if n in inside]
        inputs[stage] = needed
    order = sorted(members)
    index = {s: k for k, s in enumerate(order)}
    exported = {s: list(dict.fromkeys(roots[s])) for s in order}

    def source(node: torch.fx.Node) -> Source:
        if node.op == "placeholder":
            return ("in", placeholders.index(node))
        stage = owner.get(node, last)
        return ("stage", index[stage], exported[stage].index(node))

    stages = []
    for s in order:
        sub = torch.fx.Graph()
        env: dict = {}
        for i, node in enumerate(inputs[s]):
            env[node] = sub.placeholder(f"in{i}")
            env[node].meta = dict(node.meta)
        for node in members[s]:
            env[node] = sub.node_copy(node, lambda n: env[n])
        sub.output(tuple(env[n] for n in exported[s]))
        reduced = group.reduced if s < last else ()
        stage = FusedGroup(name=f"{group.name}_{index[s]}", subgraph=torch.fx.GraphModule(group.subgraph, sub),
                           domain=group.domain, reduced=tuple(reduced))
        stages.append(Stage(stage, tuple(source(n) for n in inputs[s])))
    return stages, tuple(source(o) for o in outputs)


class StagedKernel(CompiledKernel):
    """A staged group's kernels (see the module docstring), called in order: each stage's inputs
    are the group's inputs and earlier stages' outputs."""

    backend = "triton"

    def __init__(self, group: FusedGroup, kernels: list, sources: list, outputs: tuple):
        super().__init__(group, "\n".join(k.source for k in kernels))
        self.kernels = list(kernels)
        self.sources = [tuple(s) for s in sources]
        self.outputs = tuple(outputs)

    @property
    def __name__(self) -> str:
        return self.kernels[-1].__name__

    def __call__(self, *inputs: torch.Tensor, donors: tuple = (), reuse: tuple = ()) -> tuple:
        results: list = []
        for kernel, sources in zip(self.kernels, self.sources):
            results.append(kernel(*[inputs[s[1]] if s[0] == "in" else results[s[1]][s[2]] for s in sources]))
        return tuple(inputs[o[1]] if o[0] == "in" else results[o[1]][o[2]] for o in self.outputs)

    def to_data(self, codec: Any) -> dict:
        """Plain data for the compile cache: the group, each stage's kernel and its sources."""
        return {"group": self.group.to_data(codec), "kernels": [codec.describe(k) for k in self.kernels],
                "sources": [[list(s) for s in ss] for ss in self.sources], "outputs": [list(o) for o in self.outputs]}

    @classmethod
    def from_data(cls, data: dict, codec: Any) -> "StagedKernel":
        return cls(FusedGroup.from_data(data["group"], codec), [codec.rebuild(k) for k in data["kernels"]],
                   [tuple(tuple(s) for s in ss) for ss in data["sources"]], tuple(tuple(o) for o in data["outputs"]))


def build_staged_kernel(group: FusedGroup, nest: LoopNest, compile_stage: Callable) -> StagedKernel:
    """The staged kernel of ``group``: ``compile_stage(stage group)`` gives each stage's kernel
    (raising :class:`UnsupportedGroup` when it cannot, which gives up the staging)."""
    stages, outputs = stage_groups(group, nest)
    kernels = [compile_stage(stage.group) for stage in stages]
    return StagedKernel(group, kernels, [stage.sources for stage in stages], outputs)
