"""Training graphs in a plan with a split pass (a :class:`~pipeline.graph_pass.SplitPass` such as
``partition``): AOTAutograd traces the joint forward+backward graph and, from inside its partition
hook, hands it here. The plan's passes before the split pass run on the joint graph (role
``joint``), the split pass turns it into a forward and a backward graph, and AOTAutograd then
hands each half to :meth:`Compilation.compile_graph`'s compilers, which run the passes after the
split (roles ``forward`` and ``backward``).

The joint graph is recorded as ``gN.joint``. It is never called, so ``verify`` does not compare
it with eager: the halves are compared with what the split produced, and the tests compare loss
and gradients with eager. The instrumentation hooks (``pipeline_before_pass`` /
``pipeline_after_pass``) see the joint passes; the split pass, which takes one graph and gives
two, is timed and recorded but not passed to those hooks.

The split is cached like a compiled graph (docs/caching.md): keyed on the joint graph as
AOTAutograd traced it and on the passes up to the split pass, one entry per half. On a hit no
joint pass runs; the halves' metadata, which AOTAutograd reads after its partitioner, is
restored by fake-tensor propagation from the input shapes the entry records.
"""
from __future__ import annotations

import os
import time
import warnings
from typing import Any

import attrs
import torch.fx

from pipeline import compat
from pipeline.record import GraphRecord
from pipeline.errors import PassFailure, PipelineError
from pipeline.graph_pass import JointGraph, PassContext
from pipeline.instruments import GraphSources, PassTimer, SourceDump, copy_graph
from pipeline.manager import BoundPass, PassManager


def split_training_graph(compilation: Any, joint: JointGraph, passes: list[BoundPass], split: BoundPass,
                         graph_id: str, joint_tags: dict) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """Run ``passes`` on the joint graph, then ``split``; return (forward, backward) and leave the
    tags the joint graph ended with in ``joint_tags["tags"]`` for the halves' compiles. Under
    ``on_error: eager`` a failure falls back to torch's default partition of the joint graph as
    AOTAutograd traced it."""
    start = time.perf_counter()
    plan = compilation.plan
    module = joint.module
    record = compilation.new_record(graph_id, "joint", module)
    if plan.verify != "off":
        record.verified = "not run: a joint graph is checked through its forward and backward halves"
    compilation.graphs.append(record)
    names = [n.name for n in module.graph.nodes if n.op == "placeholder"]
    original = copy_graph(module) if plan.on_error == "eager" else None
    context = PassContext(graph_id=graph_id, target=compilation.target_for(joint.example_inputs),
                          example_inputs=joint.example_inputs, cache=plan.cache, role="joint",
                          tags=compilation.capture_tags(), fuel=compilation.fuel, record=record)
    instruments: list = [PassTimer(record)]
    if compilation.record_sources:
        instruments.append(GraphSources(record))
    if os.environ.get("PIPELINE_DUMP_DIR"):
        instruments.append(SourceDump(os.environ["PIPELINE_DUMP_DIR"]))
    manager = PassManager(passes, registry=compilation.registry,
                          plugin_manager=compilation.registry.plugin_manager(instruments),
                          check_invariants=plan.verify != "off")
    probes, cached = _cached_halves(compilation, joint, [compilation.capture, *passes, split], graph_id,
                                    context.target)
    record.cache = probes[0].summary()
    if cached is not None:
        halves, recorded = cached
        joint_tags["tags"] = set(recorded.get("tags", []))
        context.tags = set(joint_tags["tags"])
        context.notes.append({"pass": None, "topic": "cache", "message":
                              "cache hit: forward and backward rebuilt from the cache, no joint pass ran"})
        record.notes, record.tags = context.notes, sorted(context.tags)
        record.seconds = time.perf_counter() - start
        compilation.compile_seconds += record.seconds
        return halves
    try:
        graph = manager.run(module, context)
        # Re-tracing passes rename placeholders (arg0_1, ...); the joint's calling convention
        # names them primals_N / tangents_N, which torch's partitioners rely on.
        compat.rename_placeholders(graph, names)
        halves = _run_split(split, attrs.evolve(joint, module=graph), context, record,
                            compilation.record_sources)
        joint_tags["tags"] = set(context.tags)
        _store_halves(compilation, probes, halves, context)
        record.cache = probes[0].summary()
    except PipelineError as exc:
        if plan.on_error != "eager" or original is None:
            raise
        record.fallback = str(exc)
        warnings.warn(f"pipeline: graph {graph_id} is split by torch's default partitioner (plan on_error: "
                      f"eager): {exc}", stacklevel=2)
        halves = compat.torch_partition(original, joint.example_inputs, num_primals=joint.num_primals,
                                        num_forward_outputs=joint.num_forward_outputs, strategy="default")
        joint_tags["tags"] = compilation.capture_tags()
    finally:
        record.notes = context.notes
        record.tags = sorted(context.tags)
        record.seconds = time.perf_counter() - start
        compilation.compile_seconds += record.seconds
    return halves


