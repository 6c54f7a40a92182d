"""The compile report: one JSON document per compile (and an HTML page made from it,
:mod:`pipeline.tools.report_html`).

It holds the plan as resolved, each graph's per-pass time and node counts, its source as captured
and after every pass (when sources were recorded: ``report=`` or ``PIPELINE_REPORT_DIR``), graph
breaks with their source lines, guards and recompiles with the failing guard, fusion groups and
the reasons candidates were rejected, kernels with their source, extern calls, CUDA-graph status
with skip reasons, cache hits and misses, every expectation with its measured value, and for
training, the tensors each forward saves for its backward (``saved_tensors`` of the backward
graph; ``summary.saved_bytes`` over all of them, ``summary.activation_bytes`` without the inputs
of the compiled region, which the caller holds anyway).

Passes feed it through :meth:`pipeline.PassContext.note`: notes with ``topic="fusion"``,
``"cache"`` or ``"cudagraphs"`` land in those sections (a note that does not say its topic but
reads like a cache outcome, ``cache hit`` or ``(compiled)``, is filed under cache too).
"""
from __future__ import annotations

import datetime
import itertools
import json
import os
import re
from pathlib import Path
from typing import Any

from pipeline import compat
from pipeline.options import unstructure
from pipeline.compilation import Compilation, compilation_of
from pipeline.plan.text import resolve_text
from pipeline.tools.report_html import render_html

FORMAT = "pipeline-compile-report/1"
_CACHE_WORDS = re.compile(r"cache hit|cache miss|\(compiled\)", re.IGNORECASE)
_sequence = itertools.count(1)


def build_report(compilation: Any) -> dict:
    """The report of a :class:`pipeline.compilation.Compilation` as plain, JSON-ready data."""
    plan = compilation.plan
    bound = [compilation.capture, *compilation.graph_passes]
    plugins = {b.name: str(b.plugin) for b in bound}
    metrics = compilation.registry.metrics
    graphs = [_graph_report(record, plugins, metrics) for record in compilation.graphs]
    totals = {name: m.total([r.metrics[name] for r in compilation.graphs if name in r.metrics])
              for name, m in metrics.items() if m.total is not None}
    used: set[int] = set()
    breaks = []
    for index, reason in enumerate(compilation.graph_breaks):
        site = compilation.break_site(reason, used) or {}
        lines = reason.strip().splitlines()
        breaks.append({"number": index + 1, "summary": lines[0] if lines else reason, "reason": reason,
                       "file": site.get("file"), "line": site.get("line"), "code": site.get("code")})
    return {
        "format": FORMAT,
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "torch": compat.TORCH_VERSION,
        "plan": {
            "name": plan.name,
            "source": plan.source,
            "lineage": list(plan.lineage),
            "yaml": resolve_text(plan),
            "passes": [{"name": b.name, "plugin": plugins[b.name], "options": unstructure(b.instance.options)}
                       for b in bound],
        },
        "summary": {
            "graphs": len({g["id"].split(".")[0] for g in graphs}),
            "compiled_graphs": len(graphs),
            "graph_breaks": len(breaks),
            "recompiles": len(compilation.recompiles),
            **totals,      # sums over graphs of the registered metrics that have one (kernels)
            "compile_seconds": compilation.compile_seconds,
            "fallbacks": sum(1 for g in graphs if g["fallback"]) + len(compilation.fallbacks),
            "cache_hits": sum(1 for g in graphs if g["compile_cache"].get("status") == "hit"),
            "cache_misses": sum(1 for g in graphs if g["compile_cache"].get("status") == "miss"),
            "saved_bytes": sum(g["saved_tensors"]["total_bytes"] for g in graphs if g["saved_tensors"]),
            "activation_bytes": sum(g["saved_tensors"]["activation_bytes"] for g in graphs if g["saved_tensors"]),
            "verify": plan.verify,
            "sources_recorded": compilation.record_sources,
        },
        "graph_breaks": breaks,
        "recompiles": [{"number": i + 1, "reason": r} for i, r in enumerate(compilation.recompiles)],
        # Calls that run eagerly for a reason that is no single graph's (a hit recompile limit).
        "fallbacks": list(compilation.fallbacks),
        "warmup": compilation.warmup,   # what warm-up of the plan's shape buckets compiled, or null
        "captures": [{"graph": c["graph"], "ended_by": "graph break" if c["graph_break"] else c["reason"],
                      "where": c["where"], "guards": c["guards"], "inputs": c["inputs"]}
                     for c in compilation.captures],
        "graphs": graphs,
        # Time per call of each kernel and extern call, when pipeline.profile ran the model.
        "profile": getattr(compilation, "profile_data", None),
        "expectations": expectation_results(compilation),
        # Report-page sections the registered metrics add: id -> (title, metric name).
        "metric_sections": {sid: [title, name] for name, m in metrics.items() for sid, (title, _) in m.sections.items()},
        "metric_totals": sorted(totals),
    }


