"""``pipeline profile``: where a compiled model's time goes, in the project's own units.

The model is compiled with the plan, then called a few times under torch's profiler with every
node of every compiled graph inside a range of its own (the graph runs node by node for this, so
host times carry a little interpretation overhead; device times are the kernels' own). Each
generated kernel and extern call is listed with its time per model call (GPU kernel time on CUDA,
CPU time otherwise), its share, the fused group it computes and the lines of the user's model it
came from (read from the graph's stack traces, which every pass keeps).
"""
from __future__ import annotations

import os
from collections import defaultdict
from typing import Any, Callable

import attrs
import torch

from pipeline.api import compile_under
from pipeline.compilation import Compilation
from pipeline.plan.schema import load_plan
from pipeline.registry import get_registry
from pipeline.tools.report import write_report
from pipeline.tools.tune import Runner

PREFIX = "pp:"


@attrs.frozen
class Unit:
    """One kernel or extern call of a compiled graph, and its time per model call."""

    graph: str
    node: str
    kind: str             # "kernel" (generated), "extern" (an ATen call), "graph" (a CUDA-graph replay...)
    name: str             # the kernel's name or the operator's
    group: str | None     # the fused group a kernel computes
    ms: float             # per model call: GPU time on CUDA, CPU time on the CPU
    calls: float          # per model call
    source: tuple         # "file:line: code" of the user's lines it came from


@attrs.frozen
class Profile:
    """The units of a compiled model, slowest first, with the total they add up to."""

    units: tuple
    total_ms: float
    device: str
    calls: int

    def table(self, limit: int = 30) -> str:
        """The units as text: share, time per call, kind, name, group and source lines."""
        lines = [f"{self.total_ms:.3f} ms per call in {len(self.units)} kernel(s) and extern call(s) "
                 f"({'GPU kernel time' if self.device == 'cuda' else 'CPU time'}, {self.calls} calls profiled)"]
        running = 0.0
        for unit in self.units[:limit]:
            share = unit.ms / self.total_ms if self.total_ms else 0.0
            running += share
            where = unit.source[0] if unit.source else "(no source line)"
            group = f" [{unit.group}]" if unit.group else ""
            lines.append(f"{share:6.1%} {running:6.1%} {unit.ms:9.4f} ms  {unit.kind:<6} {unit.name}{group}  {where}")
            lines.extend(f"{'':>37}{more}" for more in unit.source[1:])
        return "\n".join(lines)

    def to_data(self) -> dict:
        """Plain data for the compile report's profile section."""
        return {"total_ms": self.total_ms, "calls": self.calls,
                "time": "GPU kernel time" if self.device == "cuda" else "CPU time",
                "units": [{"graph": u.graph, "node": u.node, "kind": u.kind, "name": u.name, "group": u.group,
                           "ms": u.ms, "calls": u.calls, "source": list(u.source),
                           "share": u.ms / self.total_ms if self.total_ms else 0.0} for u in self.units]}

    def covering(self, share: float) -> tuple:
        """The fewest slowest units whose times add up to ``share`` of the total."""
        out, running = [], 0.0
        for unit in self.units:
            if running >= share * self.total_ms:
                break
            out.append(unit)
            running += unit.ms
        return tuple(out)


