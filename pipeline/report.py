"""The compile report: one JSON document per compile (and an HTML page made from it,
:mod:`pipeline.report_html`).

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

from . import compat
from .options import unstructure
from .plan_text import resolve_text

FORMAT = "pipeline-compile-report/1"
_CACHE_WORDS = re.compile(r"cache hit|cache miss|\(compiled\)", re.IGNORECASE)
_sequence = itertools.count(1)


def build_report(compilation: Any) -> dict:
    """The report of a :class:`pipeline.compilation.Compilation` as plain, JSON-ready data."""
    plan = compilation.plan
    bound = [compilation.capture, *compilation.graph_passes]
    plugins = {b.name: str(b.plugin) for b in bound}
    graphs = [_graph_report(record, plugins) for record in compilation.graphs]
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
            "kernels": sum(g["kernel_count"] for g in graphs),
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
        "expectations": expectation_results(compilation),
    }


def _graph_report(record: Any, plugins: dict) -> dict:
    contents = record.contents or {"kernels": [], "eager_groups": [], "extern_calls": {}}
    notes = [{"topic": "passes", **n} for n in record.notes]

    def topic(name: str) -> list[dict]:
        return [n for n in notes if n["topic"] == name]

    cache = [n for n in notes if n["topic"] == "cache" or (n["topic"] == "passes" and _CACHE_WORDS.search(n["message"]))]
    groups = [{k: v for k, v in g.items() if k != "source"} for g in contents["kernels"] + contents["eager_groups"]]
    return {
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
        "fusion": {"groups": groups, "decisions": topic("fusion")},
        "kernel_count": record.kernels,
        "kernels": contents["kernels"],
        "eager_groups": contents["eager_groups"],
        "extern_calls": contents["extern_calls"],
        "cudagraphs": {"wrapped": record.cudagraphs, "reasons": [n["message"] for n in topic("cudagraphs")]},
        "cache": cache,
        # The compiled-graph cache's outcome: status hit/miss/uncacheable/bypassed/off, key, reason.
        "compile_cache": dict(getattr(record, "cache", {}) or {}),
        # Backward graphs: the tensors their forward saved for them (name, shape, dtype, bytes).
        "saved_tensors": record.saved,
    }


def expectation_results(compilation: Any) -> list[dict]:
    """Every expectation the plan sets, its limit, the measured value and whether it holds."""
    expect = compilation.plan.expect
    out = []
    for key, value in compilation.measurements().items():
        limit = getattr(expect, key)
        if limit is not None:
            out.append({"key": key, "limit": limit, "measured": value, "ok": value <= limit})
    if expect.cudagraphs is not None:
        wrapped = [r.cudagraphs for r in compilation.graphs]
        ok = all(wrapped) if expect.cudagraphs == "full" else any(wrapped)
        out.append({"key": "cudagraphs", "limit": expect.cudagraphs,
                    "measured": f"{sum(wrapped)} of {len(wrapped)} graphs", "ok": ok or not wrapped})
    return out


def compile_report(compiled: Any) -> dict:
    """The compile report of a model or function made by :func:`pipeline.compile_with_plan`
    (graph sources per pass are included when it was compiled with ``report=`` or
    ``PIPELINE_REPORT_DIR``)."""
    from .api import compilation_of
    return build_report(compilation_of(compiled))


def write_report(target: Any, directory: str | os.PathLike, *, subfolder: bool = False) -> Path:
    """Write ``report.json`` and ``report.html`` for a compiled model (or its Compilation) into
    ``directory`` (into a new ``<plan>-<pid>-<n>`` folder inside it with ``subfolder``); returns
    the folder written."""
    from .report_html import render_html
    compilation = target
    if not hasattr(target, "graph_passes"):
        from .api import compilation_of
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
