"""``explain(model, *inputs, plan=..., overrides=..., **keyword_inputs)``: compile a model under a plan, call it once, and say what
happened: how many graphs, which graph breaks (with reasons and source lines), which kernels,
what extern calls remain, and which input changes would recompile."""
from __future__ import annotations

from typing import Any

import attrs

from pipeline.api import compilation_of, compile_with_plan
from pipeline.tools.report import build_report

# Guard sources of parameters and buffers: they change only if the model itself changes.
_STATE = ("._parameters[", "._buffers[")


@attrs.frozen
class Explanation:
    """What compiling and calling a model under a plan did; ``str()`` gives a readable summary
    and ``report`` the full compile report (see :func:`pipeline.compile_report`)."""

    plan: str
    graph_count: int
    graph_breaks: list[dict]
    kernels: list[dict]
    extern_calls: dict[str, int]
    recompiles: list[str]
    expected_recompiles: list[str]
    report: dict = attrs.field(repr=False)
    cache: list[dict] = attrs.field(factory=list)   # per compiled graph: graph, status, reason (compile cache)

    @property
    def break_reasons(self) -> list[str]:
        """The first line of each graph break's reason, in order."""
        return [b["summary"] for b in self.graph_breaks]

    def __str__(self) -> str:
        lines = [f"plan '{self.plan}': {self.graph_count} graph(s), {len(self.graph_breaks)} graph break(s), "
                 f"{len(self.kernels)} kernel(s), {len(self.recompiles)} recompile(s)"]
        for b in self.graph_breaks:
            where = f" at {b['file']}:{b['line']}: {b['code']}" if b["file"] else ""
            lines.append(f"  break {b['number']}{where}\n      {b['summary']}")
        for k in self.kernels:
            lines.append(f"  kernel {k['kernel']} ({k['graph']}, {k['backend']}, {k['kind']}): {', '.join(k['ops'])}")
        if self.extern_calls:
            lines.append("  extern calls: " + ", ".join(f"{op} x{n}" for op, n in self.extern_calls.items()))
        for reason in self.recompiles:
            lines.append(f"  recompiled: {reason}")
        lines.extend(f"  would recompile: {text}" for text in self.expected_recompiles)
        for entry in self.cache:
            reason = f": {entry['reason']}" if entry["reason"] and entry["status"] != "hit" else ""
            lines.append(f"  cache {entry['status']} ({entry['graph']}){reason}")
        return "\n".join(lines)


def explain(model: Any, *inputs: Any, plan: Any = "default", overrides: dict | None = None,
            **keyword_inputs: Any) -> Explanation:
    """Compile ``model`` with ``plan``, call it once as ``model(*inputs, **keyword_inputs)`` and
    explain the compile. Keyword inputs go to the model, as Hugging Face models take them
    (``explain(model, input_ids=ids, attention_mask=mask)``); plan changes go in ``overrides``,
    with the plan's top-level keys as for :func:`compile_with_plan` (``overrides={"options":
    {"capture": {"dynamic": False}}}``). The call runs the model for real (it may update
    buffers, like any call)."""
    compiled = compile_with_plan(model, plan, report=True, **(overrides or {}))
    compiled(*inputs, **keyword_inputs)
    compilation = compilation_of(compiled)
    report = build_report(compilation)
    kernels = [{"graph": g["id"], **{k: v for k, v in kernel.items() if k != "source"}}
               for g in report["graphs"] for kernel in g["kernels"]]
    extern: dict[str, int] = {}
    for graph in report["graphs"]:
        for op, count in graph["extern_calls"].items():
            extern[op] = extern.get(op, 0) + count
    return Explanation(plan=compilation.plan.name, graph_count=report["summary"]["graphs"],
                       graph_breaks=report["graph_breaks"], kernels=kernels, extern_calls=dict(sorted(extern.items())),
                       recompiles=list(compilation.recompiles), expected_recompiles=expected_recompiles(report),
                       report=report,
                       cache=[{"graph": g["id"], "status": g["compile_cache"].get("status", "off"),
                               "reason": g["compile_cache"].get("reason", "")} for g in report["graphs"]])


def expected_recompiles(report: dict) -> list[str]:
    """Input changes that would make capture recompile, read from the guards of each graph."""
    out = []
    for capture in report["captures"]:
        graph = capture["graph"]
        for item in capture["inputs"]:
            source = item["source"]
            if "shape" not in item or any(marker in source for marker in _STATE):
                continue
            if item.get("dynamic"):
                out.append(f"{graph}: {source} with another dtype, device or number of dimensions "
                           f"(its sizes {item['shape']} are dynamic)")
            else:
                out.append(f"{graph}: {source} with a shape other than {item['shape']} or a dtype other "
                           f"than {item['dtype']} (static shapes)")
        for guard in capture["guards"]:
            if guard["kind"] in ("CONSTANT_MATCH", "EQUALS_MATCH") and guard["source"].startswith("L["):
                out.append(f"{graph}: {guard['source']} with another value (a Python constant in the graph)")
    if report["graphs"] and not report["captures"]:
        out.append("any input with another shape, dtype or device than this call's (the capture "
                   "frontend records no guards)")
    return out


__all__ = ["Explanation", "explain", "expected_recompiles"]
