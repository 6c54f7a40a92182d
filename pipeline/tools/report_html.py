"""The compile report as one self-contained HTML page (no scripts, no external files): every
section is plain HTML with inline CSS, long texts fold into ``<details>``. Built with string
templates and :func:`html.escape`, so the core import path needs no template engine."""
from __future__ import annotations

import difflib
import json
from html import escape
from typing import Any, Iterable

from pipeline.registry import get_registry

#: The engine's section ids, in page order, with their headings (tests and links rely on the
#: ids). The sections of registered metrics (``Metric.sections``: fusion, kernels, extern calls,
#: CUDA graphs for the built-in passes) come after ``guards``.
SECTIONS = {
    "summary": "Summary",
    "expectations": "Expectations",
    "plan": "Plan as resolved",
    "pass-times": "Per-pass time",
    "graph-breaks": "Graph breaks",
    "guards": "Guards and recompiles",
    "cache": "Cache",
    "saved-tensors": "Saved for backward",
    "profile": "Profile per call",
    "graphs": "Graphs before and after each pass",
}

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
header{background:#1d3557;color:#fff;padding:14px 24px}
header h1{margin:0;font-size:20px} header p{margin:4px 0 0;opacity:.85}
nav{padding:8px 24px;background:#e8ecf2;position:sticky;top:0;z-index:1;display:flex;flex-wrap:wrap;gap:4px 14px}
nav a{color:#1d3557;text-decoration:none;white-space:nowrap}
main{padding:8px 24px 40px}
section{background:#fff;border:1px solid #d8dde5;border-radius:6px;margin:14px 0;padding:10px 16px}
h2{font-size:17px;margin:4px 0 10px;color:#1d3557} h3{font-size:15px;margin:12px 0 6px}
table{border-collapse:collapse;margin:4px 0 8px} th,td{border-bottom:1px solid #e3e7ed;padding:3px 10px;
text-align:left;vertical-align:top} th{background:#f0f3f7}
td.num{text-align:right;font-variant-numeric:tabular-nums} td.nowrap{white-space:nowrap}
pre{background:#0f1720;color:#e6edf3;padding:8px 10px;border-radius:4px;overflow:auto;max-height:480px;
font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;background:#eef1f5;padding:0 3px;border-radius:3px}
.cards{display:flex;flex-wrap:wrap;gap:10px} .card{border:1px solid #d8dde5;border-radius:6px;padding:6px 14px;
min-width:110px} .card b{display:block;font-size:20px}
.ok{color:#1a7f37;font-weight:600} .bad{color:#cf222e;font-weight:600} .muted{color:#6b7480}
.bar{display:inline-block;height:9px;background:#457b9d;border-radius:2px;vertical-align:middle}
details{margin:4px 0} summary{cursor:pointer}
.diff-add{color:#7ee787} .diff-del{color:#ffa198}
"""


def page_sections(report: dict) -> dict:
    """Section id -> (title, renderer) in page order: the engine's, with those of the metrics the
    report names (looked up in the registry) after ``guards``."""
    metrics = get_registry().metrics
    extra = {}
    for sid, (title, name) in report.get("metric_sections", {}).items():
        metric = metrics.get(name)
        if metric is not None and sid in metric.sections:
            extra[sid] = (title, metric.sections[sid][1])
    engine = [(key, (title, _RENDERERS[key])) for key, title in SECTIONS.items()]
    cut = list(SECTIONS).index("guards") + 1
    return dict(engine[:cut] + list(extra.items()) + engine[cut:])


def render_html(report: dict) -> str:
    """The page for a report made by :func:`pipeline.tools.report.build_report`."""
    plan = report["plan"]
    sections = page_sections(report)
    body = "".join(_section(key, title, render(report)) for key, (title, render) in sections.items())
    nav = "".join(f'<a href="#{key}">{escape(title)}</a>' for key, (title, _) in sections.items())
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>Compile report: {escape(plan['name'])}</title><style>{_CSS}</style></head><body>"
            f"<header><h1>Compile report: plan {escape(plan['name'])}</h1>"
            f"<p>{escape(str(plan['source'] or 'built in'))} &middot; torch {escape(report['torch'])} &middot; "
            f"{escape(report['created'])}</p></header><nav>{nav}</nav><main>{body}</main></body></html>")


def _section(key: str, title: str, content: str) -> str:
    return f'<section id="{key}"><h2>{escape(title)}</h2>{content}</section>'


def table(headers: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    """A table; cells are already-escaped HTML."""
    rows = list(rows)
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def pre(text: str) -> str:
    return f"<pre>{escape(text)}</pre>"


def none(what: str) -> str:
    return f'<p class="muted">{escape(what)}</p>'


def _where(file: Any, line: Any) -> str:
    return f"<code>{escape(str(file))}:{escape(str(line))}</code>" if file else '<span class="muted">unknown</span>'


# -- sections ------------------------------------------------------------------------------------
def _summary(report: dict) -> str:
    s = report["summary"]
    cards = [("graphs", s["graphs"]), ("graph breaks", s["graph_breaks"]), ("recompiles", s["recompiles"]),
             *((name, s[name]) for name in report.get("metric_totals", ())),
             ("compile time", f"{s['compile_seconds']:.3f} s"),
             ("fallbacks", s["fallbacks"]), ("verify", s["verify"])]
    html = '<div class="cards">' + "".join(
        f'<div class="card"><b>{escape(str(v))}</b>{escape(k)}</div>' for k, v in cards) + "</div>"
    if not s["sources_recorded"]:
        html += none("Graph sources per pass were not recorded (compile with report= or set "
                      "PIPELINE_REPORT_DIR to keep them).")
    return html


def _expectations(report: dict) -> str:
    rows = [(f"<code>expect.{escape(e['key'])}</code>", escape(str(e["limit"])), escape(str(e["measured"])),
             '<span class="ok">met</span>' if e["ok"] else '<span class="bad">missed</span>')
            for e in report["expectations"]]
    return table(["expectation", "limit", "measured", "result"], rows) if rows else none("The plan sets no expectations.")


def _plan(report: dict) -> str:
    rows = [(f"{i}", f"<code>{escape(p['name'])}</code>", escape(p["plugin"]),
             f"<code>{escape(json.dumps(p['options']))}</code>" if p["options"] else "")
            for i, p in enumerate(report["plan"]["passes"])]
    return table(["#", "pass", "plugin", "options"], rows) + pre(report["plan"]["yaml"])


def _pass_times(report: dict) -> str:
    out = []
    for graph in report["graphs"]:
        longest = max([p["seconds"] for p in graph["passes"]] or [0]) or 1
        rows = [(f"<code>{escape(p['pass'])}</code>", escape(p["plugin"]),
                 f'<span class="bar" style="width:{int(120 * p["seconds"] / longest)}px"></span>',
                 f'{p["seconds"] * 1e3:.2f}', f'{p["nodes_before"]} &rarr; {p["nodes_after"]}')
                for p in graph["passes"]]
        cache = graph.get("compile_cache") or {}
        if cache.get("status") == "hit":
            html = none(f"Rebuilt from the compile cache (entry {cache.get('key')}, "
                        f"{cache.get('seconds', 0) * 1e3:.1f} ms): no pass ran.")
        else:
            html = table(["pass", "plugin", "", "ms", "nodes"], rows)
        out.append(f"<h3>{escape(graph['id'])} ({escape(graph['role'])}, {graph['seconds'] * 1e3:.1f} ms, "
                   f"verify: {escape(graph['verified'])})</h3>" + html)
        if graph["fallback"]:
            out.append(f'<p class="bad">runs eagerly: {escape(graph["fallback"])}</p>')
        if graph["reproducer"]:
            out.append(f"<p>reproducer: <code>{escape(graph['reproducer'])}</code></p>")
    return "".join(out) or none("No graph was compiled.")


def _graph_breaks(report: dict) -> str:
    rows = [(str(b["number"]), _where(b["file"], b["line"]), f"<code>{escape(b['code'] or '')}</code>",
             f"<details><summary>{escape(b['summary'])}</summary>{pre(b['reason'])}</details>")
            for b in report["graph_breaks"]]
    return table(["#", "where", "source line", "reason"], rows) if rows else none("No graph breaks.")


def _guards(report: dict) -> str:
    rows = [(str(r["number"]), f"<code>{escape(r['reason'])}</code>") for r in report["recompiles"]]
    html = "<h3>Recompiles (the guard that failed)</h3>" + (
        table(["#", "failing guard"], rows) if rows else none("No recompiles."))
    for fallback in report.get("fallbacks", []):
        html += f'<p class="bad">runs eagerly: {escape(fallback["reason"])}</p>'
    html += "<h3>Guards per captured graph</h3>"
    if not report["captures"]:
        return html + none("No guards recorded (the capture frontend does not use Dynamo guards).")
    for capture in report["captures"]:
        inputs = [(f"<code>{escape(i['source'])}</code>", escape(str(i.get("shape", i.get("symbol", "")))),
                   escape(i.get("dtype", "")), "dynamic" if i.get("dynamic") else "")
                  for i in capture["inputs"]]
        guards = "\n".join(f"{g['kind']:<28} {g['source']}" for g in capture["guards"])
        html += (f"<details><summary>{escape(capture['graph'])}: {len(capture['guards'])} guards, "
                 f"ended by {escape(capture['ended_by'].splitlines()[0] if capture['ended_by'] else '?')}</summary>"
                 + table(["input", "shape", "dtype", ""], inputs) + pre(guards) + "</details>")
    return html


def _cache(report: dict) -> str:
    rows = [(escape(g["id"]), f"<code>{escape(str(n.get('pass')))}</code>", escape(n["message"]))
            for g in report["graphs"] for n in g["cache"]]
    return table(["graph", "pass", "outcome"], rows) if rows else none("No cache lookups recorded.")


def _saved_tensors(report: dict) -> str:
    html = ""
    for graph in report["graphs"]:
        saved = graph.get("saved_tensors")
        if not saved:
            continue
        rows = [(f"<code>{escape(t['name'])}</code>", escape(str(t["shape"])), escape(t["dtype"]),
                 f'<span class="num">{t["bytes"]}</span>', "input" if t["input"] else "activation")
                for t in saved["tensors"]]
        html += (f"<h3>{escape(graph['id'])}: {len(saved['tensors'])} tensor(s), {saved['total_bytes']} bytes "
                 f"({saved['activation_bytes']} of activations)"
                 f"{', ' + str(saved['symints']) + ' SymInt(s)' if saved['symints'] else ''}</h3>"
                 + table(["name", "shape", "dtype", "bytes", "kind"], rows))
    return html or none("No backward graph in this compile.")


def _graphs(report: dict) -> str:
    html = ""
    for graph in report["graphs"]:
        html += f"<h3>{escape(graph['id'])} ({escape(graph['role'])})</h3>"
        previous = None
        for stage in graph["sources"]:
            title = "as captured" if stage["stage"] == "captured" else f"after {stage['stage']}"
            diff = ""
            if previous is not None:
                lines = list(difflib.unified_diff(previous.splitlines(), stage["code"].splitlines(), lineterm="", n=1))[2:]
                diff = ("<details><summary>changes</summary><pre>" + "\n".join(
                    f'<span class="diff-{"add" if l.startswith("+") else "del"}">{escape(l)}</span>'
                    if l[:1] in "+-" else escape(l) for l in lines) + "</pre></details>") if lines else none("unchanged")
            html += f"<details><summary>{escape(title)}</summary>{diff}{pre(stage['code'])}</details>"
            previous = stage["code"]
        if not graph["sources"]:
            html += "<details><summary>final graph</summary>" + pre(graph["final_code"]) + "</details>"
    return html or none("No graph was compiled.")


def _profile(report: dict) -> str:
    profile = report.get("profile")
    if not profile:
        return none("Not profiled: pipeline.profile(model, *inputs, report=folder) or `pipeline profile` adds "
                    "this section.")
    rows = [[f"{u['share']:.1%}", f"{u['ms']:.4f}", escape(u["kind"]), escape(u["name"]), escape(u["group"] or ""),
             "<br>".join(escape(line) for line in u["source"]) or none("no source line")]
            for u in profile["units"]]
    return (f"<p>{profile['total_ms']:.3f} ms per call ({escape(profile['time'])}, {profile['calls']} calls profiled)</p>"
            + table(["share", "ms per call", "kind", "name", "fused group", "source lines"], rows))


_RENDERERS = {
    "summary": _summary, "expectations": _expectations, "plan": _plan, "pass-times": _pass_times,
    "graph-breaks": _graph_breaks, "guards": _guards, "cache": _cache,
    "saved-tensors": _saved_tensors, "profile": _profile, "graphs": _graphs,
}

__all__ = ["render_html", "page_sections", "SECTIONS", "table", "pre", "none"]
