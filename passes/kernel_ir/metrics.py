"""The metrics the kernel IR gives every compiled graph: ``kernels`` (how many generated kernels
it calls, limited by the plan's ``expect.max_kernels``) and ``contents`` (its kernels with their
source, the fused groups left to run eagerly, and its extern calls), with their log lines and
compile-report sections."""
from __future__ import annotations

import logging
from html import escape

import attrs

from pipeline import Metric, get_logger
from pipeline.metrics import Outcome
from pipeline.options import non_negative, option
from pipeline.tools.report_html import none, pre, table

from .contents import graph_contents
from .groups import count_kernels


@attrs.frozen
class KernelLimits:
    max_kernels: int | None = option(None, "Most generated kernels over all graphs (null: no limit).",
                                     check=non_negative)


def _check_kernels(limits: KernelLimits, values: list) -> list[Outcome]:
    if limits.max_kernels is None:
        return []
    total = sum(values)
    return [Outcome("max_kernels", limits.max_kernels, total, total <= limits.max_kernels)]


def _contents_entry(contents: dict, notes: list) -> dict:
    contents = contents or {"kernels": [], "eager_groups": [], "extern_calls": {}}
    groups = [{k: v for k, v in g.items() if k != "source"} for g in contents["kernels"] + contents["eager_groups"]]
    return {"fusion": {"groups": groups, "decisions": [n for n in notes if n.get("topic") == "fusion"]},
            "kernels": contents["kernels"], "eager_groups": contents["eager_groups"],
            "extern_calls": contents["extern_calls"]}


def _log_contents(graph_id: str, contents: dict, notes: list) -> None:
    fusion = get_logger("fusion")
    if fusion.isEnabledFor(logging.INFO):
        for group in contents["kernels"] + contents["eager_groups"]:
            fusion.info("%s group %s (%s, domain %s): %s", graph_id, group["name"], group["kind"],
                        group["domain"], ", ".join(group["ops"]))
    codegen = get_logger("codegen")
    if codegen.isEnabledFor(logging.INFO):
        for kernel in contents["kernels"]:
            codegen.info("%s kernel %s (%s, %d ops)", graph_id, kernel["kernel"], kernel["backend"], len(kernel["ops"]))
            codegen.debug("%s kernel %s source:\n%s", graph_id, kernel["kernel"], kernel["source"])
        for group in contents["eager_groups"]:
            codegen.info("%s group %s has no kernel (runs eagerly)", graph_id, group["name"])


def _fusion_section(report: dict) -> str:
    html = ""
    for graph in report["graphs"]:
        fusion = graph.get("fusion", {"groups": [], "decisions": []})
        rows = [(f"<code>{escape(g['name'])}</code>", escape(g["kind"]), f"<code>{escape(' x '.join(g['domain']))}</code>",
                 escape(", ".join(g["ops"]))) for g in fusion["groups"]]
        decisions = "".join(f"<li>{escape(n['message'])}</li>" for n in fusion["decisions"])
        state = " open" if len(fusion["decisions"]) <= 12 else ""
        if rows or decisions:
            html += (f"<h3>{escape(graph['id'])}</h3>" + (table(["group", "kind", "domain", "ops"], rows) if rows
                                                         else none("No fused groups."))
                     + (f"<details{state}><summary>{len(fusion['decisions'])} decisions and rejected "
                        f"candidates</summary><ul>{decisions}</ul></details>" if decisions else ""))
    return html or none("No fusion in this compile.")


def _kernels_section(report: dict) -> str:
    html = ""
    for graph in report["graphs"]:
        for k in graph.get("kernels", []):
            html += (f"<details><summary><code>{escape(k['kernel'])}</code> ({escape(graph['id'])}, {escape(k['backend'])}, "
                     f"{escape(k['kind'])}, {len(k['ops'])} ops: {escape(', '.join(k['ops']))})</summary>"
                     f"{pre(k['source'])}</details>")
        for g in graph.get("eager_groups", []):
            html += f"<p>{escape(graph['id'])}: group <code>{escape(g['name'])}</code> has no kernel (runs eagerly)</p>"
    return html or none("No generated kernels.")


def _extern_calls_section(report: dict) -> str:
    rows = [(escape(graph["id"]), f"<code>{escape(op)}</code>", f'<span class="num">{count}</span>')
            for graph in report["graphs"] for op, count in graph.get("extern_calls", {}).items()]
    return table(["graph", "operator", "calls"], rows) if rows else none("No extern calls.")


KERNELS = Metric(name="kernels", doc="Generated kernels the graph calls (also inside CUDA-graph runners).",
                 measure=lambda gm, context: count_kernels(gm), limits=KernelLimits, check=_check_kernels,
                 total=sum, report=lambda value, notes: {"kernel_count": value}, default=0)

CONTENTS = Metric(name="contents", doc="The graph's kernels (with source), fused groups left eager and extern calls.",
                  measure=lambda gm, context: graph_contents(gm), report=_contents_entry, log=_log_contents,
                  sections={"fusion": ("Fusion decisions", _fusion_section), "kernels": ("Kernels", _kernels_section),
                            "extern-calls": ("Extern calls", _extern_calls_section)},
                  default={"kernels": [], "eager_groups": [], "extern_calls": {}})

METRICS = [KERNELS, CONTENTS]
