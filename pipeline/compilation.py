"""One compile of one model under one plan: binds fresh pass instances, receives every graph the
capture pass hands over, runs the pass manager on it, applies the failure policy and verification,
and keeps the record the report and ``explain`` are built from."""
from __future__ import annotations

import logging
import os
import time
import warnings
from typing import Any, Callable

import attrs
import torch
import torch.fx

from . import compat
from .errors import ExpectationError, PipelineError
from .fused import count_kernels
from .graph_pass import CaptureContext, PassContext
from .instruments import PassTimer, Snapshots, SourceDump, copy_graph
from .manager import BoundPass, PassManager
from .plan import Plan
from .registry import Registry
from .verification import FirstCallVerifier

log = logging.getLogger("pipeline.passes")


@attrs.define(eq=False)
class GraphRecord:
    """What happened to one captured graph."""

    graph_id: str
    role: str
    nodes_in: int
    passes: list = attrs.field(factory=list)
    notes: list = attrs.field(factory=list)
    tags: list = attrs.field(factory=list)
    fallback: str | None = None
    verified: str = "not requested"
    kernels: int = 0
    cudagraphs: bool = False
    seconds: float = 0.0
    final_code: str = ""


class Compilation:
    """The state of compiling one model with one plan; given back by :func:`compilation_of`."""

    def __init__(self, plan: Plan, registry: Registry):
        self.plan = plan
        self.registry = registry
        self.graphs: list[GraphRecord] = []
        self.graph_breaks: list[str] = []
        self.recompiles: list[str] = []
        self.compile_seconds = 0.0
        self._checked_version = 0
        self.version = 0  # bumped by every graph compile; after_call checks only when it moved
        self._break_baseline = compat.graph_break_counts()
        bound = [self._bind(spec) for spec in plan.passes]
        self.capture = bound[0]
        self.graph_passes = bound[1:]

    def _bind(self, spec: Any) -> BoundPass:
        entry = self.registry.passes[spec.name]
        return BoundPass(entry.cls(spec.options), entry.plugin)

    # -- the capture pass calls this for every graph it captures ------------------------------
    def capture_context(self) -> CaptureContext:
        return CaptureContext(plan=self.plan, compilation=self)

    def compile_graph(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        """Compile one captured graph through the plan's graph passes; returns its callable."""
        self.version += 1
        self._collect_graph_breaks()
        graph_id = f"g{self._graph_count()}"
        needs_grad = torch.is_grad_enabled() and any(
            isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)
        if needs_grad:
            return compat.aot_compile(
                gm, example_inputs,
                forward=lambda g, ins: self._compile_one(g, ins, f"{graph_id}.forward", "forward"),
                backward=lambda g, ins: self._compile_one(g, ins, f"{graph_id}.backward", "backward"))
        return self._compile_one(gm, compat.as_fake(list(example_inputs)), graph_id, "inference")

    def _graph_count(self) -> int:
        return len({r.graph_id.split(".")[0] for r in self.graphs})

    def _compile_one(self, gm: torch.fx.GraphModule, example_inputs: list, graph_id: str,
                     role: str) -> Callable:
        start = time.perf_counter()
        record = GraphRecord(graph_id=graph_id, role=role, nodes_in=len(gm.graph.nodes))
        self.graphs.append(record)
        plan = self.plan
        original = copy_graph(gm) if (plan.verify != "off" or plan.on_error == "eager") else gm
        context = PassContext(graph_id=graph_id, target=self._target(example_inputs),
                              example_inputs=example_inputs, plan=plan, role=role,
                              tags=set(type(self.capture.instance).provided(self.capture.instance.options)))
        snapshots = Snapshots() if plan.verify == "each" else None
        instruments: list = [PassTimer(record)]
        if snapshots is not None:
            instruments.append(snapshots)
        dump_dir = os.environ.get("PIPELINE_DUMP_DIR")
        if dump_dir:
            instruments.append(SourceDump(dump_dir))
        manager = PassManager(self.graph_passes, registry=self.registry,
                              plugin_manager=self.registry.plugin_manager(instruments),
                              check_invariants=plan.verify != "off")
        try:
            final = manager.run(gm, context)
        except PipelineError as exc:
            return self._fail(exc, record, original, start)
        finally:
            record.notes = list(context.notes)
            record.tags = sorted(context.tags)
        record.final_code = final.code
        record.kernels = count_kernels(final)
        record.seconds = time.perf_counter() - start
        self.compile_seconds += record.seconds
        for entry in record.passes:
            log.debug("%s %s %.2f ms", graph_id, entry["pass"], entry["seconds"] * 1e3)
        if plan.verify == "off":
            return final.forward
        steps = snapshots.items if snapshots is not None else [(self.graph_passes[-1].name, final)
                                                                if self.graph_passes else ("capture", final)]
        plugins = {b.name: str(b.plugin) for b in self.graph_passes}
        record.verified = "pending first call"
        return FirstCallVerifier(original=original, steps=steps, compiled=final.forward, record=record,
                                 plugins=plugins, on_error=plan.on_error, plan=plan)

    def _fail(self, exc: PipelineError, record: GraphRecord, original: torch.fx.GraphModule,
              start: float) -> Callable:
        record.seconds = time.perf_counter() - start
        self.compile_seconds += record.seconds
        if self.plan.on_error == "eager":
            record.fallback = str(exc)
            warnings.warn(f"pipeline: graph {record.graph_id} runs eagerly (plan on_error: eager): {exc}",
                          stacklevel=2)
            return original
        raise exc

    def _target(self, example_inputs: list) -> str:
        if self.plan.target != "auto":
            return self.plan.target
        for value in example_inputs:
            if isinstance(value, torch.Tensor) and value.device.type == "cuda":
                return "cuda"
        return "cpu"

    def _collect_graph_breaks(self) -> None:
        now = compat.graph_break_counts()
        for reason, count in now.items():
            new = count - self._break_baseline.get(reason, 0)
            self.graph_breaks.extend([reason] * max(new, 0))
        self._break_baseline = now

    # -- after each call ----------------------------------------------------------------------
    def after_call(self) -> None:
        """Pick up graph breaks seen since the last graph and check the plan's expectations.
        Cheap when nothing compiled since the last check."""
        if self.version == self._checked_version:
            return
        self._checked_version = self.version
        self._collect_graph_breaks()
        self.check_expectations()

    def check_expectations(self) -> None:
        expect = self.plan.expect
        misses = []
        measured = {
            "max_graph_breaks": len(self.graph_breaks),
            "max_recompiles": len(self.recompiles),
            "max_kernels": sum(r.kernels for r in self.graphs),
            "max_compile_seconds": round(self.compile_seconds, 3),
        }
        for key, value in measured.items():
            limit = getattr(expect, key)
            if limit is not None and value > limit:
                misses.append(f"expect.{key} is {limit} but the compile measured {value}")
        if expect.cudagraphs is not None and self.graphs:
            wrapped = [r.cudagraphs for r in self.graphs]
            if (expect.cudagraphs == "full" and not all(wrapped)) or (expect.cudagraphs == "any" and not any(wrapped)):
                misses.append(f"expect.cudagraphs is '{expect.cudagraphs}' but {sum(wrapped)} of "
                              f"{len(wrapped)} graphs run under CUDA graphs")
        if not misses:
            return
        message = f"plan '{self.plan.name}' ({self.plan.source}): " + "; ".join(misses)
        if expect.on_miss == "error":
            raise ExpectationError(message)
        warnings.warn(message, stacklevel=3)

    def summary(self) -> dict:
        """A plain-data summary of the compile (the core of the compile report)."""
        return {
            "plan": self.plan.name,
            "graphs": [attrs.asdict(r) for r in self.graphs],
            "graph_count": self._graph_count(),
            "graph_breaks": list(self.graph_breaks),
            "recompiles": list(self.recompiles),
            "compile_seconds": self.compile_seconds,
            "fallbacks": [{"graph": r.graph_id, "reason": r.fallback} for r in self.graphs if r.fallback],
        }


__all__ = ["Compilation", "GraphRecord"]
