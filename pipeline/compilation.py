"""One compile of one model under one plan: binds fresh pass instances, receives every graph the
capture pass hands over, runs the pass manager on it, applies the failure policy and verification,
and keeps the record the compile report and ``explain`` are built from.

Recording is cheap by default: per-pass times, notes, what capture said about each graph (break
reason and source line, guards) and what the final graph calls. The graph's source after every
pass is kept only when a report is requested (``PIPELINE_REPORT_DIR`` or ``report=``)."""
from __future__ import annotations

import logging
import os
import time
import warnings
from typing import Any, Callable

import attrs
import torch
import torch.fx

from pipeline import compat
from pipeline.errors import ExpectationError, PassFailure, PipelineError
from pipeline.cache import plan_material
from pipeline.cache.graphs import GraphCache
from pipeline.graph_pass import CaptureContext, Fuel, JointGraph, PassContext
from pipeline.instruments import GraphSources, PassTimer, Snapshots, SourceDump, copy_graph
from pipeline.ir import saved_for_backward
from pipeline.logs import get_logger
from pipeline.manager import BoundPass, PassManager
from pipeline.metrics import Outcome, check_limits, defaults, measure_all
from pipeline.plan.order import role_pipeline
from pipeline.plan.schema import Plan
from pipeline.progress import Progress
from pipeline.record import GraphRecord
from pipeline.reproducer import Failure, write_reproducer
from pipeline.training import split_training_graph
from pipeline.registry import Registry
from pipeline.verification import FirstCallVerifier

REPORT_DIR_ENV = "PIPELINE_REPORT_DIR"
COMPILATION_ATTR = "__pipeline_compilation__"   # where a compiled model or function keeps its Compilation