def _graph_report(record: Any, plugins: dict, metrics: dict) -> dict:
    notes = [{"topic": "passes", **n} for n in record.notes]
    cache = [n for n in notes if n["topic"] == "cache" or (n["topic"] == "passes" and _CACHE_WORDS.search(n["message"]))]
    entry = {
        "id": record.graph_id,
        "role": record.role,
        "nodes_in": record.nodes_in,
        "seconds": record.seconds,
        "verified": record.verified,
        "fallback": record.fallback,
        "reproducer": record.reproducer,
        "tags": list(record.tags),
        "passes": [{**p, "plugin": plugins.get(p["pass"], "?")} for p in record.passes],
        "sources": list(record.sources),
        "final_code": record.final_code,
        "notes": notes,
        "cache": cache,
        # The compiled-graph cache's outcome: status hit/miss/uncacheable/bypassed/off, key, reason.
        "compile_cache": dict(getattr(record, "cache", {}) or {}),
        # Backward graphs: the tensors their forward saved for them (name, shape, dtype, bytes).
        "saved_tensors": record.saved,
    }
    for name, metric in metrics.items():   # what the passes' registered metrics measured
        if name in record.metrics:
            entry.update(metric.report_entry(record.metrics[name], notes))
    return entry


def expectation_results(compilation: Any) -> list[dict]:
    """Every expectation the plan sets, its limit, the measured value and whether it holds."""
    return [o.to_data() for o in compilation.expectation_outcomes()]


def compile_report(compiled: Any) -> dict:
    """The compile report of a model or function made by :func:`pipeline.compile_with_plan`
    (graph sources per pass are included when it was compiled with ``report=`` or
    ``PIPELINE_REPORT_DIR``)."""
    return build_report(compilation_of(compiled))


def write_report(target: Any, directory: str | os.PathLike, *, subfolder: bool = False) -> Path:
    """Write ``report.json`` and ``report.html`` for a compiled model (or its Compilation) into
    ``directory`` (into a new ``<plan>-<pid>-<n>`` folder inside it with ``subfolder``); returns
    the folder written."""
    compilation = target
    if not hasattr(target, "graph_passes"):
            compilation = compilation_of(target)
    folder = Path(directory)
    if subfolder:
        if compilation.report_folder is None:
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", compilation.plan.name)
            compilation.report_folder = folder / f"{safe}-{os.getpid()}-{next(_sequence)}"
        folder = compilation.report_folder
    folder.mkdir(parents=True, exist_ok=True)
    report = build_report(compilation)
    (folder / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (folder / "report.html").write_text(render_html(report))
    return folder


__all__ = ["build_report", "compile_report", "write_report", "expectation_results", "FORMAT"]

Compilation.report_writer = write_report   # PIPELINE_REPORT_DIR and report= write through it