def _cached_halves(compilation: Any, joint: JointGraph, passes: list[BoundPass], graph_id: str,
                   target: str) -> tuple[list, tuple | None]:
    """Probes of the cache entries holding this joint graph's split (one per half, keyed on the
    joint graph as captured and on every pass up to the split) and, when both are there, the
    halves with their metadata restored and what the compile that stored them recorded."""
    probes, found = [], []
    for half in ("forward", "backward"):
        probe, graph, recorded = compilation.cache.lookup(
            joint.module, joint.example_inputs, plan=compilation.plan, passes=passes, role=f"joint-{half}",
            target=target, graph_id=f"{graph_id} ({half})", bypass=compilation.cache_bypass())
        probes.append(probe)
        found.append((graph, recorded))
    if any(graph is None for graph, _ in found):
        return probes, None
    try:
        for graph, recorded in found:
            compat.propagate_metadata(graph, recorded["inputs"], joint.example_inputs)
    except Exception as exc:  # noqa: BLE001 - an entry that cannot be restored here is compiled again
        for probe in probes:
            probe.status, probe.reason = "miss", f"entry could not be restored: {type(exc).__name__}: {exc}"
        return probes, None
    return probes, ((found[0][0], found[1][0]), found[0][1])


def _store_halves(compilation: Any, probes: list, halves: tuple, context: PassContext) -> None:
    """Store each half of a split made on a cache miss (static shapes only: the entry records its
    inputs' shapes to restore the metadata AOTAutograd reads)."""
    for probe, graph in zip(probes, halves):
        inputs = compat.static_tensor_metadata(graph)
        if inputs is None:
            probe.reason = "not stored: a joint split with symbolic sizes or non-tensor inputs is not cached"
            continue
        compilation.cache.store(probe, graph, target=context.target,
                                record={"tags": sorted(context.tags), "inputs": inputs})


def _run_split(split: BoundPass, joint: JointGraph, context: PassContext, record: GraphRecord,
               record_sources: bool) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """Call the split pass with the same checks the pass manager applies to a graph pass."""
    cls = type(split.instance)
    context.current_pass = split.name

    def failure(message: str) -> PassFailure:
        return PassFailure(f"pass '{split.name}' from plugin {split.plugin} {message}", pass_name=split.name,
                           plugin=str(split.plugin), graph_id=context.graph_id)

    missing = set(cls.requires) - context.tags
    if missing:
        raise failure(f"requires {', '.join(sorted(missing))} but the graph {context.graph_id} only has "
                      f"{', '.join(sorted(context.tags)) or 'no tags'}")
    nodes_before = len(joint.module.graph.nodes)
    started = time.perf_counter()
    try:
        result = split.instance.split(joint, context)
    except PipelineError:
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised naming the pass and its plugin
        raise failure(f"failed on graph {context.graph_id}: {type(exc).__name__}: {exc}") from exc
    if not (isinstance(result, tuple) and len(result) == 2
            and all(isinstance(g, torch.fx.GraphModule) for g in result)):
        raise failure(f"returned {type(result).__name__}, not a (forward, backward) pair of GraphModules")
    for half, graph in zip(("forward", "backward"), result):
        try:
            graph.graph.lint()
        except Exception as exc:  # noqa: BLE001 - a malformed graph is the pass's fault
            raise failure(f"produced a malformed {half} graph: {exc}") from exc
    record.passes.append({"pass": split.name, "seconds": time.perf_counter() - started,
                          "nodes_before": nodes_before,
                          "nodes_after": sum(len(g.graph.nodes) for g in result)})
    if record_sources:
        for half, graph in zip(("forward", "backward"), result):
            record.sources.append({"stage": f"{split.name} ({half})", "code": graph.code})
    context.tags -= set(cls.invalidates)
    context.tags |= set(cls.provided(split.instance.options))
    context.current_pass = None
    return result