class Compilation:
    """The state of compiling one model with one plan; given back by :func:`compilation_of`."""

    #: Writes the compile report into a folder (``pipeline.tools.report`` sets it when imported,
    #: as ``import pipeline`` does): ``report_writer(compilation, folder, subfolder=...)``.
    report_writer: Callable | None = None

    def __init__(self, plan: Plan, registry: Registry, *, report: bool | str | os.PathLike | None = None,
                 fuel: Fuel | None = None):
        self.plan = plan
        self.registry = registry
        self.graphs: list[GraphRecord] = []
        self.graph_breaks: list[str] = []
        # The grad modes of the calls that saw a graph break: Dynamo guards its cache entries on
        # the grad mode, so entries made in the other mode hold whole graphs.
        self.broken_grad_modes: set[bool] = set()
        self.captures: list[dict] = []   # what Dynamo said about each captured graph (compat.capture_details)
        self.recompiles: list[str] = []
        self.fallbacks: list[dict] = []   # calls run eagerly for a reason no single graph has (capture's recompile limit)
        self.warmup: dict | None = None   # what warm-up of the plan's shape buckets did (pipeline.serving)
        self.serving: Any = None          # the BucketedRunner when the plan declares shapes
        self.runtime: dict[str, Any] = {}  # live objects the capture pass exposes (CaptureContext.expose)
        self.stored_keys: dict[str, str] = {}   # graph id -> its compile-cache key, when its entry is stored
        self.compile_seconds = 0.0
        self.fuel = fuel
        self.cache = GraphCache(plan)
        self.progress = Progress()
        env_dir = os.environ.get(REPORT_DIR_ENV) or None
        self.report_dir = str(report) if isinstance(report, (str, os.PathLike)) else env_dir
        self.record_sources = bool(report) or self.report_dir is not None
        # Reports asked for through the environment get a folder per compile inside the directory.
        self.report_subfolder = not isinstance(report, (str, os.PathLike))
        self.report_folder: Any = None
        self.report_path: str | None = None
        self._reported_version = 0
        self._checked_version = 0
        self._called = False
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
        """What the capture pass is given: the plan, and this compilation to record events in."""
        return CaptureContext(plan=self.plan, compilation=self)

    def compile_graph(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        """Compile one captured graph through the plan's graph passes; returns its callable."""
        self.version += 1
        graph_id = f"g{self._graph_count()}"
        self._record_capture(gm, graph_id)
        self._collect_graph_breaks()
        try:
            return self._compile_captured(gm, example_inputs, graph_id)
        except compat.restart_exceptions():     # Dynamo traces again (a lifted float made constant)
            self.graphs[:] = [r for r in self.graphs if r.graph_id.split(".")[0] != graph_id]
            self.captures[:] = [c for c in self.captures if c.get("graph") != graph_id]
            raise

    def _compile_captured(self, gm: torch.fx.GraphModule, example_inputs: list, graph_id: str) -> Callable:
        needs_grad = torch.is_grad_enabled() and any(
            isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)
        if needs_grad:
            split = self._split_index()
            joint_tags: dict = {}   # the tags the joint graph ends with, for both halves
            partition = None
            if split is not None:
                def partition(joint, flat_inputs, num_primals, num_forward_outputs):
                    return self._partition(joint, flat_inputs, num_primals, num_forward_outputs, graph_id,
                                           joint_tags)
            return compat.aot_compile(
                gm, example_inputs, partition=partition,
                inference=lambda g, ins: self._compile_one(g, ins, graph_id, "inference"),
                forward=lambda g, ins: self._compile_one(g, ins, f"{graph_id}.forward", "forward",
                                                         tags=joint_tags.get("tags"),
                                                         forward_outputs=joint_tags.get("forward_outputs")),
                backward=lambda g, ins: self._compile_one(g, ins, f"{graph_id}.backward", "backward",
                                                          tags=joint_tags.get("tags")))
        return self._compile_one(gm, compat.backend_inputs(gm, example_inputs), graph_id, "inference")

    def capture_tags(self) -> set[str]:
        """The invariant tags the capture pass gives every graph it hands over."""
        return set(type(self.capture.instance).provided(self.capture.instance.options))

    def _partition(self, joint: torch.fx.GraphModule, flat_inputs: list, num_primals: int,
                   num_forward_outputs: int, graph_id: str, joint_tags: dict) -> tuple:
        """AOTAutograd's partition hook: the joint passes, then the split pass (:mod:`.training`)."""
        joint_tags["forward_outputs"] = num_forward_outputs
        joint_graph = JointGraph(module=joint, example_inputs=flat_inputs, num_primals=num_primals,
                                 num_forward_outputs=num_forward_outputs)
        passes, _ = self._role_passes("joint")
        split = self.graph_passes[self._split_index() - 1]
        return split_training_graph(self, joint_graph, passes, split, f"{graph_id}.joint", joint_tags)

    def _split_index(self) -> int | None:
        """Plan position of the pass that splits training graphs (a ``SplitPass``), if any."""
        return next((i + 1 for i, b in enumerate(self.graph_passes) if type(b.instance).stage == "split"), None)

    def _role_passes(self, role: str) -> tuple[list[BoundPass], list[int]]:
        """The graph passes that run on a graph of ``role`` and their plan positions; the halves of
        a training graph run only those after the split pass (the rest ran on the joint graph)."""
        stages = [type(b.instance).stage for b in (self.capture, *self.graph_passes)]
        positions = role_pipeline(self.plan.passes, stages, role)
        split = self._split_index()
        if role in ("forward", "backward") and split is not None:
            positions = [p for p in positions if p > split]
        return [self.graph_passes[p - 1] for p in positions], positions

    def _graph_count(self) -> int:
        return len({r.graph_id.split(".")[0] for r in self.graphs})

    def _compile_one(self, gm: torch.fx.GraphModule, example_inputs: list, graph_id: str,
                     role: str, *, tags: set | None = None, forward_outputs: int | None = None) -> Callable:
        """``tags``: what the graph already has (a training half: what the joint graph ended with).
        ``forward_outputs``: for a training forward, how many outputs precede the saved ones.

        Holds Dynamo's compile lock: a backward graph compiles lazily, outside Dynamo, and the
        passes trace with process-wide state that another thread's Dynamo must not see."""
        with compat.compile_lock():
            return self._compile_locked(gm, example_inputs, graph_id, role, tags=tags,
                                        forward_outputs=forward_outputs)

    def _compile_locked(self, gm: torch.fx.GraphModule, example_inputs: list, graph_id: str,
                        role: str, *, tags: set | None, forward_outputs: int | None) -> Callable:
        start = time.perf_counter()
        record = self.new_record(graph_id, role, gm)
        if role == "backward":
            record.saved = saved_for_backward(gm)
        self.graphs.append(record)
        plan = self.plan
        passes, positions = self._role_passes(role)
        original = copy_graph(gm) if (plan.verify != "off" or plan.on_error == "eager") else gm
        context = PassContext(graph_id=graph_id, target=self.target_for(example_inputs),
                              example_inputs=example_inputs, cache=plan.cache, role=role,
                              tags=set(tags) if tags is not None else self.capture_tags(),
                              fuel=self.fuel, record=record, forward_outputs=forward_outputs)
        probe, cached, recorded = self.cache.lookup(
            gm, example_inputs, plan=plan, passes=[self.capture, *passes], role=role,
            target=context.target, graph_id=graph_id, bypass=self.cache_bypass(), context=context)
        record.cache = probe.summary()
        if cached is not None:
            self.stored_keys[graph_id] = probe.key
            context.notes.extend(recorded.get("notes", []))
            context.tags = set(recorded.get("tags", []))
            context.notes.append({"pass": None, "topic": "cache", "message":
                                  f"cache hit: rebuilt from {probe.reason} in {probe.seconds * 1e3:.1f} ms, no pass ran"})
            if self.record_sources:
                record.sources = [{"stage": "captured", "code": gm.code}, {"stage": "from cache", "code": cached.code}]
        snapshots = Snapshots() if plan.verify == "each" else None
        instruments: list = [PassTimer(record), self.progress.for_graph(graph_id, len(passes), self.compile_seconds)]
        if snapshots is not None:
            instruments.append(snapshots)
        if self.record_sources:
            instruments.append(GraphSources(record))
        dump_dir = os.environ.get("PIPELINE_DUMP_DIR")
        if dump_dir:
            instruments.append(SourceDump(dump_dir))
        manager = PassManager(passes, registry=self.registry,
                              plugin_manager=self.registry.plugin_manager(instruments),
                              check_invariants=plan.verify != "off")
        guards_before = compat.shape_guard_count(example_inputs)
        try:
            final = cached if cached is not None else manager.run(gm, context)
        except PipelineError as exc:
            if isinstance(exc, PassFailure) and snapshots is not None:
                done = len(snapshots.items)   # the failing pass is graph pass number `done`
                exc = self._with_reproducer(exc, record, snapshots.items[-1][1] if done else original,
                                            positions[min(done, len(positions) - 1)], example_inputs, context)
            return self._fail(exc, record, original, start)
        finally:
            record.notes = context.notes      # shared: decisions objects in the graph make at run time land here too
            record.tags = sorted(context.tags)
        store = None
        if cached is None:
            entry = {"notes": list(context.notes), "tags": sorted(context.tags),
                     "shape_guards": compat.shape_guards_since(example_inputs, guards_before)}

            def store(again: bool = False) -> None:
                self.cache.store(probe, final, target=context.target, record=entry)
                record.cache = probe.summary()
                if probe.stored:
                    self.stored_keys[graph_id] = probe.key
                if probe.status != "off" and not again:
                    context.notes.append({"pass": None, "topic": "cache", "message":
                                          f"cache {probe.status}{' (stored)' if probe.stored else ''}: "
                                          f"{probe.reason}"})
            context.store_again = lambda write=store: probe.stored and write(again=True)
            if plan.verify == "off":     # otherwise stored once the first call verified it
                store()
                store = None
        record.final_code = final.code
        record.metrics = measure_all(self.registry.metrics, final, context)
        record.seconds = time.perf_counter() - start
        self.compile_seconds += record.seconds
        _log_graph(record, self.registry.metrics)
        if plan.verify == "off":
            return final.forward
        if snapshots is not None:
            steps = [(name, graph, positions[index]) for index, (name, graph) in enumerate(snapshots.items)]
        else:
            last = positions[-1] if positions else len(plan.passes) - 1
            steps = [(plan.passes[last].name, final, last)]
        plugins = {b.name: str(b.plugin) for b in self.graph_passes}
        record.verified = "pending first call"
        tags = {position: self.tags_before(position) for position in {1, *(p for _, _, p in steps)}}
        return FirstCallVerifier(original=original, steps=steps, compiled=final.forward, record=record,
                                 plugins=plugins, on_error=plan.on_error, plan=plan, tags=tags,
                                 target=context.target, on_verified=store)

    def capture_material(self, target: str) -> tuple[dict | None, str | None]:
        """What the key of a stored capture hashes about this plan (what a compile-cache key hashes
        but the graph: the plan, its inference passes and the machine), or (None, why there is none)."""
        if not self.cache.enabled:
            return None, "plan cache.enabled is false or PIPELINE_CACHE_GRAPHS=0"
        passes, _ = self._role_passes("inference")
        return plan_material(self.plan, [self.capture, *passes], target)

    def rebuild_graph(self, key: str, target: str) -> Callable:
        """The compiled graph of compile-cache entry ``key``, rebuilt without a captured graph and
        without running a pass (a capture pass that stored its capture finds graphs this way).
        Raises ``LookupError`` with the cache's reason when the entry cannot be rebuilt."""
        start = time.perf_counter()
        graph_id = f"g{self._graph_count()}"
        record = GraphRecord(graph_id=graph_id, role="inference", nodes_in=0, metrics=defaults(self.registry.metrics))
        context = PassContext(graph_id=graph_id, target=target, example_inputs=[], cache=self.plan.cache,
                              role="inference", tags=self.capture_tags(), fuel=self.fuel, record=record)
        with compat.compile_lock():
            probe, final, recorded = self.cache.load(key, graph_id=graph_id, context=context)
        if final is None:
            raise LookupError(probe.reason)
        self.version += 1
        self.graphs.append(record)
        self.stored_keys[graph_id] = key
        record.cache = probe.summary()
        context.notes.extend(recorded.get("notes", []))
        context.notes.append({"pass": None, "topic": "cache", "message": f"rebuilt for a stored capture from "
                              f"{probe.reason} in {probe.seconds * 1e3:.1f} ms: nothing traced, no pass ran"})
        context.tags = set(recorded.get("tags", []))
        record.notes, record.tags = context.notes, sorted(context.tags)
        record.final_code = final.code
        record.metrics = measure_all(self.registry.metrics, final, context)
        record.seconds = time.perf_counter() - start
        self.compile_seconds += record.seconds
        _log_graph(record, self.registry.metrics)
        return final.forward

    def cache_bypass(self) -> str | None:
        """Why this compile must run the passes even when the cache holds the graph (debugging modes
        that observe or limit the passes), or None."""
        if self.plan.verify == "each":
            return "verify: each checks the graph after every pass"
        if self.fuel is not None:
            return "bisect limits the passes' rewrites"
        if os.environ.get("PIPELINE_DUMP_DIR"):
            return "PIPELINE_DUMP_DIR dumps the graph after every pass"
        return None

    def _with_reproducer(self, exc: PassFailure, record: GraphRecord, received: torch.fx.GraphModule,
                         position: int, example_inputs: list, context: PassContext) -> PassFailure:
        """Under ``verify: each``, a pass that raised leaves a reproducer of the graph it received."""
        cause = exc.__cause__
        failure = Failure(kind="exception", exception_type=type(cause or exc).__name__,
                          message=str(cause or exc))
        path = write_reproducer(graph_id=record.graph_id, position=position, plugin=exc.plugin,
                                received=received, args=example_inputs, plan=self.plan, failure=failure,
                                tags=self.tags_before(position), target=context.target, role=record.role)
        record.reproducer = path
        new = PassFailure(f"{exc}. Reproducer: {path}", pass_name=exc.pass_name, plugin=exc.plugin,
                          graph_id=exc.graph_id, reproducer=path)
        new.__cause__ = cause
        return new

    def tags_before(self, position: int) -> list[str]:
        """The invariant tags a graph has when the plan's pass number ``position`` (0 is the capture
        pass) receives it; a reproducer replays that pass with them."""
        tags = set(type(self.capture.instance).provided(self.capture.instance.options))
        for bound in self.graph_passes[:max(position - 1, 0)]:
            cls = type(bound.instance)
            tags = (tags - set(cls.invalidates)) | set(cls.provided(bound.instance.options))
        return sorted(tags)

    def _fail(self, exc: PipelineError, record: GraphRecord, original: torch.fx.GraphModule,
              start: float) -> Callable:
        record.seconds = time.perf_counter() - start
        self.compile_seconds += record.seconds
        if self.plan.on_error == "eager":
            record.fallback = str(exc)
            # What runs is the graph as captured: measure that (no tags: no pass's promise holds).
            record.metrics = measure_all(self.registry.metrics, original,
                                         PassContext(graph_id=record.graph_id, target=self.target_for([]),
                                                     example_inputs=[], role=record.role))
            warnings.warn(f"pipeline: graph {record.graph_id} runs eagerly (plan on_error: eager): {exc}",
                          stacklevel=2)
            return original
        raise exc

    def new_record(self, graph_id: str, role: str, gm: torch.fx.GraphModule) -> GraphRecord:
        """A graph's record, every registered metric at its default until the graph is measured."""
        return GraphRecord(graph_id=graph_id, role=role, nodes_in=len(gm.graph.nodes),
                           metrics=defaults(self.registry.metrics))

    def target_for(self, example_inputs: list) -> str:
        """The plan's target, or for ``auto`` the device of the example inputs (cuda or cpu)."""
        if self.plan.target != "auto":
            return self.plan.target
        for value in example_inputs:
            if isinstance(value, torch.Tensor) and value.device.type == "cuda":
                return "cuda"
        return "cpu"

    def _record_capture(self, gm: torch.fx.GraphModule, graph_id: str) -> None:
        details = compat.capture_details(gm)
        if details is None:
            return
        details["graph"] = graph_id
        self.captures.append(details)
        guards = get_logger("guards")
        if guards.isEnabledFor(logging.INFO):
            guards.info("%s: %d guard(s)", graph_id, len(details["guards"]))
            for guard in details["guards"]:
                guards.debug("%s:   %s %s", graph_id, guard["kind"], guard["source"])

    def break_site(self, reason: str, used: set[int] | None = None) -> dict | None:
        """Where (file, line, code) capture stopped for a graph break with this reason, if a
        captured graph ended there; ``used`` keeps repeated reasons on distinct sites."""
        used = set() if used is None else used
        breaks = [(i, c) for i, c in enumerate(self.captures) if c["graph_break"] and c["where"] and i not in used]
        # Dynamo words some reasons differently in its counter and in the graph it ends (a
        # data-dependent branch: "Data-dependent branching" and "generic_jump ..."): then the
        # earliest graph that ended at a break not matched yet.
        for index, capture in [b for b in breaks if b[1]["reason"] == reason] or breaks[:1]:
            used.add(index)
            return capture["where"][-1]
        return None

    def _collect_graph_breaks(self) -> None:
        now = compat.graph_break_counts()
        logger = get_logger("graph_breaks")
        for reason, count in now.items():
            new = count - self._break_baseline.get(reason, 0)
            if new > 0:
                self.broken_grad_modes.add(torch.is_grad_enabled())
            for _ in range(max(new, 0)):
                self.graph_breaks.append(reason)
                if logger.isEnabledFor(logging.INFO):
                    site = self.break_site(reason)
                    where = f" at {site['file']}:{site['line']}: {site['code']}" if site else ""
                    logger.info("graph break %d%s: %s", len(self.graph_breaks), where,
                                reason.strip().splitlines()[0] if reason.strip() else reason)
        self._break_baseline = now

    # -- after each call ----------------------------------------------------------------------
    def after_call(self) -> None:
        """Pick up graph breaks seen since the last graph and check the plan's expectations.
        Cheap when nothing compiled since the last check; the first call always checks (a call
        whose code Dynamo breaks on before any operation compiles no graph at all)."""
        if self.version == self._checked_version and self._called:
            return
        self._called = True
        self._checked_version = self.version
        self._collect_graph_breaks()
        try:
            self.check_expectations()
        finally:
            self.write_requested_report()

    def after_failure(self) -> None:
        """A call raised: write the requested report of what compiled so far (if anything did)."""
        if self.version != self._reported_version:
            self._collect_graph_breaks()
            self.write_requested_report()

    def write_requested_report(self) -> None:
        """Write the compile report to the requested folder, once per new compile."""
        if self.report_dir is None or self.version == self._reported_version:
            return
        self._reported_version = self.version
        if Compilation.report_writer is None:
            return
        try:
            self.report_path = str(Compilation.report_writer(self, self.report_dir, subfolder=self.report_subfolder))
        except OSError as exc:   # a report must never turn a working call into a failing one
            warnings.warn(f"pipeline: could not write the compile report to {self.report_dir}: {exc}",
                          stacklevel=3)
            return
        get_logger("passes").info("compile report: %s", self.report_path)

    def measurements(self) -> dict:
        """What the engine's ``expect:`` limits are checked against, by expectation key."""
        return {
            "max_graph_breaks": len(self.graph_breaks),
            "max_recompiles": len(self.recompiles) - (self.warmup or {}).get("recompiles", 0),
            "max_compile_seconds": round(self.compile_seconds, 3),
        }

    def expectation_outcomes(self) -> list[Outcome]:
        """Every expectation the plan sets, in the engine's keys and the registered metrics'."""
        expect = self.plan.expect
        out = [Outcome(key, getattr(expect, key), value, value <= getattr(expect, key))
               for key, value in self.measurements().items() if getattr(expect, key) is not None]
        return out + check_limits(self.registry.metrics, expect.limits, self.graphs)

    def check_expectations(self) -> None:
        """Raise :class:`ExpectationError` (or warn, per ``expect.on_miss``) naming every missed
        expectation and the value the compile measured."""
        misses = [o.message() for o in self.expectation_outcomes() if not o.ok]
        if not misses:
            return
        message = f"plan '{self.plan.name}' ({self.plan.source}): " + "; ".join(misses)
        if self.plan.expect.on_miss == "error":
            raise ExpectationError(message)
        warnings.warn(message, stacklevel=3)

    def summary(self) -> dict:
        """A plain-data summary of the compile (the core of the compile report)."""
        return {
            "plan": self.plan.name,
            "graphs": [{**attrs.asdict(r), **r.metrics} for r in self.graphs],   # metrics by name too
            "graph_count": self._graph_count(),
            "graph_breaks": list(self.graph_breaks),
            "recompiles": list(self.recompiles),
            "warmup": self.warmup,
            "compile_seconds": self.compile_seconds,
            "fallbacks": [{"graph": r.graph_id, "reason": r.fallback} for r in self.graphs if r.fallback]
            + list(self.fallbacks),
            "calls": {name: item.counts() for name, item in self.runtime.items() if hasattr(item, "counts")},
        }


def compilation_of(compiled: Any) -> Compilation:
    """The :class:`Compilation` record behind a result of :func:`compile_with_plan`: its plan,
    graphs (with per-pass times and notes), graph breaks, recompiles and fallbacks."""
    found = getattr(compiled, COMPILATION_ATTR, None)
    if found is None:
        raise TypeError(f"{type(compiled).__name__} was not made by compile_with_plan")
    return found


def _log_graph(record: GraphRecord, metrics: dict) -> None:
    """One compiled graph on the passes topic, and on each metric's topics."""
    passes = get_logger("passes")
    if passes.isEnabledFor(logging.INFO):
        for entry in record.passes:
            passes.info("%s %s: %.2f ms, %d -> %d nodes", record.graph_id, entry["pass"],
                        entry["seconds"] * 1e3, entry["nodes_before"], entry["nodes_after"])
    for name, metric in metrics.items():
        if metric.log is not None and name in record.metrics:
            metric.log(record.graph_id, record.metrics[name], record.notes)


__all__ = ["Compilation", "GraphRecord", "REPORT_DIR_ENV", "compilation_of"]