class _NodeRanges(Compilation):
    """A compilation whose graphs run node by node, each node inside a profiler range (a graph
    the plan verifies on its first call runs whole)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.profiled: dict[str, torch.fx.GraphModule] = {}
        self.profile_data: dict | None = None       # what the compile report shows, once profiled

    def _compile_locked(self, gm: torch.fx.GraphModule, example_inputs: list, graph_id: str, role: str,
                        **kwargs: Any) -> Callable:
        compiled = super()._compile_locked(gm, example_inputs, graph_id, role, **kwargs)
        module = getattr(compiled, "__self__", None)
        if isinstance(module, torch.fx.GraphModule):
            self.profiled[graph_id] = module
            return _Ranged(module, graph_id)
        return compiled


class _Ranged(torch.fx.Interpreter):
    """Runs a graph node by node, each call inside ``record_function("pp:<graph>:<node>")``."""

    def __init__(self, module: torch.fx.GraphModule, graph_id: str):
        super().__init__(module, garbage_collect_values=True)
        self.graph_id = graph_id

    def __call__(self, *args: Any) -> Any:
        return self.run(*args)

    def run_node(self, node: torch.fx.Node) -> Any:
        if node.op != "call_function" or _trivial(node):
            return super().run_node(node)
        with torch.profiler.record_function(f"{PREFIX}{self.graph_id}:{node.name}"):
            return super().run_node(node)


def _trivial(node: torch.fx.Node) -> bool:
    return getattr(node.target, "__name__", "") in ("getitem",)


def profile(model: Any, *inputs: Any, plan: Any = "default", calls: int = 10, training: bool = False,
            report: str | os.PathLike | None = None, **kwargs: Any) -> Profile:
    """Profile ``model`` compiled with ``plan`` on ``inputs``: see the module docstring. With
    ``report``, the compile report (with a profile section) is written to that folder."""
    registry = get_registry()
    compilation = _NodeRanges(load_plan(plan, registry=registry), registry)
    compiled = compile_under(model, compilation)
    runner = Runner(model, inputs, kwargs, training)
    for _ in range(3):
        runner(compiled)
    runner.sync()
    cuda = runner.device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            runner(compiled)
        runner.sync()
    result = _units(prof, compilation, calls, "cuda" if cuda else "cpu")
    compilation.profile_data = result.to_data()
    if report is not None:
        write_report(compilation, report)
    return result


def _units(prof: Any, compilation: _NodeRanges, calls: int, device: str) -> Profile:
    nodes = {(gid, n.name): n for gid, gm in compilation.profiled.items() for n in gm.graph.nodes}
    spent: dict = defaultdict(list)
    for event in prof.events():
        if not event.name.startswith(PREFIX):
            continue
        graph_id, name = event.name[len(PREFIX):].rsplit(":", 1)
        time_us = _device_us(event) if device == "cuda" else event.cpu_time_total
        spent[(graph_id, name)].append(time_us)
    units = []
    for (graph_id, name), times in spent.items():
        node = nodes.get((graph_id, name))
        if node is None:
            continue
        kind, label, group, source = describe_node(node)
        units.append(Unit(graph_id, name, kind, label, group, sum(times) / 1e3 / calls, len(times) / calls, source))
    units.sort(key=lambda u: -u.ms)
    return Profile(tuple(units), sum(u.ms for u in units), device, calls)


def _device_us(event: Any) -> float:
    total = getattr(event, "device_time_total", None)
    if total is None:
        total = getattr(event, "cuda_time_total", 0.0)
    return float(total)


def describe_node(node: torch.fx.Node) -> tuple[str, str, str | None, tuple]:
    """(kind, name, fused group, source lines) of a compiled graph's node."""
    target = node.target
    group = getattr(target, "group", None)
    if group is not None and hasattr(group, "subgraph"):
        members = [n for n in group.subgraph.graph.nodes if n.op == "call_function"]
        return "kernel", getattr(target, "__name__", str(target)), group.name, source_lines(members)
    wrapped = getattr(target, "wrapped_graph", None)
    if isinstance(wrapped, torch.fx.GraphModule):
        members = [n for n in wrapped.graph.nodes if n.op == "call_function"]
        return "graph", getattr(target, "__name__", str(target)), None, source_lines(members)
    name = str(target) if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", str(target))
    return "extern", name, None, source_lines([node])


def source_lines(nodes: list, limit: int = 3) -> tuple:
    """The user's source lines behind ``nodes`` (the last frame of each stack trace that is not
    in torch or this project), most frequent first."""
    counts: dict = defaultdict(int)
    for node in nodes:
        frame = _user_frame(node.meta.get("stack_trace"))
        if frame:
            counts[frame] += 1
    return tuple(sorted(counts, key=lambda f: -counts[f])[:limit])


# Frames in torch and in this project are not the user's code (by the packages' own folders: a
# virtual environment under /opt/torch/ holds user libraries too).
_PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SKIP = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep, os.path.join(_PROJECT, "pipeline") + os.sep,
         os.path.join(_PROJECT, "passes") + os.sep)


def _user_frame(trace: str | None) -> str | None:
    if not trace:
        return None
    lines = trace.strip().splitlines()
    found = None
    for index, line in enumerate(lines):
        text = line.strip()
        if text.startswith('File "'):
            path = text.split('"')[1]
            if os.path.abspath(path).startswith(_SKIP):
                continue
            number = text.split("line ")[1].split(",")[0] if "line " in text else "?"
            code = lines[index + 1].strip() if index + 1 < len(lines) else ""
            found = f"{os.path.basename(path)}:{number}: {code}"
    return found


__all__ = ["profile", "Profile", "Unit", "describe_node", "source_lines"]
